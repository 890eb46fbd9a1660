"""The offline preference losses (module/preference_loss=dpo|cdpo|ipo|robust|simpo): each against a hand-computed
case and against TRL 1.12's formula of the same name, transcribed and run in fp64 (TRL's own code runs in
tests/modules/test_dpo.py when TRL is installed)."""

import math

import pytest
import torch
import torch.nn.functional as F

from lrlhf.functional import DPOLoss, IPOLoss, RobustDPOLoss, SimPOLoss, dpo_loss

# one pair: summed log-probs of the chosen (2 tokens) and the rejected (3 tokens) completion
PC, PR = math.log(0.25), math.log(0.075)  # policy
RC, RR = 2 * math.log(0.25), 3 * math.log(0.25)  # reference: 1/4 per token
NC, NR = 2, 3


def _one(loss, beta):
    t = lambda x: torch.tensor([x], dtype=torch.float64)  # noqa: E731
    value, stats = loss(t(PC), t(PR), t(RC), t(RR), t(NC), t(NR), beta)
    return value.item(), stats


def softplus(x):  # -log sigmoid(-x)
    return math.log1p(math.exp(x))


def test_dpo_and_cdpo_by_hand():
    z = 0.1 * math.log(4 / 4.8)  # beta (log-ratio chosen - log-ratio rejected): log 4 vs log 4.8
    value, stats = _one(DPOLoss(), 0.1)
    assert value == pytest.approx(softplus(-z), abs=1e-12)
    assert stats.chosen_rewards.item() == pytest.approx(0.1 * math.log(4), abs=1e-12)
    assert stats.accuracy.item() == 0.0
    assert _one(DPOLoss(0.2), 0.1)[0] == pytest.approx(0.8 * softplus(-z) + 0.2 * softplus(z), abs=1e-12)


def test_ipo_compares_per_token_log_ratios_with_half_over_beta():
    margin = math.log(4) / NC - math.log(4.8) / NR  # per token: a sum-based IPO gives log(4 / 4.8) instead
    assert _one(IPOLoss(), 0.1)[0] == pytest.approx((margin - 5.0) ** 2, abs=1e-12)
    assert _one(IPOLoss(), 0.5)[0] == pytest.approx((margin - 1.0) ** 2, abs=1e-12)


def test_robust_dpo_is_unbiased_under_flips():
    z, s = 0.1 * math.log(4 / 4.8), 0.1
    expected = ((1 - s) * softplus(-z) - s * softplus(z)) / (1 - 2 * s)
    assert _one(RobustDPOLoss(s), 0.1)[0] == pytest.approx(expected, abs=1e-12)
    # unbiased: its expectation under a flip rate s is the clean DPO loss
    flipped = ((1 - s) * softplus(z) - s * softplus(-z)) / (1 - 2 * s)
    assert (1 - s) * expected + s * flipped == pytest.approx(softplus(-z), abs=1e-12)


def test_simpo_is_reference_free_on_mean_token_log_probs():
    d = PC / NC - PR / NR
    expected = softplus(-(2.0 * d - 0.5))
    assert _one(SimPOLoss(gamma=0.5), 2.0)[0] == pytest.approx(expected, abs=1e-12)
    t = lambda x: torch.tensor([x], dtype=torch.float64)  # noqa: E731
    again, _ = SimPOLoss(gamma=0.5)(t(PC), t(PR), None, None, t(NC), t(NR), 2.0)
    assert again.item() == pytest.approx(expected, abs=1e-12) and not SimPOLoss.uses_reference
    smoothed = 0.9 * softplus(-(2.0 * d - 0.5)) + 0.1 * softplus(2.0 * d - 0.5)
    assert _one(SimPOLoss(gamma=0.5, label_smoothing=0.1), 2.0)[0] == pytest.approx(smoothed, abs=1e-12)


