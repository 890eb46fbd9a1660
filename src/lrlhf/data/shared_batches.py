"""Prefix-shared batches of pairs and rankings: each group's common prefix encoded once (see
:mod:`lrlhf.functional.prefix_sharing` for the layout and the mask).

A shared batch carries the shared layout, ``input_ids``, ``position_ids`` and ``segment_ids`` ``(G, L)``, one row
per pair or ranking, and NO ``attention_mask`` (the model inputs come from :func:`lrlhf.models.shared_inputs`,
which builds the 4-D mask the model's attention takes). Beside it, the padded layout's per-sequence fields, in the
order :func:`~lrlhf.data.collate.collate_pairs` / :func:`~lrlhf.data.collate.collate_rankings` give them (pairs:
chosen ``[0, B)`` then rejected ``[B, 2B)``; rankings: flattened), so everything that reads a padded batch's
``loss_mask``, ``lengths``, ``prompt_lengths``, ``pair_targets``, ``group``/``ranks``, ``sources``/``meta`` reads
a shared one the same way; ``gather_rows`` ``(N,)`` and ``gather_cols`` ``(N, T)`` map a sequence's tokens to the
shared layout.

Whether sharing pays depends on the data: :func:`prefix_share` measures the fraction of tokens it saves.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lrlhf.data.collate import _labels, _pair_origin, pad_sequences
from lrlhf.data.tokenize import Encoded, EncodedPair, EncodedRanking
from lrlhf.functional.prefix_sharing import PADDING, common_prefix_length

#: ``data.prefix_sharing=auto`` shares prefixes when they hold at least this fraction of a split's tokens. Measured
#: (bench/prefix_share_sweep.py, RESULTS.md): an RM step takes 1.00-1.07x the padded one at shares 0.03-0.05,
#: 0.88x at 0.10, 0.81x at 0.15, 0.55x at 0.45 (the longer rows' attention and the 4-D mask eat small savings).
AUTO_MIN_SHARE = 0.1
#: The values of ``data.prefix_sharing`` and of PPO's ``module.config.prefix_sharing``.
PREFIX_SHARING = ("auto", True, False)


def is_shared(batch: dict) -> bool:
    return "segment_ids" in batch


def _groups(items: Sequence[EncodedPair | EncodedRanking]) -> list[list[Encoded]]:
    if isinstance(items[0], EncodedRanking):
        return [list(r.completions) for r in items]
    return [[p.chosen, p.rejected] for p in items]


def prefix_share(items: Sequence[EncodedPair | EncodedRanking]) -> float:
    """The fraction of the tokens of ``items`` (summed over every sequence) that prefix sharing does not encode:
    ``sum (K - 1) * s / sum of lengths`` with ``s`` each group's shared prefix; at most ``(K - 1) / K``."""
    total = saved = 0
    for group in _groups(items) if items else []:
        ids = [e.input_ids for e in group]
        total += sum(len(i) for i in ids)
        saved += (len(ids) - 1) * common_prefix_length(ids)
    return saved / total if total else 0.0


