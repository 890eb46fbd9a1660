"""Where the KL goes (module/kl_penalty=in_reward|in_loss) and its estimator's gradient as a loss (#33): each
estimator's value and gradient against a hand-computed case, and k3+'s straight-through form (k3's value, the
reverse KL's gradient; Tang & Munos 2025)."""

import math

import pytest
import torch

from lrlhf.functional import KLInLoss, KLInReward, kl_k3
from lrlhf.functional.kl import straight_through


def _grad(penalty, logp: float, ref: float) -> tuple[float, float]:
    x = torch.tensor([[logp]], dtype=torch.float64, requires_grad=True)
    value = penalty.per_token(x, torch.tensor([[ref]], dtype=torch.float64))
    value.sum().backward()
    return value.item(), x.grad.item()


@pytest.mark.parametrize(("logp", "ref"), [(-1.0, -2.5), (-3.0, -0.5), (-0.7, -0.7)])
def test_each_estimator_as_a_loss_by_hand(logp, ref):
    d = logp - ref  # log pi - log ref
    assert _grad(KLInLoss("k1"), logp, ref) == pytest.approx((d, 1.0), abs=1e-12)  # E[grad log pi] = 0: no pull
    assert _grad(KLInLoss("k2"), logp, ref) == pytest.approx((0.5 * d * d, d), abs=1e-12)
    k3 = math.exp(-d) - 1 + d
    assert _grad(KLInLoss("k3"), logp, ref) == pytest.approx((k3, 1 - math.exp(-d)), abs=1e-12)  # forward KL's
    assert _grad(KLInLoss("k3+"), logp, ref) == pytest.approx((k3, d), abs=1e-12)  # k3's value, k2's gradient


def test_k2s_gradient_is_the_reverse_kls_gradient_on_policy():
    """On tokens drawn from pi, E[(log pi - log ref) grad log pi] = grad KL(pi || ref): checked exactly on a
    softmax over 5 tokens (the expectation as a sum weighted by pi, the probabilities held fixed as sampling does)."""
    torch.manual_seed(0)
    theta = torch.randn(5, dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.randn(5, dtype=torch.float64), -1)
    logp = torch.log_softmax(theta, -1)
    exact = torch.autograd.grad((logp.exp() * (logp - ref)).sum(), theta, retain_graph=True)[0]
    for estimator, right in (("k3+", True), ("k2", True), ("k3", False), ("k1", False)):
        per_token = KLInLoss(estimator).per_token(logp.unsqueeze(0), ref.unsqueeze(0))[0]
        expected = torch.autograd.grad((logp.exp().detach() * per_token).sum(), theta, retain_graph=True)[0]
        assert torch.allclose(expected, exact, atol=1e-12) is right, estimator


def test_straight_through_keeps_the_value():
    logp, ref = torch.tensor([-1.0, -2.0], dtype=torch.float64), torch.tensor([-1.5, -0.2], dtype=torch.float64)
    assert torch.equal(straight_through(kl_k3(logp, ref), logp, ref), kl_k3(logp, ref))


def test_placement_flags_and_what_is_measured():
    assert not KLInReward().in_loss and KLInReward().measure == "k1"
    assert KLInLoss().in_loss and KLInLoss().estimator == "k3+" and KLInLoss().measure == "k3"
    with pytest.raises(NotImplementedError, match="puts the KL in the reward"):
        KLInReward().per_token(torch.zeros(1, 1), torch.zeros(1, 1))


@pytest.mark.parametrize(("build", "message"), [
    (lambda: KLInReward("k3+"), "module.kl_penalty.estimator must be one of"),
    (lambda: KLInLoss("k9"), "module.kl_penalty.estimator must be one of"),
])
def test_bad_estimators_name_the_key(build, message):
    with pytest.raises(ValueError, match=message):
        build()
