"""Prefix sharing's tensor math (lrlhf.functional.prefix_sharing) at its edges: the inputs it refuses and the errors
that say why, groups of one, more than two sequences, and outputs that stay on the inputs' device whatever torch's
default device is (a run that sets ``torch.set_default_device`` must not move the layout elsewhere)."""

import re

import pytest
import torch

from lrlhf.functional import token_logprobs
from lrlhf.functional.prefix_sharing import (
    PADDING,
    PREFIX,
    additive_mask,
    common_prefix_length,
    group_layout,
    group_response_logits,
    shared_attention_mask,
    shared_logprob_sums,
)


# ------------------------------------------------------------------------------------- common_prefix_length
def test_common_prefix_length_checks_every_sequence_against_the_first():
    # the second sequence differs from the first at token 1, the third agrees with the first up to token 3
    sequences = [torch.tensor([5, 6, 7, 8, 9]), torch.tensor([5, 1, 7, 8, 9]), torch.tensor([5, 6, 7, 8, 2])]
    assert common_prefix_length(sequences) == 1
    assert common_prefix_length([sequences[0], sequences[2], sequences[1]]) == 1  # order does not matter


def test_common_prefix_length_of_one_token_sequences_is_zero():
    assert common_prefix_length([torch.tensor([5])]) == 0
    assert common_prefix_length([torch.tensor([5]), torch.tensor([5, 6])]) == 0  # each keeps its last token


def test_common_prefix_length_refuses_no_sequence_and_empty_ones():
    with pytest.raises(ValueError, match="^common_prefix_length needs at least one sequence$"):
        common_prefix_length([])
    with pytest.raises(ValueError, match="^common_prefix_length: an empty sequence has no last token$"):
        common_prefix_length([torch.tensor([5, 6]), torch.tensor([], dtype=torch.long)])


# -------------------------------------------------------------------------------------- shared_logprob_sums
def _one_row():
    """One shared row: prefix [3, 4], continuation A [5, 6], continuation B [7]; sequences A = 3 4 5 6, B = 3 4 7."""
    input_ids = torch.tensor([[3, 4, 5, 6, 7]])
    rows = torch.tensor([0, 0])
    cols = torch.tensor([[0, 1, 2, 3], [0, 1, 4, 4]])  # B's last column repeats (padding, never a target)
    logits = torch.randn(1, 5, 9, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return logits, input_ids, rows, cols


def test_shared_logprob_sums_by_hand():
    logits, input_ids, rows, cols = _one_row()
    targets = torch.tensor([[False, True, True, True], [False, False, True, False]])
    a = token_logprobs(logits[0, :3], torch.tensor([4, 5, 6])).sum()  # A: 4 by col 0, 5 by col 1, 6 by col 2
    b = token_logprobs(logits[0, 1], torch.tensor(7))  # B: 7 by the last prefix column
    torch.testing.assert_close(shared_logprob_sums(logits, input_ids, rows, cols, targets), torch.stack([a, b]),
                               atol=1e-12, rtol=0)


def test_shared_logprob_sums_refuses_misaligned_targets_and_a_first_token_target():
    logits, input_ids, rows, cols = _one_row()
    with pytest.raises(ValueError, match=r"^targets \(2, 3\) and cols \(2, 4\) do not align$"):
        shared_logprob_sums(logits, input_ids, rows, cols, torch.zeros(2, 3, dtype=torch.bool))
    first = torch.zeros(2, 4, dtype=torch.bool)
    first[1, 0] = True
    with pytest.raises(ValueError, match="^a sequence's first token has no predictor and cannot be a target$"):
        shared_logprob_sums(logits, input_ids, rows, cols, first)
    second = torch.zeros(2, 4, dtype=torch.bool)
    second[:, 1] = True  # token 1 is predicted by token 0: allowed
    assert shared_logprob_sums(logits, input_ids, rows, cols, second).shape == (2,)


# ------------------------------------------------------------------------------------ group layout and logits
def test_groups_of_one_are_a_valid_layout():
    query_ids, query_mask = torch.tensor([[0, 7, 8], [5, 6, 9]]), torch.tensor([[0, 1, 1], [1, 1, 1]])
    response_ids = torch.tensor([[11, 12], [13, 14]])
    ids, positions, segments = group_layout(query_ids, query_mask, response_ids, 1)
    assert ids.tolist() == [[0, 7, 8, 11, 12], [5, 6, 9, 13, 14]]
    assert positions.tolist() == [[0, 0, 1, 2, 3], [0, 1, 2, 3, 4]]
    assert segments.tolist() == [[PADDING, PREFIX, PREFIX, 1, 1], [PREFIX, PREFIX, PREFIX, 1, 1]]
    with pytest.raises(ValueError, match="group_layout: 2 rows are not whole groups of 0"):
        group_layout(query_ids, query_mask, response_ids, 0)


@pytest.mark.parametrize(("k", "resp_len", "columns"), [(2, 3, 6), (3, 2, 8), (1, 4, 4)])
def test_group_response_logits_names_the_columns_it_got_and_expected(k, resp_len, columns):
    logits = torch.zeros(2, columns, 5)  # 5 vocabulary entries: not to be confused with the columns
    message = f"group_response_logits: {columns} columns, expected k R + 1 = {k * resp_len + 1}"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        group_response_logits(logits, k, resp_len)


# ------------------------------------------------------------------------------------------------ devices
def test_outputs_stay_on_the_inputs_device_whatever_the_default_device():
    segment_ids = torch.tensor([[0, 0, 1, 1, 2, -1]])
    query_ids, query_mask = torch.tensor([[0, 7, 8], [0, 7, 8]]), torch.tensor([[0, 1, 1], [0, 1, 1]])
    response_ids = torch.tensor([[11, 12], [13, 14]])
    logits = torch.arange(5, dtype=torch.float).reshape(1, 5, 1)
    lp_logits, input_ids, rows, cols = _one_row()
    targets = torch.tensor([[False, True, True, True], [False, False, True, False]])
    expected = {
        "mask": shared_attention_mask(segment_ids),
        "additive": additive_mask(shared_attention_mask(segment_ids), torch.float32),
        "layout": group_layout(query_ids, query_mask, response_ids, 2),
        "logits": group_response_logits(logits, 2, 2),
        "sums": shared_logprob_sums(lp_logits, input_ids, rows, cols, targets),
    }
    with torch.device("meta"):  # a factory call without an explicit device lands here
        got = {
            "mask": shared_attention_mask(segment_ids),
            "additive": additive_mask(expected["mask"], torch.float32),
            "layout": group_layout(query_ids, query_mask, response_ids, 2),
            "logits": group_response_logits(logits, 2, 2),
            "sums": shared_logprob_sums(lp_logits, input_ids, rows, cols, targets),
        }
    for key, value in got.items():
        for got_t, expected_t in zip(value if isinstance(value, tuple) else (value,),
                                     expected[key] if isinstance(value, tuple) else (expected[key],), strict=True):
            assert got_t.device.type == "cpu", key
            assert torch.equal(got_t, expected_t), key