# ------------------------------------------------------------------ TRL 1.12's formulas, transcribed
def _trl_dpo(loss_type, pc, pr, rc, rr, nc, nr, beta, label_smoothing=0.0):
    """TRL 1.12 ``DPOTrainer._compute_loss`` (trl/trainer/dpo_trainer.py, f_divergence reverse_kl) from summed
    completion log-probs; IPO divides by the completion token counts."""
    delta = (pc - rc) - (pr - rr)
    if loss_type == "sigmoid":
        return (-F.logsigmoid(beta * delta)).mean()
    if loss_type == "ipo":
        ipo_delta = (pc - rc) / nc.clamp(min=1.0) - (pr - rr) / nr.clamp(min=1.0)
        return ((ipo_delta - 1 / (2 * beta)) ** 2).mean()
    if loss_type == "robust":
        clean = -(1 - label_smoothing) * F.logsigmoid(beta * delta)
        flipped = -label_smoothing * F.logsigmoid(-beta * delta)
        return ((clean - flipped) / (1 - 2 * label_smoothing)).mean()
    raise ValueError(loss_type)


def _trl_simpo(avg_c, avg_r, beta, gamma, label_smoothing):
    """TRL 1.12 ``CPOTrainer.cpo_loss`` (trl/experimental/cpo, ``loss_type="simpo"``, alpha 0) on average log-probs."""
    logits = (avg_c - avg_r) - gamma / beta
    losses = -F.logsigmoid(beta * logits) * (1 - label_smoothing) - F.logsigmoid(-beta * logits) * label_smoothing
    return losses.mean()


@pytest.mark.parametrize("b", [1, 2, 9])
def test_every_loss_is_trls_of_the_same_name_in_fp64(b):
    g = torch.Generator().manual_seed(b)
    pc, pr, rc, rr = (-torch.rand(b, generator=g, dtype=torch.float64) * 20 for _ in range(4))
    nc, nr = (torch.randint(1, 30, (b,), generator=g).double() for _ in range(2))
    for beta in (0.05, 0.1, 0.7):
        cases = [(DPOLoss(), _trl_dpo("sigmoid", pc, pr, rc, rr, nc, nr, beta)),
                 (IPOLoss(), _trl_dpo("ipo", pc, pr, rc, rr, nc, nr, beta)),
                 (RobustDPOLoss(0.2), _trl_dpo("robust", pc, pr, rc, rr, nc, nr, beta, 0.2)),
                 (SimPOLoss(gamma=0.7, label_smoothing=0.1), _trl_simpo(pc / nc, pr / nr, beta, 0.7, 0.1))]
        for loss, theirs in cases:
            ours, _ = loss(pc, pr, rc, rr, nc, nr, beta)
            assert abs(ours.item() - theirs.item()) < 1e-12, (type(loss).__name__, beta)
    assert dpo_loss(pc, pr, rc, rr, 0.1)[0].item() == DPOLoss()(pc, pr, rc, rr, None, None, 0.1)[0].item()


def test_gradients_reach_the_policy_only():
    pc = torch.tensor([-3.0, -1.0], dtype=torch.float64, requires_grad=True)
    rc = torch.tensor([-2.0, -2.0], dtype=torch.float64, requires_grad=True)
    pr, rr, n = torch.tensor([-2.0, -4.0], dtype=torch.float64), torch.zeros(2, dtype=torch.float64), torch.ones(2)
    for loss in (DPOLoss(), IPOLoss(), RobustDPOLoss(0.1)):
        pc.grad = rc.grad = None
        loss(pc, pr, rc, rr, n, n, 0.1)[0].backward()
        assert pc.grad is not None and rc.grad is None, type(loss).__name__


@pytest.mark.parametrize(("build", "message"), [
    (lambda: DPOLoss(label_smoothing=0.5), r"module.preference_loss.label_smoothing must be in \[0, 0.5\)"),
    (lambda: RobustDPOLoss(label_smoothing=-0.1), r"module.preference_loss.label_smoothing must be in \[0, 0.5\)"),
    (lambda: SimPOLoss(gamma=-1.0), "module.preference_loss.gamma must be >= 0"),
])
def test_bad_settings_name_the_key(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_a_per_token_loss_without_lengths_says_so():
    one = torch.zeros(1)
    with pytest.raises(ValueError, match="token counts"):
        IPOLoss()(one, one, one, one, None, None, 0.1)
    with pytest.raises(ValueError, match="module.config.beta must be > 0"):
        DPOLoss()(one, one, one, one, None, None, 0.0)
