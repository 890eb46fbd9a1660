"""Batches from encodings: padding collators and packing.

Every batch is a dict of tensors. Shapes: B examples, T = longest sequence in the batch.
``attention_mask`` is 1 on real tokens, 0 on padding. ``loss_mask`` is True where a token is a target (see
:class:`lrlhf.data.tokenize.Encoded`); it is False on padding. ``labels`` = ``input_ids`` where ``loss_mask``
else -100, for Hugging Face's built-in loss.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from lrlhf.data.tokenize import Encoded, EncodedPair, EncodedPrompt, EncodedRanking

IGNORE_INDEX = -100


def pad_sequences(seqs: Sequence[torch.Tensor], value, *, left: bool = False) -> torch.Tensor:
    """Stack 1-D tensors into (B, T), T = longest, filling with ``value`` on the right (or the left)."""
    length = max(len(s) for s in seqs)
    out = torch.full((len(seqs), length), value, dtype=seqs[0].dtype)
    for row, seq in enumerate(seqs):
        if left:
            out[row, length - len(seq):] = seq
        else:
            out[row, : len(seq)] = seq
    return out


def collate_responses(tokenizer, texts: Sequence[str], eos_token_id: int, pad_token_id: int) -> torch.Tensor:
    """``(B, R)`` response ids of texts, as a sampler would have written them: each text's tokens (no special
    tokens added), then ``eos_token_id``, right-padded with ``pad_token_id`` (a reward source rescores them with
    :func:`lrlhf.functional.response_masks`)."""
    return pad_sequences([torch.tensor(tokenizer(t, add_special_tokens=False)["input_ids"] + [eos_token_id])
                          for t in texts], pad_token_id)


def pad_to_multiple(input_ids: torch.Tensor, attention_mask: torch.Tensor, multiple: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad ``(B, T)`` ids (with id 0) and mask (with 0) to the next multiple of ``multiple`` columns.

    The new columns are masked out, so every real token's hidden state and each row's last attended token
    are unchanged; a compiled forward then sees one shape per bucket instead of one per batch length.
    """
    extra = -input_ids.shape[1] % multiple
    if extra == 0:
        return input_ids, attention_mask
    return F.pad(input_ids, (0, extra), value=0), F.pad(attention_mask, (0, extra), value=0)


