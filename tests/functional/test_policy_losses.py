"""PPO's policy objectives and loss aggregations (module/policy_loss=ppo_clip|clip_higher|dual_clip|gspo): PPO's
clip bit for bit as before, each objective against a hand-computed case, TRL 1.12's GRPO loss (transcribed, fp64)
for the clip-higher, GSPO and aggregation cases it has."""

import math

import pytest
import torch
from oracles import require_oracle

from lrlhf.functional import (
    GSPO,
    ClipHigher,
    ClipPPO,
    DualClip,
    SequenceMean,
    SequenceSumNorm,
    TokenMean,
)


def _random(b=5, t=7, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=dtype) * 3
    new = old + torch.randn(b, t, generator=g, dtype=dtype) * 0.3
    adv = torch.randn(b, t, generator=g, dtype=dtype)
    mask = torch.rand(b, t, generator=g) > 0.3
    mask[0] = False  # an empty row
    return new, old, adv, mask


def _one(loss, ratio, advantage):
    logp = torch.tensor([[math.log(ratio)]], dtype=torch.float64)
    value, stats = loss(logp, torch.zeros(1, 1, dtype=torch.float64), torch.tensor([[advantage]],
                        dtype=torch.float64), torch.ones(1, 1, dtype=torch.bool))
    return value.item(), stats.clipfrac.item()


def test_clip_higher_lets_a_good_token_grow_past_plain_clip():
    assert _one(ClipPPO(0.2), 1.25, 1.0) == pytest.approx((-1.2, 1.0))  # PPO clips at 1.2
    assert _one(ClipHigher(0.2, 0.28), 1.25, 1.0) == pytest.approx((-1.25, 0.0))  # under 1.28: not clipped
    assert _one(ClipHigher(0.2, 0.28), 1.5, 1.0) == pytest.approx((-1.28, 1.0))
    assert _one(ClipHigher(0.2, 0.28), 0.7, -1.0) == pytest.approx((0.8, 1.0))  # the low side stays 1 - 0.2


def test_dual_clip_caps_a_bad_action_with_a_large_ratio():
    assert _one(ClipPPO(0.2), 5.0, -1.0) == pytest.approx((5.0, 0.0))  # -A r grows without bound
    assert _one(DualClip(0.2, 3.0), 5.0, -1.0) == pytest.approx((3.0, 1.0))  # capped at -c A
    assert _one(DualClip(0.2, 3.0), 2.0, -1.0) == pytest.approx((2.0, 0.0))  # under the cap: PPO's
    assert _one(DualClip(0.2, 3.0), 5.0, 1.0) == pytest.approx((-1.2, 1.0))  # a positive advantage: PPO's clip


def test_gspo_uses_one_length_normalised_ratio_per_sequence():
    logp = torch.tensor([[0.001, 0.003, 9.0]], dtype=torch.float64, requires_grad=True)  # the third is masked
    mask = torch.tensor([[True, True, False]])
    adv = torch.ones(1, 3, dtype=torch.float64)
    loss, stats = GSPO(3e-4, 4e-4)(logp, torch.zeros(1, 3, dtype=torch.float64), adv, mask)
    assert stats.ratio_mean.item() == pytest.approx(math.exp(0.002), abs=1e-12)  # exp(mean of 0.001, 0.003)
    assert loss.item() == pytest.approx(-(1 + 4e-4), abs=1e-12)  # clipped at 1 + eps_high
    small = torch.tensor([[1e-4, -1e-4]], dtype=torch.float64, requires_grad=True)
    loss, _ = GSPO(3e-4, 4e-4)(small, torch.zeros(1, 2, dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64),
                               torch.ones(1, 2, dtype=torch.bool))
    loss.backward()  # unclipped: d(-s)/d logp_t = -s / T for every token of the sequence
    assert torch.allclose(small.grad, torch.full((1, 2), -0.5, dtype=torch.float64), atol=1e-12)


