"""Edge inputs of the masked statistics and of ``response_masks``: integer data, exact count boundaries, constant
data, empty responses and the device the masks are built on."""

import pytest
import torch

from lrlhf.functional.masks import masked_sum, masked_var, masked_whiten, response_masks


def test_masked_sum_of_integers_stays_integer_and_exact():
    x = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int64)
    mask = torch.tensor([[1, 0, 1], [0, 1, 0]], dtype=torch.bool)
    total = masked_sum(x, mask)
    assert total.dtype == torch.int64
    assert total.item() == 1 + 3 + 5
    rows = masked_sum(x, mask, dim=1)
    assert rows.dtype == torch.int64
    assert rows.tolist() == [4, 5]


def test_masked_var_unbiased_accepts_exactly_two_valid_positions():
    x = torch.tensor([1.0, 3.0, 100.0], dtype=torch.float64)
    mask = torch.tensor([True, True, False])
    # mean 2, squared deviations 1 + 1, Bessel: / (2 - 1)
    assert masked_var(x, mask, unbiased=True).item() == 2.0


def test_masked_var_unbiased_rejects_one_valid_position():
    x = torch.tensor([1.0, 3.0], dtype=torch.float64)
    with pytest.raises(ValueError, match="at least two valid positions"):
        masked_var(x, torch.tensor([True, False]), unbiased=True)


def test_masked_whiten_of_constant_values_is_zero_not_nan():
    # variance 0: the eps keeps rsqrt finite, and the centred values are exactly 0
    x = torch.tensor([[2.5, 2.5, 2.5, -7.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False]])
    out = masked_whiten(x, mask)
    assert torch.equal(out, torch.zeros_like(x))
    scaled_only = masked_whiten(x, mask, shift_mean=False)
    torch.testing.assert_close(scaled_only, torch.tensor([[2.5, 2.5, 2.5, 0.0]], dtype=torch.float64))


def test_response_masks_of_empty_responses_have_the_documented_shapes_and_dtypes():
    masks = response_masks(torch.zeros(3, 0, dtype=torch.long), eos_token_id=2)
    for field in (masks.action_mask, masks.done_mask):
        assert field.shape == (3, 0)
        assert field.dtype == torch.bool
    assert masks.has_eos.shape == (3,)
    assert masks.has_eos.dtype == torch.bool
    assert not masks.has_eos.any()
    assert masks.terminal_index.tolist() == [-1, -1, -1]
    assert masks.terminal_index.dtype == torch.long
    assert masks.lengths.tolist() == [0, 0, 0]


@pytest.mark.parametrize("resp_len", [0, 4])
def test_response_masks_are_built_on_the_responses_device(resp_len):
    ids = torch.empty(2, resp_len, dtype=torch.long, device="meta")
    masks = response_masks(ids, eos_token_id=[2, 5])
    for name, field in masks._asdict().items():
        assert field.device.type == "meta", name


class _Seen(Exception):
    pass


@pytest.mark.parametrize("eos", [7, [7, 9]], ids=["one-id", "several-ids"])
def test_the_eos_ids_are_built_on_the_responses_device(monkeypatch, eos):
    """On CUDA, EOS ids left on the CPU make ``torch.isin`` raise; on a CPU (and on meta tensors) it accepts them,
    so the device is read off the call: both operands on the responses' device."""
    seen = {}

    def spy(elements, test_elements, *args, **kwargs):
        seen["devices"] = (elements.device.type, test_elements.device.type)
        raise _Seen

    monkeypatch.setattr(torch, "isin", spy)
    with pytest.raises(_Seen):
        response_masks(torch.empty(2, 3, dtype=torch.long, device="meta"), eos)
    assert seen["devices"] == ("meta", "meta")
