"""The off-policy correction between the sampler and the trainer (module/off_policy=truncated_is|masked_is, #33):
the weights and their statistics against a hand-computed case, per token and per sequence."""

import math

import pytest
import torch

from lrlhf.functional.off_policy import MaskedIS, TruncatedIS


def _case():
    trainer = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -9.0]], dtype=torch.float64)
    delta = torch.tensor([[0.0, 1.0, -0.5], [0.3, 2.0, 5.0]], dtype=torch.float64)  # log pi_old - log mu
    mask = torch.tensor([[True, True, True], [True, True, False]])
    return trainer, trainer - delta, mask, delta


def test_truncated_is_by_hand():
    trainer, sampler, mask, delta = _case()
    w = TruncatedIS(cap=2.0)(trainer, sampler, mask)
    expected = torch.tensor([[1.0, 2.0, math.exp(-0.5)], [math.exp(0.3), 2.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(w, expected, atol=1e-12)  # e^1 and e^2 truncated at 2; the masked token weighs 0
    stats = TruncatedIS(cap=2.0).stats(trainer, sampler, mask)
    assert stats["offpolicy/truncated_frac"] == pytest.approx(2 / 5)
    assert stats["offpolicy/ratio_max"] == pytest.approx(math.exp(2.0))  # the masked e^5 is not seen
    assert stats["offpolicy/log_ratio_abs_mean"] == pytest.approx((0 + 1 + 0.5 + 0.3 + 2) / 5)
    assert stats["offpolicy/weight_mean"] == pytest.approx(expected[mask].mean().item())


def test_masked_is_by_hand():
    trainer, sampler, mask, _ = _case()
    w = MaskedIS(cap=2.0)(trainer, sampler, mask)
    expected = torch.tensor([[1.0, 0.0, math.exp(-0.5)], [math.exp(0.3), 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(w, expected, atol=1e-12)  # above the cap: 0, not capped
    assert MaskedIS(cap=2.0).stats(trainer, sampler, mask)["offpolicy/masked_frac"] == pytest.approx(2 / 5)


def test_sequence_level_uses_one_weight_per_sequence():
    trainer, sampler, mask, _ = _case()
    w = TruncatedIS(cap=100.0, level="sequence")(trainer, sampler, mask)
    row0, row1 = math.exp(0 + 1 - 0.5), math.exp(0.3 + 2)  # the product of each row's valid tokens' ratios
    assert torch.allclose(w, torch.tensor([[row0] * 3, [row1, row1, 0.0]], dtype=torch.float64), atol=1e-12)
    assert torch.equal(MaskedIS(cap=5.0, level="sequence")(trainer, sampler, mask)[1], torch.zeros(3,
                       dtype=torch.float64))  # e^2.3 > 5: the whole sequence masked


def test_no_gap_no_change():
    trainer, _, mask, _ = _case()
    for correction in (TruncatedIS(), MaskedIS(), TruncatedIS(level="sequence")):
        assert torch.equal(correction(trainer, trainer, mask), mask.double())


@pytest.mark.parametrize(("build", "message"), [
    (lambda: TruncatedIS(cap=0.5), "module.off_policy.cap must be >= 1"),
    (lambda: MaskedIS(level="batch"), "module.off_policy.level must be one of"),
])
def test_bad_settings_name_the_key(build, message):
    with pytest.raises(ValueError, match=message):
        build()