def collate_shared(groups: Sequence[Sequence[Encoded]], pad_token_id: int, order: Sequence[tuple[int, int]]) -> dict:
    """The shared layout of ``groups`` (each a list of encodings of one prompt) and the per-sequence fields of
    the padded layout, for the sequences ``order`` lists as ``(group, member)``."""
    prefixes = [common_prefix_length([e.input_ids for e in group]) for group in groups]
    width = max(s + sum(len(e.input_ids) - s for e in group) for s, group in zip(prefixes, groups, strict=True))
    input_ids = torch.full((len(groups), width), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((len(groups), width), dtype=torch.long)
    segment_ids = torch.full((len(groups), width), PADDING, dtype=torch.long)
    columns: dict[tuple[int, int], torch.Tensor] = {}
    for g, (s, group) in enumerate(zip(prefixes, groups, strict=True)):
        input_ids[g, :s] = group[0].input_ids[:s]
        position_ids[g, :s] = torch.arange(s)
        segment_ids[g, :s] = 0
        col = s
        for m, e in enumerate(group):
            n = len(e.input_ids) - s
            input_ids[g, col:col + n] = e.input_ids[s:]
            position_ids[g, col:col + n] = torch.arange(s, s + n)
            segment_ids[g, col:col + n] = m + 1
            columns[g, m] = torch.cat([torch.arange(s), torch.arange(col, col + n)])
            col += n
        position_ids[g, col:] = torch.arange(width - col)
    sequences = [groups[g][m] for g, m in order]
    loss_mask = pad_sequences([e.loss_mask for e in sequences], False)
    return {
        "input_ids": input_ids,
        "position_ids": position_ids,
        "segment_ids": segment_ids,
        "gather_rows": torch.tensor([g for g, _ in order], dtype=torch.long),
        "gather_cols": pad_sequences([columns[key] for key in order], 0),
        "loss_mask": loss_mask,
        "labels": _labels(pad_sequences([e.input_ids for e in sequences], pad_token_id), loss_mask),
        "prompt_lengths": torch.tensor([e.prompt_length for e in sequences]),
        "lengths": torch.tensor([len(e.input_ids) for e in sequences]),
    }


def collate_shared_pairs(batch: Sequence[EncodedPair], pad_token_id: int) -> dict:
    """Pairs, one row each (prefix, chosen, rejected); sequences ordered as :func:`collate_pairs` orders rows."""
    order = [(g, 0) for g in range(len(batch))] + [(g, 1) for g in range(len(batch))]
    out = collate_shared(_groups(batch), pad_token_id, order)
    out["pair_targets"] = torch.tensor([p.target for p in batch], dtype=torch.float32)
    out.update(_pair_origin(batch))
    return out


def collate_shared_rankings(batch: Sequence[EncodedRanking], pad_token_id: int) -> dict:
    """Rankings, one row each (prefix, then the K completions); ``group`` and ``ranks`` as
    :func:`collate_rankings`."""
    order = [(g, m) for g, r in enumerate(batch) for m in range(len(r.completions))]
    out = collate_shared(_groups(batch), pad_token_id, order)
    out["group"] = torch.tensor([g for g, _ in order], dtype=torch.long)
    out["ranks"] = torch.tensor([k for r in batch for k in r.ranks], dtype=torch.long)
    return out


def unshare_batch(batch: dict, pad_token_id: int = 0) -> dict:
    """The right-padded ``(N, T)`` layout of a shared batch (``input_ids``, ``attention_mask``), as
    :func:`collate_pairs` / :func:`collate_rankings` would have built it, for a model that cannot take the
    shared layout's 4-D mask (:func:`lrlhf.models.shared_inputs.can_share`)."""
    cols, lengths = batch["gather_cols"], batch["lengths"]
    valid = torch.arange(cols.shape[1], device=cols.device)[None, :] < lengths[:, None]
    ids = batch["input_ids"][batch["gather_rows"][:, None], cols]
    shared_keys = ("position_ids", "segment_ids", "gather_rows", "gather_cols")
    return {k: v for k, v in batch.items() if k not in shared_keys} | {
        "input_ids": torch.where(valid, ids, torch.full_like(ids, pad_token_id)),
        "attention_mask": valid.long(),
    }


def pad_shared_to_multiple(batch: dict, multiple: int) -> dict:
    """The shared layout right-padded to a multiple of ``multiple`` columns (padding segments, attended by no
    real token), for a compiled forward that should see few shapes."""
    extra = -batch["input_ids"].shape[1] % multiple
    if extra == 0:
        return batch
    pad = torch.nn.functional.pad
    ids = batch["input_ids"]
    positions = torch.arange(extra, device=ids.device).expand(ids.shape[0], extra)  # padding: any position
    return batch | {
        "input_ids": pad(ids, (0, extra), value=0),
        "position_ids": torch.cat([batch["position_ids"], positions], dim=1),
        "segment_ids": pad(batch["segment_ids"], (0, extra), value=PADDING),
    }


__all__ = [
    "AUTO_MIN_SHARE",
    "PREFIX_SHARING",
    "collate_shared",
    "collate_shared_pairs",
    "collate_shared_rankings",
    "is_shared",
    "pad_shared_to_multiple",
    "prefix_share",
    "unshare_batch",
]
