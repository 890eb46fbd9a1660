"""Log-probabilities and entropies of no position at all: the documented shape, dtype and device."""

import pytest
import torch

from lrlhf.functional.logprobs import entropy_from_logits, token_logprobs


@pytest.mark.parametrize(
    ("logits_dtype", "out_dtype"),
    [(torch.float64, torch.float64), (torch.bfloat16, torch.float32), (torch.float32, torch.float32)],
)
def test_token_logprobs_of_no_position_keep_shape_and_dtype(logits_dtype, out_dtype):
    logits = torch.zeros(2, 0, 5, dtype=logits_dtype)
    out = token_logprobs(logits, torch.zeros(2, 0, dtype=torch.long))
    assert out.shape == (2, 0)
    assert out.dtype == out_dtype


@pytest.mark.parametrize(
    ("logits_dtype", "out_dtype"),
    [(torch.float64, torch.float64), (torch.bfloat16, torch.float32), (torch.float32, torch.float32)],
)
def test_entropy_of_no_position_keeps_shape_and_dtype(logits_dtype, out_dtype):
    out = entropy_from_logits(torch.zeros(2, 0, 5, dtype=logits_dtype))
    assert out.shape == (2, 0)
    assert out.dtype == out_dtype


def test_no_position_results_stay_on_the_logits_device():
    logits = torch.empty(2, 0, 5, device="meta")
    assert token_logprobs(logits, torch.empty(2, 0, dtype=torch.long, device="meta")).device.type == "meta"
    assert entropy_from_logits(logits).device.type == "meta"
