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


def test_missing_eos_penalty_message_names_the_argument():
    with pytest.raises(ValueError, match="^shape_rewards: missing_eos_penalty needs has_eos$"):
        shape_rewards(torch.zeros(2), LOGP, REF, MASKS.action_mask, MASKS.terminal_index, 0.1, missing_eos_penalty=1.0)


def test_score_clip_bounds_both_sides():
    out = shape_rewards(torch.tensor([-7.0, 7.0]), LOGP, LOGP, MASKS.action_mask, MASKS.terminal_index, 0.1,
                        score_clip=2.5)
    assert out.scores.tolist() == [-2.5, 2.5]


def test_the_named_kl_estimator_is_used():
    from lrlhf.functional.kl import kl_penalty

    out = shape_rewards(torch.zeros(2), LOGP, REF, MASKS.action_mask, MASKS.terminal_index, 0.1, estimator="k3")
    # k3 = exp(ref - logp) - (ref - logp) - 1, by hand in fp64, on the valid actions only
    delta = (REF - LOGP).double()
    k3 = (delta.exp() - delta - 1.0) * MASKS.action_mask
    torch.testing.assert_close(out.kl.double(), k3, atol=1e-6, rtol=0)
    assert not torch.allclose(out.kl, torch.where(MASKS.action_mask, kl_penalty(LOGP, REF, "k1"), 0.0))


def test_a_one_action_response_gets_its_score_at_action_zero():
    ids = torch.tensor([[EOS, 0, 0], [5, EOS, 0], [5, 6, 7]])
    masks = response_masks(ids, eos_token_id=EOS, pad_token_id=0)
    assert masks.terminal_index.tolist() == [0, 1, 2]
    zeros = torch.zeros(3, 3)
    out = shape_rewards(torch.tensor([1.0, 2.0, 3.0]), zeros, zeros, masks.action_mask, masks.terminal_index, 0.1)
    assert out.rewards.tolist() == [[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 3.0]]


def test_no_overlong_handling_follows_the_lengths_device_and_is_float32():
    from lrlhf.functional.rewards import Overlong

    lengths, has_eos = torch.tensor([3, 8], device="meta"), torch.ones(2, dtype=torch.bool, device="meta")
    assert Overlong().penalty(lengths, has_eos, 8).device.type == "meta"
    assert Overlong().keep(lengths, has_eos).device.type == "meta"
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert Overlong().penalty(torch.tensor([3, 8]), torch.tensor([True, False]), 8).dtype == torch.float32
    finally:
        torch.set_default_dtype(default)


def test_soft_overlong_penalty_defaults_and_settings():
    from lrlhf.functional.rewards import SoftOverlongPenalty

    assert SoftOverlongPenalty().settings() == {"cache_tokens": 4, "penalty": 1.0}
    assert SoftOverlongPenalty(cache_tokens=2, penalty=0.5).settings() == {"cache_tokens": 2, "penalty": 0.5}


def test_soft_overlong_penalty_at_its_smallest_settings():
    from lrlhf.functional.rewards import SoftOverlongPenalty

    lengths, has_eos = torch.tensor([6, 7, 8]), torch.tensor([True, True, False])
    # a one-token ramp: the penalty falls on the budget's last token only
    assert SoftOverlongPenalty(cache_tokens=1, penalty=1.0).penalty(lengths, has_eos, 8).tolist() == [0.0, 0.0, 1.0]
    assert SoftOverlongPenalty(cache_tokens=4, penalty=0.0).penalty(lengths, has_eos, 8).tolist() == [0.0] * 3
    # a ramp as long as the budget starts at length 0
    assert SoftOverlongPenalty(cache_tokens=8).penalty(lengths, has_eos, 8).tolist() == [0.75, 0.875, 1.0]
    with pytest.raises(ValueError, match=r"module.overlong.penalty must be >= 0, got -1.0"):
        SoftOverlongPenalty(penalty=-1.0)


def test_soft_overlong_penalty_never_exceeds_its_size():
    from lrlhf.functional.rewards import SoftOverlongPenalty

    # lengths past the budget of 4 (12 and 16 tokens) still get the full penalty, no more
    lengths, has_eos = torch.tensor([12, 16]), torch.tensor([False, False])
    assert SoftOverlongPenalty(cache_tokens=4, penalty=0.5).penalty(lengths, has_eos, 4).tolist() == [0.5, 0.5]
