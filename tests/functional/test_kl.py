import math

import pytest
import torch

from lrlhf.functional import AdaptiveKLController, FixedKLController, kl_penalty


def test_estimators_by_hand():
    logp = torch.tensor([math.log(0.5)])
    ref = torch.tensor([math.log(0.25)])
    ln2 = math.log(2)
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(ln2, abs=1e-6)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * ln2**2, abs=1e-6)
    # k3: r = ref - logp = -ln 2 -> (e^r - 1) - r = 0.5 - 1 + ln 2
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(ln2 - 0.5, abs=1e-6)
    assert kl_penalty(ref, logp, "abs").item() == pytest.approx(ln2, abs=1e-6)


def test_unknown_estimator_names_the_choices():
    with pytest.raises(ValueError, match=r"'k4'.*\['abs', 'k1', 'k2', 'k3'\]"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k4")


def test_callable_estimator():
    out = kl_penalty(torch.tensor([1.0]), torch.tensor([0.25]), lambda p, r: (p - r) * 2)
    assert out.item() == 1.5


def _two_distributions(seed=0, vocab=7):
    g = torch.Generator().manual_seed(seed)
    logp = torch.log_softmax(torch.randn(vocab, generator=g, dtype=torch.float64), -1)
    logq = torch.log_softmax(torch.randn(vocab, generator=g, dtype=torch.float64), -1)
    return logp, logq


def test_estimators_expectation_under_the_policy():
    logp, logq = _two_distributions()
    p = logp.exp()
    true_kl = (p * (logp - logq)).sum()
    assert true_kl > 0
    # exact expectations over the vocabulary: k1 and k3 are unbiased, k2 and abs are >= 0
    assert (p * kl_penalty(logp, logq, "k1")).sum().item() == pytest.approx(true_kl.item(), abs=1e-12)
    assert (p * kl_penalty(logp, logq, "k3")).sum().item() == pytest.approx(true_kl.item(), abs=1e-12)
    assert (p * kl_penalty(logp, logq, "k2")).sum() > 0
    assert (kl_penalty(logp, logq, "k3") >= 0).all()


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3", "abs"])
def test_estimators_sample_mean_nonnegative_on_policy_samples(estimator):
    logp, logq = _two_distributions(seed=3)
    g = torch.Generator().manual_seed(0)
    actions = torch.multinomial(logp.exp(), 200_000, replacement=True, generator=g)
    values = kl_penalty(logp[actions], logq[actions], estimator)
    mean, stderr = values.mean(), values.std() / math.sqrt(values.numel())
    assert mean > 0
    if estimator in ("k1", "k3"):  # unbiased: within 5 standard errors of the exact KL
        true_kl = (logp.exp() * (logp - logq)).sum()
        assert abs(mean - true_kl) < 5 * stderr


def test_fixed_controller():
    ctl = FixedKLController(0.05)
    assert ctl.update(100.0, 256) == 0.05 and ctl.value == 0.05
    with pytest.raises(ValueError, match="module.kl_controller.kl_coef must be >= 0, got -1.0"):
        FixedKLController(-1.0)


def test_adaptive_controller_by_hand():
    ctl = AdaptiveKLController(kl_coef=0.1, target=6.0, horizon=10_000)
    # KL 9: error 9/6 - 1 = 0.5 clipped to 0.2 -> beta * (1 + 0.2 * 256 / 10000)
    assert ctl.update(9.0, 256) == pytest.approx(0.1 * 1.00512, abs=1e-12)
    # KL 5.4: error 5.4/6 - 1 = -0.1 -> beta * (1 - 0.1 * 256 / 10000)
    assert ctl.update(5.4, 256) == pytest.approx(0.1 * 1.00512 * 0.99744, abs=1e-12)
    # KL 0: error -1 clipped to -0.2
    assert ctl.update(0.0, 256) == pytest.approx(0.1 * 1.00512 * 0.99744 * 0.99488, abs=1e-12)
    assert ctl.stats() == {"target": 6.0, "error": -0.2}  # what the module logs as kl/target, kl/error


def test_adaptive_controller_resume_continues_the_sequence():
    kls = [3.0, 9.0, 7.5, 6.1, 0.4, 12.0]
    straight = AdaptiveKLController(0.2, target=6.0, horizon=1000)
    values = [straight.update(k, 64) for k in kls]
    first = AdaptiveKLController(0.2, target=6.0, horizon=1000)
    for k in kls[:3]:
        first.update(k, 64)
    resumed = AdaptiveKLController(1.0, target=6.0, horizon=1000)  # another starting beta, replaced by the state
    assert first.state_dict() == {"value": first.value}  # beta only: the settings are the config's
    resumed.load_state_dict(first.state_dict())
    assert [resumed.update(k, 64) for k in kls[3:]] == values[3:]


@pytest.mark.parametrize("kwargs", [dict(kl_coef=0.0), dict(target=0.0), dict(horizon=0.0), dict(clip=-1.0)])
def test_adaptive_controller_validates(kwargs):
    args = dict(kl_coef=0.1, target=6.0, horizon=100.0) | kwargs
    with pytest.raises(ValueError, match=f"module.kl_controller.{next(iter(kwargs))} must be > 0"):
        AdaptiveKLController(**args)
