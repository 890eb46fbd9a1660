"""Collators: shapes, pad side, pair_targets, ranking groups, packed pairs — on hand-made encodings."""

import torch

from lrlhf.data.collate import (
    collate_packed_pairs,
    collate_pairs,
    collate_prompts,
    collate_rankings,
    collate_sft,
    model_inputs,
    pad_sequences,
)
from lrlhf.data.tokenize import Encoded, EncodedPair, EncodedPrompt, EncodedRanking

PAD = 0


def enc(ids, targets, prompt_length):
    input_ids = torch.tensor(ids)
    loss_mask = torch.tensor(targets, dtype=torch.bool)
    return Encoded(input_ids, torch.ones_like(input_ids), loss_mask, prompt_length)


A = enc([5, 6, 7], [0, 0, 1], 2)
B = enc([8, 9, 10, 11, 12], [0, 0, 1, 1, 0], 2)
C = enc([13, 14], [0, 1], 1)


def test_pad_sequences_both_sides():
    seqs = [torch.tensor([1, 2]), torch.tensor([3])]
    assert pad_sequences(seqs, 0).tolist() == [[1, 2], [3, 0]]
    assert pad_sequences(seqs, 0, left=True).tolist() == [[1, 2], [0, 3]]


def test_collate_sft_right_pads():
    batch = collate_sft([A, B], PAD)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 0, 0], [8, 9, 10, 11, 12]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert batch["loss_mask"].int().tolist() == [[0, 0, 1, 0, 0], [0, 0, 1, 1, 0]]
    assert batch["labels"].tolist() == [[-100, -100, 7, -100, -100], [-100, -100, 10, 11, -100]]
    assert batch["prompt_lengths"].tolist() == [2, 2]
    assert batch["lengths"].tolist() == [3, 5]
    assert set(model_inputs(batch)) == {"input_ids", "attention_mask"}


def test_collate_pairs_stacks_chosen_then_rejected():
    batch = collate_pairs([EncodedPair(A, B, 1.0), EncodedPair(C, A, 0.5)], PAD)
    assert batch["input_ids"].shape == (4, 5)
    assert batch["input_ids"][:, 0].tolist() == [5, 13, 8, 5]  # chosen A, C; rejected B, A
    assert batch["lengths"].tolist() == [3, 2, 5, 3]
    assert batch["pair_targets"].tolist() == [1.0, 0.5]
    assert batch["pair_targets"].dtype == torch.float32


def test_collate_rankings_flattens_with_groups():
    batch = collate_rankings([EncodedRanking([A, B, C], [2, 1, 2]), EncodedRanking([C, A], [1, 2])], PAD)
    assert batch["input_ids"].shape == (5, 5)
    assert batch["group"].tolist() == [0, 0, 0, 1, 1]
    assert batch["ranks"].tolist() == [2, 1, 2, 1, 2]
    assert batch["input_ids"][:, 0].tolist() == [5, 8, 13, 13, 5]


def test_collate_prompts_left_pads_and_keeps_exact_ids():
    prompts = [EncodedPrompt(A, [{"role": "user", "content": "x"}], {"n": 1}), EncodedPrompt(C, [], {"n": 2})]
    batch = collate_prompts(prompts, PAD)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [0, 13, 14]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [0, 1, 1]]
    assert batch["prompt_lengths"].tolist() == [3, 2]
    assert batch["meta"] == [{"n": 1}, {"n": 2}]
    assert batch["prompts"][0] == [{"role": "user", "content": "x"}]


def test_collate_packed_pairs_end_positions():
    rows = [[EncodedPair(A, C, 1.0), EncodedPair(C, C, 0.5)], [EncodedPair(B, A, 1.0)]]
    batch = collate_packed_pairs(rows, PAD)
    # row 0: A(0-2) C(3-4) C(5-6) C(7-8); row 1: B(0-4) A(5-7) then one pad
    assert batch["input_ids"].tolist() == [[5, 6, 7, 13, 14, 13, 14, 13, 14], [8, 9, 10, 11, 12, 5, 6, 7, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 0, 1], [0, 1, 2, 3, 4, 0, 1, 2, 0]]
    assert batch["chosen_end"].tolist() == [[0, 2], [0, 6], [1, 4]]
    assert batch["rejected_end"].tolist() == [[0, 4], [0, 8], [1, 7]]
    assert batch["pair_targets"].tolist() == [1.0, 0.5, 1.0]
    assert model_inputs(batch)["use_cache"] is False and "attention_mask" not in model_inputs(batch)


def test_pairs_carry_source_meta_and_completion_lengths():
    pairs = [EncodedPair(A, C, 1.0, "hh", {"task": {"kind": "sort"}}), EncodedPair(B, A, 0.5)]
    padded = collate_pairs(pairs, PAD)
    assert padded["sources"] == ["hh", ""]
    assert padded["meta"] == [{"task": {"kind": "sort"}}, {}]
    packed = collate_packed_pairs([pairs[:1], pairs[1:]], PAD)
    assert packed["sources"] == ["hh", ""] and packed["meta"] == padded["meta"]
    # completion = tokens after the prompt, chosen A (3-2), B (5-2), then rejected C (2-1), A (3-2)
    assert packed["completion_lengths"].tolist() == [1, 3, 1, 1]
    assert (padded["lengths"] - padded["prompt_lengths"]).tolist() == [1, 3, 1, 1]
