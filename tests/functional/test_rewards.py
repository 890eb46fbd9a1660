import pytest
import torch

from lrlhf.functional import response_masks, shape_rewards

EOS = 2
# row 0 stops with EOS at index 2; row 1 is truncated (terminal = last slot 3)
IDS = torch.tensor([[5, 6, EOS, 0], [5, 6, 7, 8]])
MASKS = response_masks(IDS, eos_token_id=EOS, pad_token_id=0)
LOGP = torch.tensor([[-1.0, -2.0, -0.5, 7.0], [-1.0, -1.0, -1.0, -1.0]])
REF = torch.tensor([[-1.5, -1.0, -0.5, -9.0], [-2.0, -1.0, -0.5, -1.0]])


def test_shape_rewards_by_hand():
    out = shape_rewards(
        torch.tensor([1.0, -2.0]), LOGP, REF, MASKS.action_mask, MASKS.terminal_index, kl_coef=0.1, estimator="k1"
    )
    # k1 = logp - ref on valid actions; row 0 slot 3 is padding (its garbage log-probs must not count)
    expected_kl = torch.tensor([[0.5, -1.0, 0.0, 0.0], [1.0, 0.0, -0.5, 0.0]])
    torch.testing.assert_close(out.kl, expected_kl, atol=1e-6, rtol=0)
    # rewards = -0.1 * kl, + score once at the terminal action (row 0: slot 2, row 1: slot 3)
    expected = torch.tensor([[-0.05, 0.1, 1.0, 0.0], [-0.1, 0.0, 0.05, -2.0]])
    torch.testing.assert_close(out.rewards, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.scores, torch.tensor([1.0, -2.0]))


def test_score_added_exactly_once_at_terminal():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 9, (8, 10), generator=g)
    ids[torch.arange(8), torch.randint(0, 10, (8,), generator=g)] = EOS
    ids[0] = 4  # one row without EOS
    masks = response_masks(ids, eos_token_id=EOS)
    logp, ref = torch.randn(8, 10, generator=g), torch.randn(8, 10, generator=g)
    scores = torch.randn(8, generator=g) * 5
    out = shape_rewards(scores, logp, ref, masks.action_mask, masks.terminal_index, kl_coef=0.3, estimator="k3")
    score_part = out.rewards + 0.3 * out.kl
    torch.testing.assert_close(score_part.sum(dim=1), scores, atol=1e-5, rtol=0)
    nonzero = score_part.abs() > 1e-6
    assert torch.equal(nonzero, masks.done_mask & (scores.abs() > 1e-6)[:, None])
    assert (out.rewards[~masks.action_mask] == 0).all()


def test_missing_eos_penalty_then_clip():
    scores = torch.tensor([3.0, 3.0])
    out = shape_rewards(
        scores,
        LOGP,
        LOGP,  # zero KL
        MASKS.action_mask,
        MASKS.terminal_index,
        kl_coef=0.1,
        has_eos=MASKS.has_eos,
        missing_eos_penalty=1.0,
        score_clip=2.5,
    )
    # row 0 has an EOS: 3 clipped to 2.5; row 1 is truncated: 3 - 1 = 2 (penalty first, then the clip)
    torch.testing.assert_close(out.scores, torch.tensor([2.5, 2.0]))
    torch.testing.assert_close(out.rewards, torch.tensor([[0.0, 0.0, 2.5, 0.0], [0.0, 0.0, 0.0, 2.0]]))


def test_missing_eos_penalty_needs_has_eos():
    with pytest.raises(ValueError, match="has_eos"):
        shape_rewards(torch.zeros(2), LOGP, REF, MASKS.action_mask, MASKS.terminal_index, 0.1, missing_eos_penalty=1.0)


def test_row_without_actions_gets_no_score():
    masks = response_masks(torch.zeros(2, 0, dtype=torch.long), eos_token_id=EOS)
    out = shape_rewards(
        torch.tensor([1.0, 2.0]), torch.zeros(2, 0), torch.zeros(2, 0), *masks[:1], masks.terminal_index, 0.1
    )
    assert out.rewards.shape == (2, 0)


def test_kl_coef_as_tensor():
    out = shape_rewards(torch.zeros(2), LOGP, REF, MASKS.action_mask, MASKS.terminal_index, kl_coef=torch.tensor(0.5))
    torch.testing.assert_close(out.rewards, -0.5 * out.kl)


# ------------------------------------------------------------------ overlong responses (module/overlong, #33)
def test_soft_overlong_penalty_is_dapos_ramp_by_hand():
    from lrlhf.functional.rewards import SoftOverlongPenalty

    lengths = torch.tensor([2, 4, 5, 7, 8])
    has_eos = torch.tensor([True, True, True, True, False])
    penalty = SoftOverlongPenalty(cache_tokens=4, penalty=0.5).penalty(lengths, has_eos, max_new_tokens=8)
    assert penalty.tolist() == pytest.approx([0.0, 0.0, 0.125, 0.375, 0.5])  # 0 up to 8 - 4, then linear to 0.5
    with pytest.raises(ValueError, match="module.overlong.cache_tokens=9 is longer than the budget"):
        SoftOverlongPenalty(cache_tokens=9).penalty(lengths, has_eos, max_new_tokens=8)
    with pytest.raises(ValueError, match="module.overlong.cache_tokens must be >= 1"):
        SoftOverlongPenalty(cache_tokens=0)


def test_overlong_mask_keeps_finished_and_empty_rows():
    from lrlhf.functional.rewards import Overlong, OverlongMask

    lengths, has_eos = torch.tensor([3, 8, 0]), torch.tensor([True, False, False])
    assert OverlongMask().keep(lengths, has_eos).tolist() == [True, False, True]
    assert Overlong().keep(lengths, has_eos).tolist() == [True, True, True]
    assert Overlong().penalty(lengths, has_eos, 8).tolist() == [0.0, 0.0, 0.0]