def _labels(input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    return torch.where(loss_mask, input_ids, torch.full_like(input_ids, IGNORE_INDEX))


def collate_encoded(batch: Sequence[Encoded], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded: input_ids, attention_mask, loss_mask, labels (B, T); prompt_lengths, lengths (B,)."""
    input_ids = pad_sequences([e.input_ids for e in batch], pad_token_id)
    loss_mask = pad_sequences([e.loss_mask for e in batch], False)
    return {
        "input_ids": input_ids,
        "attention_mask": pad_sequences([e.attention_mask for e in batch], 0),
        "loss_mask": loss_mask,
        "labels": _labels(input_ids, loss_mask),
        "prompt_lengths": torch.tensor([e.prompt_length for e in batch]),
        "lengths": torch.tensor([len(e.input_ids) for e in batch]),
    }


def collate_sft(batch: Sequence[Encoded], pad_token_id: int) -> dict[str, torch.Tensor]:
    """SFT batch (right padding); see :func:`collate_encoded`."""
    return collate_encoded(batch, pad_token_id)


def collate_pairs(batch: Sequence[EncodedPair], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Pairs as one batch of 2B rows for a single forward: rows [0, B) chosen, rows [B, 2B) rejected.

    Adds ``pair_targets`` (B,) float = P(chosen wins), 0.5 for a tie. ``lengths - 1`` indexes each row's last
    real token (where a reward model reads its score). ``sources`` and ``meta`` (lists of B) are the records'
    (per-source evaluation).
    """
    out = collate_encoded([p.chosen for p in batch] + [p.rejected for p in batch], pad_token_id)
    out["pair_targets"] = torch.tensor([p.target for p in batch], dtype=torch.float32)
    out.update(_pair_origin(batch))
    return out


def _pair_origin(pairs: Sequence[EncodedPair]) -> dict[str, list]:
    return {"sources": [p.source for p in pairs], "meta": [p.meta or {} for p in pairs]}


def collate_rankings(batch: Sequence[EncodedRanking], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Rankings flattened to N = sum K_i rows, for ``lrlhf.functional.ranking_loss(rewards, ranks, group)``.

    Adds ``group`` (N,) long = index of the ranking in the batch, ``ranks`` (N,) long (1 is best, ties equal).
    """
    encodings = [e for r in batch for e in r.completions]
    out = collate_encoded(encodings, pad_token_id)
    out["group"] = torch.tensor([g for g, r in enumerate(batch) for _ in r.completions], dtype=torch.long)
    out["ranks"] = torch.tensor([k for r in batch for k in r.ranks], dtype=torch.long)
    return out


def collate_prompts(batch: Sequence[EncodedPrompt], pad_token_id: int) -> dict:
    """Prompts LEFT-padded for generation: the new tokens of every row then start at the same column T.

    input_ids, attention_mask (B, T); prompt_lengths (B,); ``meta`` and ``prompts`` as lists (task data for
    scoring). ``input_ids[b, T - prompt_lengths[b]:]`` are exactly the encoded ids.
    """
    encodings = [p.encoded for p in batch]
    return {
        "input_ids": pad_sequences([e.input_ids for e in encodings], pad_token_id, left=True),
        "attention_mask": pad_sequences([e.attention_mask for e in encodings], 0, left=True),
        "prompt_lengths": torch.tensor([len(e.input_ids) for e in encodings]),
        "prompts": [p.prompt for p in batch],
        "meta": [p.meta for p in batch],
    }


# ------------------------------------------------------------------------------------------------- packing
def pack_greedy(lengths: Sequence[int], max_length: int) -> list[list[int]]:
    """Group sequence indices into rows of total length <= max_length (first fit, in the given order).

    Deterministic: the same lengths always give the same rows.
    """
    rows: list[list[int]] = []
    room: list[int] = []
    for index, length in enumerate(lengths):
        if length > max_length:
            raise ValueError(f"sequence {index} has {length} tokens > max_length={max_length}")
        for row, free in enumerate(room):
            if length <= free:
                rows[row].append(index)
                room[row] -= length
                break
        else:
            rows.append([index])
            room.append(max_length - length)
    return rows


def collate_packed(rows: Sequence[Sequence[Encoded]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Several sequences per row, with no attention across them. Call the model with :func:`model_inputs`.

    Returns input_ids, position_ids, loss_mask, labels, sequence_ids (R, L) and NO ``attention_mask``.
    ``position_ids`` restart at 0 for every sequence; transformers 5.x (``masking_utils.
    find_packed_sequence_indices``) turns the restarts into a block-diagonal causal mask, for "eager" and
    "sdpa" alike, but only when ``attention_mask is None`` AND no KV cache exists. Llama-style models create a
    ``DynamicCache`` by default even in train mode (``config.use_cache=True``), which silently disables the
    detection, so packed rows must be run with ``use_cache=False`` (as :func:`model_inputs` does).
    Trailing padding is its own sequence (positions 0, 1, ...) so no real token attends to it, and its
    loss_mask is False, as is every sequence's first token (it is never predicted).
    ``sequence_ids`` numbers the sequences of a row 0, 1, ...; -1 on padding.
    """
    length = max(sum(len(e.input_ids) for e in row) for row in rows)
    input_ids = torch.full((len(rows), length), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((len(rows), length), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), length), dtype=torch.bool)
    sequence_ids = torch.full((len(rows), length), -1, dtype=torch.long)
    for r, row in enumerate(rows):
        col = 0
        for s, e in enumerate(row):
            n = len(e.input_ids)
            input_ids[r, col:col + n] = e.input_ids
            position_ids[r, col:col + n] = torch.arange(n)
            loss_mask[r, col:col + n] = e.loss_mask
            # A sequence's first token has no prediction of its own; unpacked it is never scored, packed it
            # would be scored from the previous sequence's last logit, so it must not be a target.
            loss_mask[r, col] = False
            sequence_ids[r, col:col + n] = s
            col += n
        position_ids[r, col:] = torch.arange(length - col)
    return {
        "input_ids": input_ids,
        "position_ids": position_ids,
        "loss_mask": loss_mask,
        "labels": _labels(input_ids, loss_mask),
        "sequence_ids": sequence_ids,
    }


def collate_packed_pairs(rows: Sequence[Sequence[EncodedPair]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Packed preference pairs: each row holds whole pairs, laid out chosen_0, rejected_0, chosen_1, ...

    Returns :func:`collate_packed`'s tensors plus, for the B pairs in row-major order, ``pair_targets`` (B,)
    and ``chosen_end`` / ``rejected_end`` (B, 2) long = (row, column) of each sequence's last token, where a
    reward model reads its score: ``values[chosen_end[:, 0], chosen_end[:, 1]]``; ``completion_lengths``
    (2B,) long = tokens after the prompt, chosen first then rejected (as the padded layout's
    ``lengths - prompt_lengths``); ``sources`` and ``meta`` as in :func:`collate_pairs`.
    """
    sequences = [[e for pair in row for e in (pair.chosen, pair.rejected)] for row in rows]
    out = collate_packed(sequences, pad_token_id)
    ends = []
    for r, row in enumerate(rows):
        col = 0
        for pair in row:
            col += len(pair.chosen.input_ids)
            chosen_end = (r, col - 1)
            col += len(pair.rejected.input_ids)
            ends.append((chosen_end, (r, col - 1)))
    out["chosen_end"] = torch.tensor([c for c, _ in ends], dtype=torch.long)
    out["rejected_end"] = torch.tensor([r for _, r in ends], dtype=torch.long)
    pairs = [p for row in rows for p in row]
    out["pair_targets"] = torch.tensor([p.target for p in pairs], dtype=torch.float32)
    out["completion_lengths"] = torch.tensor(
        [len(e.input_ids) - e.prompt_length for e in [p.chosen for p in pairs] + [p.rejected for p in pairs]]
    )
    out.update(_pair_origin(pairs))
    return out


def model_inputs(batch: dict) -> dict:
    """Keyword arguments for a causal LM forward on a padded or a packed batch.

    Padded: ``input_ids`` and ``attention_mask``. Packed (no attention_mask, has position_ids): ``input_ids``,
    ``position_ids`` and ``use_cache=False``, without which transformers ignores the packing (see
    :func:`collate_packed`).
    """
    if "attention_mask" in batch:
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    return {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"], "use_cache": False}
