import math
import threading

import pytest
import torch

from lrlhf.functional import masked_mean, masked_var, masked_whiten, response_masks

X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
M = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)


def test_masked_mean_global_and_per_row():
    # valid values 1, 2, 4 -> 7/3; rows: (1+2)/2 = 1.5 and 4/1 = 4
    assert masked_mean(X, M).item() == pytest.approx(7 / 3, abs=1e-6)
    torch.testing.assert_close(masked_mean(X, M, dim=1), torch.tensor([1.5, 4.0]), atol=1e-6, rtol=0)


def test_masked_mean_accepts_float_mask_and_ignores_padding_values():
    padded = X.clone()
    padded[~M] = 1e6
    assert masked_mean(padded, M.float()).item() == pytest.approx(7 / 3, abs=1e-6)


def test_masked_mean_empty_slice_is_zero_not_nan():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    torch.testing.assert_close(masked_mean(X, mask, dim=1), torch.tensor([1.5, 0.0]), atol=0, rtol=0)
    empty = torch.zeros_like(M)
    assert masked_mean(X, empty).item() == 0.0
    x = X.clone().requires_grad_()
    masked_mean(x, empty).backward()
    assert torch.equal(x.grad, torch.zeros_like(X))


def test_masked_var_by_hand():
    # values 1, 2, 4; mean 7/3; squared deviations 16/9 + 1/9 + 25/9 = 42/9
    assert masked_var(X, M).item() == pytest.approx(42 / 9 / 2, abs=1e-6)
    assert masked_var(X, M, unbiased=False).item() == pytest.approx(42 / 9 / 3, abs=1e-6)


def test_masked_var_all_invalid_or_single_raises():
    with pytest.raises(ValueError, match="no valid position"):
        masked_var(X, torch.zeros_like(M))
    single = torch.tensor([[0, 1, 0], [0, 0, 0]], dtype=torch.bool)
    with pytest.raises(ValueError, match="at least two"):
        masked_var(X, single)
    assert masked_var(X, single, unbiased=False).item() == 0.0


def test_masked_whiten_by_hand_and_padding_stays_zero():
    padded = X.clone()
    padded[~M] = 1e6  # must not leak into the statistics
    out = masked_whiten(padded, M, eps=0.0)
    expected = torch.zeros_like(X)
    expected[M] = (torch.tensor([1.0, 2.0, 4.0]) - 7 / 3) / math.sqrt(7 / 3)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
    assert masked_mean(out, M).abs().item() < 1e-6
    assert masked_var(out, M).item() == pytest.approx(1.0, abs=1e-6)


def test_masked_whiten_without_shift_adds_mean_back():
    out = masked_whiten(X, M, shift_mean=False, eps=0.0)
    expected = torch.zeros_like(X)
    expected[M] = (torch.tensor([1.0, 2.0, 4.0]) - 7 / 3) / math.sqrt(7 / 3) + 7 / 3
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


def test_masked_whiten_all_invalid_raises():
    with pytest.raises(ValueError, match="no valid position"):
        masked_whiten(X, torch.zeros_like(M))


def _run_two_ranks(shards):
    """Run masked_whiten on two shards in two threads with an in-memory sum all-reduce (collective semantics)."""
    barrier = threading.Barrier(2)
    slots = [None, None]
    results = [None, None]

    def all_reduce(rank):
        def reduce(t):
            slots[rank] = t.clone()
            barrier.wait()
            total = slots[0] + slots[1]
            barrier.wait()
            return total

        return reduce

    def work(rank):
        x, m = shards[rank]
        results[rank] = masked_whiten(x, m, all_reduce=all_reduce(rank))

    threads = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_masked_whiten_global_statistics_equal_concatenated_batch():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 7, generator=g) * 3 + 1
    lengths = torch.tensor([7, 1, 4, 0, 6, 2])
    mask = torch.arange(7)[None, :] < lengths[:, None]
    whole = masked_whiten(x, mask)
    local = _run_two_ranks([(x[:3], mask[:3]), (x[3:], mask[3:])])
    torch.testing.assert_close(torch.cat(local), whole, atol=1e-6, rtol=0)
    # and per-rank statistics really differ: the switch matters
    assert not torch.allclose(masked_whiten(x[:3], mask[:3]), whole[:3], atol=1e-3)


# --- response masks: every masking case a correct PPO needs at this level --------------------------
EOS, PAD = 2, 0


def _masks(rows, eos=EOS, pad=PAD):
    return response_masks(torch.tensor(rows), eos_token_id=eos, pad_token_id=pad)


@pytest.mark.parametrize(
    "row, terminal, has_eos",
    [
        ([5, 6, EOS, PAD, PAD], 2, True),  # normal EOS, generate's padding after it
        ([5, 6, 7, 8, EOS], 4, True),  # EOS in the last slot
        ([5, 6, 7, 8, 9], 4, False),  # no EOS: truncated at max length, last token is terminal
        ([EOS, PAD, PAD, PAD, PAD], 0, True),  # empty response: the EOS is the only action
        ([5, PAD, 6, EOS, PAD], 3, True),  # the policy sampled the pad id: still an action
        ([5, EOS, 7, EOS, 8], 1, True),  # tokens after the first EOS are never actions
    ],
)
def test_response_masks_cases(row, terminal, has_eos):
    masks = _masks([row])
    expected_action = [t <= terminal for t in range(5)]
    assert masks.action_mask.tolist() == [expected_action]
    assert masks.done_mask.tolist() == [[t == terminal for t in range(5)]]
    assert masks.terminal_index.tolist() == [terminal]
    assert masks.has_eos.tolist() == [has_eos]
    assert masks.lengths.tolist() == [terminal + 1]
    assert masks.action_mask.dtype == torch.bool and masks.terminal_index.dtype == torch.long


def test_response_masks_batch_of_mixed_rows():
    masks = _masks([[5, 6, EOS, PAD], [5, 6, 7, 8], [EOS, PAD, PAD, PAD]])
    assert masks.terminal_index.tolist() == [2, 3, 0]
    assert masks.has_eos.tolist() == [True, False, True]
    assert masks.action_mask.sum(dim=1).tolist() == [3, 4, 1]


def test_response_masks_pad_equal_to_eos():
    masks = _masks([[5, EOS, EOS, EOS], [5, 6, 7, 8]], eos=EOS, pad=EOS)
    assert masks.terminal_index.tolist() == [1, 3]
    assert masks.has_eos.tolist() == [True, False]


def test_response_masks_several_stop_ids():
    masks = _masks([[5, 3, 6, EOS]], eos=[EOS, 3])
    assert masks.terminal_index.tolist() == [1]


def test_response_masks_no_generated_tokens():
    masks = response_masks(torch.zeros(2, 0, dtype=torch.long), eos_token_id=EOS, pad_token_id=PAD)
    assert masks.terminal_index.tolist() == [-1, -1]
    assert masks.lengths.tolist() == [0, 0]
    assert masks.action_mask.shape == (2, 0)


def test_response_masks_rejects_wrong_rank():
    with pytest.raises(ValueError, match=r"\(B, R\)"):
        response_masks(torch.tensor([5, 6, EOS]), eos_token_id=EOS)