def test_aggregations_by_hand():
    per_token = torch.tensor([[1.0, 3.0, 0.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert TokenMean()(per_token, mask).item() == pytest.approx(6 / 3)  # every token weighs the same
    assert SequenceMean()(per_token, mask).item() == pytest.approx((2 + 2) / 2)  # every sequence weighs the same
    assert SequenceSumNorm(tokens=4)(per_token, mask).item() == pytest.approx(6 / (2 * 4))


def test_token_mean_does_not_depend_on_how_the_batch_is_cut():
    """The token mean of a batch is the token-weighted mean of its parts' token means, however it is cut (DAPO):
    each part weighted by its share of the tokens. The per-sequence mean of GRPO is not (a part's weight is its share
    of the sequences)."""
    new, old, adv, mask = _random(b=6, t=9, seed=4)
    whole, _ = ClipPPO(0.2)(new, old, adv, mask)
    for cut in (1, 2, 4):
        parts = [(slice(0, cut), mask[:cut].sum()), (slice(cut, 6), mask[cut:].sum())]
        combined = sum(ClipPPO(0.2)(new[s], old[s], adv[s], mask[s])[0] * n for s, n in parts) / mask.sum()
        assert combined.item() == pytest.approx(whole.item(), abs=1e-12)


# ------------------------------------------------------------------ TRL 1.12's GRPO loss, transcribed
def _trl_grpo_loss(new, old, adv, mask, eps_low, eps_high, level, loss_type, max_completion_length=None):
    """TRL 1.12 ``GRPOTrainer._compute_loss`` (trl/trainer/grpo_trainer.py; beta 0, no delta, no off-policy mask)."""
    log_ratio = new - old
    if level == "token":
        log_w = log_ratio
    else:
        log_w = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_w)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    per_token_loss = -torch.min(coef_1 * adv, coef_2 * adv)
    mask = mask.to(per_token_loss.dtype)
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type in ("bnpo", "dapo"):
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length)
    raise ValueError(loss_type)


def test_objectives_and_aggregations_are_trls_grpo_loss_in_fp64():
    for seed in range(4):
        new, old, adv, mask = _random(seed=seed)
        seq_adv = adv[:, :1].expand_as(adv)  # GRPO / RLOO: one advantage per sequence
        cases = [
            (ClipHigher(0.2, 0.28, TokenMean()), adv, ("token", "dapo")),
            (ClipHigher(0.2, 0.28, SequenceMean()), adv, ("token", "grpo")),
            (ClipPPO(0.2, SequenceSumNorm(tokens=9)), adv, ("token", "dr_grpo")),
            (GSPO(3e-4, 4e-4), seq_adv, ("sequence", "grpo")),
        ]
        for loss, a, (level, loss_type) in cases:
            eps = (loss.eps_low, loss.eps_high) if hasattr(loss, "eps_low") else (loss.clip_eps, loss.clip_eps)
            theirs = _trl_grpo_loss(new, old, a, mask, *eps, level, loss_type, max_completion_length=9)
            ours, _ = loss(new, old, a, mask)
            assert abs(ours.item() - theirs.item()) < 1e-12, (type(loss).__name__, loss_type)


@pytest.mark.parametrize(("build", "message"), [
    (lambda: ClipPPO(clip_eps=1.5), r"module.policy_loss.clip_eps must be in \(0, 1\)"),
    (lambda: ClipHigher(eps_high=0.0), r"module.policy_loss.eps_high must be in \(0, 1\)"),
    (lambda: DualClip(clip_c=1.0), "module.policy_loss.clip_c must be > 1"),
    (lambda: SequenceSumNorm(tokens=0), "module.policy_loss.aggregation.tokens must be >= 1"),
])
def test_bad_settings_name_the_key(build, message):
    with pytest.raises(ValueError, match=message):
        build()


# ------------------------------------------------------------------ TRL 1.12's own GRPOTrainer._compute_loss
def _trl_compute_loss(new, old, ref, adv, mask, *, loss_type, eps_low, eps_high, level="token", beta=0.0,
                      is_ratio=None, max_completion_length=None):
    """TRL's ``GRPOTrainer._compute_loss`` itself, run on a stand-in trainer whose forward returns ``new`` (no
    entropy mask, no off-policy sequence mask, no accumulation: evaluation mode, one process)."""
    from collections import defaultdict
    from types import SimpleNamespace

    grpo = require_oracle("trl.trainer.grpo_trainer")
    b, t = new.shape
    stand_in = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (new, torch.zeros_like(new), None),
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level=level, beta=beta,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None), loss_type=loss_type, epsilon_low=eps_low,
        epsilon_high=eps_high, use_vllm=is_ratio is not None, vllm_importance_sampling_correction=True,
        model=SimpleNamespace(training=False), current_gradient_accumulation_steps=1,
        max_completion_length=max_completion_length, _entropy_bonus_enabled=False, aux_loss_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
        accelerator=SimpleNamespace(num_processes=1, gather=lambda x: x, reduce=lambda x, reduction: x),
    )
    maskf = mask.to(new.dtype)
    inputs = {"prompt_ids": torch.zeros(b, 0, dtype=torch.long), "prompt_mask": torch.zeros(b, 0, dtype=torch.long),
              "completion_ids": torch.zeros(b, t, dtype=torch.long), "completion_mask": maskf, "advantages": adv,
              "old_per_token_logps": old, "ref_per_token_logps": ref, "num_items_in_batch": maskf.sum()}
    if is_ratio is not None:
        inputs["importance_sampling_ratio"] = is_ratio
    return grpo.GRPOTrainer._compute_loss(stand_in, None, inputs)


