"""The validation boundaries a mutation sample of functional/ found untested (issue #50: the survivors
``temperature <= 0`` in logprobs.py, the aggregation's ``tokens < 1``, the off-policy ``cap >= 1``): each bound
is tested on both sides, so moving it by one (``<`` for ``<=``, ``>`` for ``>=``) fails a test."""

import math

import pytest
import torch

from lrlhf.functional.logprobs import entropy_from_logits
from lrlhf.functional.off_policy import MaskedIS, TruncatedIS
from lrlhf.functional.policy_losses import SequenceSumNorm


def test_the_entropy_refuses_a_temperature_of_zero_and_takes_any_above():
    logits = torch.tensor([[0.0, math.log(3.0)]])
    with pytest.raises(ValueError, match="temperature must be > 0, got 0"):
        entropy_from_logits(logits, temperature=0.0)
    with pytest.raises(ValueError, match="temperature must be > 0, got -1"):
        entropy_from_logits(logits, temperature=-1.0)
    # p = (1/4, 3/4) at T = 1: H = -(1/4 ln 1/4 + 3/4 ln 3/4); a small T sharpens it towards 0, finite
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert entropy_from_logits(logits).item() == pytest.approx(expected, abs=1e-6)
    assert 0.0 <= entropy_from_logits(logits, temperature=1e-3).item() < 1e-6


def test_the_sequence_sum_aggregation_takes_one_token_and_refuses_none():
    assert SequenceSumNorm(tokens=1).tokens == 1
    with pytest.raises(ValueError, match=r"aggregation.tokens must be >= 1, got 0"):
        SequenceSumNorm(tokens=0)


@pytest.mark.parametrize("cls", [TruncatedIS, MaskedIS])
def test_the_off_policy_cap_takes_one_and_refuses_below(cls):
    assert cls(cap=1.0).cap == 1.0  # a cap of exactly 1: every weight above 1 truncated (or masked)
    for bad in (0.999, float("nan")):
        with pytest.raises(ValueError, match="module.off_policy.cap must be >= 1"):
            cls(cap=bad)