def _trl_is_ratio(old, sampling, mask, cap, mode):
    """TRL 1.12's importance-sampling ratio of ``_generate_and_score_completions`` (clip_min None), transcribed."""
    diff = (old - sampling) * mask
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    return ratio.clamp(max=cap) if mode.endswith("truncate") else ratio.masked_fill(ratio > cap, 0.0)


def test_objectives_kl_in_the_loss_and_the_correction_are_trls_own_grpo_loss():
    from lrlhf.functional import KLInLoss
    from lrlhf.functional.off_policy import MaskedIS, TruncatedIS

    for seed in range(3):
        new, old, seq_adv, mask = _random(seed=seed)
        adv = seq_adv[:, 0]  # TRL: one advantage per sequence
        g = torch.Generator().manual_seed(10 + seed)
        ref = old + torch.randn(old.shape, generator=g, dtype=old.dtype) * 0.5
        sampling = old + torch.randn(old.shape, generator=g, dtype=old.dtype) * 0.4
        wide = adv.unsqueeze(-1).expand_as(new)
        cases = [
            ("dapo", ClipHigher(0.2, 0.28, TokenMean()), "token", 0.0, None),
            ("grpo", ClipHigher(0.2, 0.28, SequenceMean()), "token", 0.0, None),
            ("dr_grpo", ClipPPO(0.2, SequenceSumNorm(tokens=7)), "token", 0.0, None),
            ("grpo", GSPO(3e-4, 4e-4), "sequence", 0.0, None),
            ("dapo", ClipPPO(0.2, TokenMean()), "token", 0.04, None),  # GRPO's KL in the loss: k3 x beta
            ("dapo", ClipHigher(0.2, 0.28, TokenMean()), "token", 0.0, (TruncatedIS(cap=1.5), "token_truncate")),
            ("grpo", ClipPPO(0.2, SequenceMean()), "token", 0.1, (MaskedIS(cap=1.5), "token_mask")),
            ("dapo", ClipPPO(0.2, TokenMean()), "token", 0.0, (TruncatedIS(cap=3.0, level="sequence"),
                                                                 "sequence_truncate")),
        ]
        for loss_type, ours_loss, level, beta, correction in cases:
            eps = (ours_loss.eps_low, ours_loss.eps_high) if hasattr(ours_loss, "eps_low") else \
                (ours_loss.clip_eps,) * 2
            x = new.clone().requires_grad_(True)
            terms = {}
            is_ratio = None
            if correction is not None:
                terms["weights"] = correction[0](old, sampling, mask)
                is_ratio = _trl_is_ratio(old, sampling, mask.to(old.dtype), correction[0].cap, correction[1])
                assert torch.allclose(terms["weights"], (is_ratio * mask).expand_as(old), atol=1e-12)
            if beta:
                terms["extra"] = beta * KLInLoss("k3").per_token(x, ref)
            ours, _ = ours_loss(x, old, wide, mask, **terms)
            y = new.clone().requires_grad_(True)
            theirs = _trl_compute_loss(y, old, ref, adv, mask, loss_type=loss_type, eps_low=eps[0], eps_high=eps[1],
                                       level=level, beta=beta, is_ratio=is_ratio, max_completion_length=7)
            assert abs(ours.item() - theirs.item()) < 1e-6, (seed, loss_type, type(ours_loss).__name__, beta)
            ours.backward()
            theirs.backward()
            assert torch.allclose(x.grad, y.grad, atol=1e-6), (seed, loss_type, type(ours_loss).__name__, beta)
