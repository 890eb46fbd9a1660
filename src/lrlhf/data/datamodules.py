"""LightningDataModules for SFT, preferences (pairs or rankings) and RL prompts.

Each split is given as in-memory records or a source (a path or a ``datasets`` name, read with
``lrlhf.data.formats.load_records``). ``setup`` encodes every split once with :func:`encode_chat`'s rules;
``stats[split]`` then holds the truncation/drop counts (the loader's ``DataSummary`` when read from a source).

Training order comes from a :class:`ResumableSampler` (seed + epoch), whose position is saved through the
datamodule's ``state_dict`` (Lightning stores it in every checkpoint) and restored by ``load_state_dict``, so
a resumed run sees exactly the batches an uninterrupted run would have seen next.

DDP: the samplers shard by rank themselves (rank and world size from the attached trainer, or the
``num_replicas``/``rank`` arguments without one). They are ``DistributedSampler`` subclasses, so Lightning's
``use_distributed_sampler`` leaves them in place. Every rank yields the same number of indices, so the
position saved by rank 0 is valid for all ranks. Validation/test sets are sharded too, without shuffling;
like ``DistributedSampler`` this repeats up to ``world_size - 1`` examples to even out the shards.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
from torch.utils.data import DataLoader

from lrlhf.data.collate import (
    collate_packed,
    collate_packed_pairs,
    collate_pairs,
    collate_prompts,
    collate_rankings,
    collate_sft,
    pack_greedy,
)
from lrlhf.data.records import PREFERENCE_KINDS, PreferencePair, PromptExample, Ranking, SFTExample
from lrlhf.data.sampler import ResumableSampler
from lrlhf.data.shared_batches import (
    AUTO_MIN_SHARE,
    PREFIX_SHARING,
    collate_shared_pairs,
    collate_shared_rankings,
    prefix_share,
)
from lrlhf.data.tokenize import (
    LOSS_ON,
    SPECIAL_TEXT_POLICIES,
    TRUNCATION_POLICIES,
    EncodedRanking,
    EncodeStats,
    check_choice,
    encode_pair,
    encode_prompt,
    encode_ranking,
    encode_sft,
    renders_tools,
    tools_of,
)
from lrlhf.utils.model_source import load_tokenizer

SPLITS = ("train", "val", "test")


class ResumableDataLoader(DataLoader):
    """A DataLoader whose ``state_dict`` is its :class:`ResumableSampler`'s.

    Lightning saves and restores a stateful training loader in the fit loop's state by itself (and then no
    longer warns that a mid-epoch checkpoint is not resumable); the datamodule's own ``state_dict`` holds the
    same position, so either path restores the same state.
    """

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)


class ChatDataModule(pl.LightningDataModule):
    """Shared machinery; subclasses say how a record is encoded and how a batch is collated.

    Args:
        tokenizer: a tokenizer with a chat template, or what :func:`lrlhf.utils.model_source.load_tokenizer`
            loads one from (a model folder or hub id, a ``ModelConfig``).
        train, val, test: records of the subclass's kind, or a source for ``load_records``; ``None`` skips.
            A source named for several splits is read once and split by prompt group
            (:func:`lrlhf.data.splits.split_by_prompt` with ``split_fractions`` and ``seed``); a source named
            for one split is used whole.
        batch_size: examples per training batch (packed: rows per batch). ``eval_batch_size`` defaults to it.
        max_length: the most tokens per sequence (per packed row when packing).
        truncation: ``"left"`` (cut the prompt's start) or ``"drop"``; see :mod:`lrlhf.data.tokenize`.
        loss_on: ``"last"`` or ``"all"`` assistant turns.
        special_text: ``"drop"`` (counted), ``"error"`` or ``"keep"`` an example whose message content contains
            a special token's text (see :mod:`lrlhf.data.tokenize`).
        packing: several examples per row (SFT and pairs); batches then have no attention_mask.
        pack_length: tokens per packed row; default ``max_length`` (SFT), ``2 * max_length`` (pairs: a
            pair's two sequences always share a row).
        seed: the sampler's seed (epoch e uses seed + e).
        num_workers: DataLoader workers; 0 keeps the saved position exact (see :mod:`lrlhf.data.sampler`).
        num_replicas, rank: sharding when no trainer is attached (a trainer's values take precedence).
        format, load_kwargs: passed to ``load_records`` for sources.
        split_fractions: shares of a shared source per split (renormalised over the splits that share it).
        max_eval_records: the first N records of the val and test splits (None: all): evaluation's fixed cost
            scaled to a short run (``hparams.<stage>.max_eval_records``; a CPU-sized run sets it).
    """

    record_kind: str | tuple[str, ...] = ""  # the ``kind`` argument of load_records
    supports_packing = False

    def __init__(
        self,
        tokenizer: Any,
        *,
        train: Sequence | str | None = None,
        val: Sequence | str | None = None,
        test: Sequence | str | None = None,
        batch_size: int = 8,
        eval_batch_size: int | None = None,
        max_length: int = 1024,
        truncation: str = "left",
        loss_on: str = "last",
        special_text: str = "drop",
        packing: bool = False,
        pack_length: int | None = None,
        seed: int = 0,
        num_workers: int = 0,
        drop_last: bool = False,
        num_replicas: int = 1,
        rank: int = 0,
        format: str = "auto",
        load_kwargs: dict | None = None,
        split_fractions: dict[str, float] | None = None,
        max_eval_records: int | None = None,
    ):
        super().__init__()
        check_choice("truncation", truncation, TRUNCATION_POLICIES)
        check_choice("loss_on", loss_on, LOSS_ON)
        check_choice("special_text", special_text, SPECIAL_TEXT_POLICIES)
        if packing and not self.supports_packing:
            raise ValueError(f"packing=True is not supported by {type(self).__name__}")
        if batch_size < 1 or max_length < 1:
            raise ValueError(f"batch_size={batch_size} and max_length={max_length} must be positive")
        if max_eval_records is not None and max_eval_records < 1:
            raise ValueError(f"data.max_eval_records must be >= 1 or null (all), got {max_eval_records}")
        self.max_eval_records = max_eval_records
        self.tokenizer = load_tokenizer(tokenizer)
        self.sources = {"train": train, "val": val, "test": test}
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.max_length = max_length
        self.truncation = truncation
        self.loss_on = loss_on
        self.special_text = special_text
        self.packing = packing
        self.pack_length = pack_length
        self.seed = seed
        self.num_workers = num_workers
        self.drop_last = drop_last
        self.num_replicas = num_replicas
        self.rank = rank
        self.format = format
        self.load_kwargs = dict(load_kwargs or {})
        self.split_fractions = {"train": 0.9, "val": 0.05, "test": 0.05} | dict(split_fractions or {})
        self._loaded: dict = {}
        self.datasets: dict[str, list] = {}
        self.stats: dict[str, Any] = {}
        self.reports: dict[str, dict] = {}  # per split: records, kept, every drop by reason (summary.json "data")
        self._train_sampler: ResumableSampler | None = None
        self._pending_state: dict | None = None

    # ------------------------------------------------------------------------------------ to override
    def encode(self, record, stats):
        """One record -> one dataset item (or None when dropped)."""
        raise NotImplementedError

    def collate(self, items: list) -> dict:
        raise NotImplementedError

    def pack(self, items: list) -> list:
        """Dataset items -> packed rows (lists of items); only for ``supports_packing``."""
        raise NotImplementedError

    # ---------------------------------------------------------------------------------------- setup
    @property
    def pad_token_id(self) -> int:
        # Padding is masked everywhere, so EOS is a safe pad when the tokenizer defines none.
        pad = self.tokenizer.pad_token_id
        return self.tokenizer.eos_token_id if pad is None else pad

    def _encode_kwargs(self) -> dict:
        return {"max_length": self.max_length, "truncation": self.truncation, "loss_on": self.loss_on,
                "special_text": self.special_text}

    def _records(self, split: str):
        source = self.sources[split]
        if not isinstance(source, (str, bytes)) and not hasattr(source, "__fspath__"):
            return list(source), EncodeStats()
        from lrlhf.data.formats import load_records  # the format layer; imported only when a source is used
        from lrlhf.data.splits import split_by_prompt

        if source not in self._loaded:
            self._loaded[source] = load_records(source, self.record_kind, format=self.format, **self.load_kwargs)
        records, summary = self._loaded[source]
        summary = copy.deepcopy(summary)  # each split counts its own truncations from here on
        sharing = [name for name in SPLITS if self.sources[name] == source]
        if len(sharing) == 1:
            return records, summary
        # One source named for several splits is split by prompt group (no prompt crosses splits).
        shares = {name: self.split_fractions[name] for name in sharing}
        total = sum(shares.values())
        parts = split_by_prompt(records, {name: share / total for name, share in shares.items()}, seed=self.seed)
        return parts[split], summary

    def split_records(self, split: str) -> list:
        """The records of ``split`` that :meth:`setup` encodes (before encoding's drops; an evaluation split cut to
        ``max_eval_records``); [] when the split has no source."""
        if self.sources[split] is None:
            return []
        records, _ = self._records(split)
        return records if split == "train" or self.max_eval_records is None else records[:self.max_eval_records]

    def setup(self, stage: str | None = None) -> None:
        for split in SPLITS:
            if self.sources[split] is None or split in self.datasets:
                continue
            records, stats = self._records(split)
            if split != "train" and self.max_eval_records is not None:
                records = records[:self.max_eval_records]
            with_tools = sum(1 for r in records if tools_of(getattr(r, "meta", None)))
            if with_tools and not renders_tools(self.tokenizer):  # before any encoding: the count, not one record
                raise ValueError(f"{split} split: {with_tools} of {len(records)} records carry tool schemas ('tools') "
                                 f"that the chat template of {self.tokenizer.name_or_path} does not render; use a "
                                 "model whose template takes tools, or leave those records out")
            before = dict(stats.dropped), stats.truncated, stats.removed_answers
            items = [item for item in (self.encode(r, stats) for r in records) if item is not None]
            self.reports[split] = self._report(split, records, items, stats, before)
            if not items:
                raise ValueError(
                    f"{split} split is empty after encoding: {len(records)} records, "
                    f"dropped {dict(stats.dropped)}, truncated {stats.truncated} "
                    f"(max_length={self.max_length}, truncation={self.truncation!r})"
                )
            self.datasets[split] = self.pack(items) if self.packing else items
            self.stats[split] = stats

    def _report(self, split: str, records: list, items: list, stats, before) -> dict:
        """What reading and encoding ``split`` kept and dropped, per reason; printed when encoding dropped,
        truncated or trimmed anything (the loader's summary, printed earlier, cannot know it)."""
        dropped_before, truncated_before, removed_before = before
        encoding = {reason: n - dropped_before.get(reason, 0) for reason, n in stats.dropped.items()
                    if n - dropped_before.get(reason, 0)}
        report = {"source": str(getattr(stats, "source", "records")), "records": len(records), "kept": len(items),
                  "dropped_reading": dropped_before, "dropped_encoding": encoding,
                  "truncated": stats.truncated - truncated_before,
                  "removed_answers": stats.removed_answers - removed_before}
        labelled = sum(bool(getattr(r, "labelled", False)) for r in records)  # pairs oriented by a person's label
        if labelled:
            report["labelled"] = labelled
        if encoding or report["truncated"] or report["removed_answers"]:
            parts = [f"dropped {', '.join(f'{reason} {n}' for reason, n in encoding.items())}"] if encoding else []
            parts += [f"truncated {report['truncated']}"] if report["truncated"] else []
            if report["removed_answers"]:
                parts.append(f"{report['removed_answers']} ranking answers removed as too long")
            print(f"data {split} ({report['source']}), encoded with max_length={self.max_length}: "
                  f"{len(records):,} records -> {len(items):,} kept; {'; '.join(parts)}", flush=True)
        return report

    # ---------------------------------------------------------------------------------- dataloaders
    def _replicas(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        if trainer is not None:
            return trainer.world_size, trainer.global_rank
        return self.num_replicas, self.rank

    def train_sampler(self) -> ResumableSampler:
        """The training sampler (created once per world layout; carries the resume position)."""
        world, rank = self._replicas()
        sampler = self._train_sampler
        if sampler is None or (sampler.num_replicas, sampler.rank) != (world, rank):
            self.setup("fit")
            sampler = ResumableSampler(
                len(self.datasets["train"]), seed=self.seed, shuffle=True, num_replicas=world, rank=rank,
                drop_last=self.drop_last,
            )
            if self._pending_state is not None:
                sampler.load_state_dict(self._pending_state)
                self._pending_state = None
            self._train_sampler = sampler
        return sampler

    def _loader(self, split: str, sampler, batch_size: int, drop_last: bool) -> DataLoader:
        return ResumableDataLoader(
            self.datasets[split], batch_size=batch_size, sampler=sampler, collate_fn=self.collate,
            num_workers=self.num_workers, drop_last=drop_last,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", self.train_sampler(), self.batch_size, self.drop_last)

    def _eval_loader(self, split: str) -> DataLoader | list:
        if self.sources[split] is None:
            return []
        self.setup(split)
        world, rank = self._replicas()
        sampler = ResumableSampler(len(self.datasets[split]), shuffle=False, num_replicas=world, rank=rank)
        return self._loader(split, sampler, self.eval_batch_size, False)

    def val_dataloader(self):
        return self._eval_loader("val")

    def test_dataloader(self):
        return self._eval_loader("test")

    # --------------------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        """The training sampler's epoch and position (saved by Lightning in checkpoints)."""
        if self._train_sampler is not None:
            return {"train_sampler": self._train_sampler.state_dict()}
        if self._pending_state is not None:
            return {"train_sampler": dict(self._pending_state)}
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = state_dict.get("train_sampler")
        if state is None:
            return
        if self._train_sampler is not None:
            self._train_sampler.load_state_dict(state)
        else:  # Lightning restores the datamodule before it asks for dataloaders
            self._pending_state = dict(state)


class SFTDataModule(ChatDataModule):
    """SFT conversations; batches from :func:`collate_sft` (or :func:`collate_packed` with packing)."""

    record_kind = "sft"
    supports_packing = True

    def encode(self, record: SFTExample, stats):
        return encode_sft(self.tokenizer, record, stats=stats, **self._encode_kwargs())

    def pack(self, items):
        rows = pack_greedy([len(e.input_ids) for e in items], self.pack_length or self.max_length)
        return [[items[i] for i in row] for row in rows]

    def collate(self, items):
        if self.packing:
            return collate_packed(items, self.pad_token_id)
        return collate_sft(items, self.pad_token_id)


class PreferenceDataModule(ChatDataModule):
    """Preference pairs (:func:`collate_pairs`, packable) or K-way rankings (:func:`collate_rankings`).

    The record type decides: every record of a split must be a ``PreferencePair`` or every one a ``Ranking``.

    Args:
        prefix_sharing: ``"auto"`` (default), ``True`` or ``False``: batches in the prefix-shared layout
            (:mod:`lrlhf.data.shared_batches`: each pair's or ranking's common prefix, the prompt at least, encoded
            once, one row per pair). ``"auto"`` shares when prefixes hold at least ``AUTO_MIN_SHARE`` of the training
            split's tokens (measured at setup, in ``prefix_shares`` and the data report). Never with ``packing``.
        Others: :class:`ChatDataModule`'s.
    """

    record_kind = PREFERENCE_KINDS  # a source is read as pairs or, failing that, as rankings
    supports_packing = True

    def __init__(self, tokenizer: Any, *, prefix_sharing: bool | str = "auto", **kwargs):
        super().__init__(tokenizer, **kwargs)
        if prefix_sharing not in PREFIX_SHARING:
            raise ValueError(f"data.prefix_sharing={prefix_sharing!r}; choose auto, true or false")
        if prefix_sharing is True and self.packing:
            raise ValueError("data.prefix_sharing=true and data.packing=true exclude each other: choose one")
        self.prefix_sharing = prefix_sharing
        self.prefix_shares: dict[str, float] = {}  # per split: the fraction of tokens sharing saves

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        for split, items in self.datasets.items():
            kinds = sorted({type(item).__name__ for item in items})
            if len(kinds) > 1:
                raise ValueError(f"{split} split mixes {' and '.join(kinds)}; use one record type")
            if not self.packing and split not in self.prefix_shares:
                self.prefix_shares[split] = share = round(prefix_share(items), 4)
                self.reports.setdefault(split, {})["prefix_share"] = share

    @property
    def shares_prefixes(self) -> bool:
        """Whether batches come in the prefix-shared layout (decided on the training split's share, else the
        first split set up, so every split of a run has one layout)."""
        if self.packing or self.prefix_sharing is False:
            return False
        if self.prefix_sharing is True:
            return True
        share = self.prefix_shares.get("train", next(iter(self.prefix_shares.values()), 0.0))
        return share >= AUTO_MIN_SHARE

    def encode(self, record, stats):
        kw = self._encode_kwargs()
        if isinstance(record, PreferencePair):
            return encode_pair(self.tokenizer, record, stats=stats, **kw)
        if isinstance(record, Ranking):
            if self.packing:
                raise ValueError("packing=True supports preference pairs, not rankings")
            return encode_ranking(self.tokenizer, record, stats=stats, **kw)
        raise TypeError(f"PreferenceDataModule takes PreferencePair or Ranking records, got {type(record)}")

    def pack(self, items):
        # A pair stays in one row (chosen then rejected), so its two sequences share the batch row.
        lengths = [len(p.chosen.input_ids) + len(p.rejected.input_ids) for p in items]
        rows = pack_greedy(lengths, self.pack_length or 2 * self.max_length)
        return [[items[i] for i in row] for row in rows]

    def collate(self, items):
        if self.packing:
            return collate_packed_pairs(items, self.pad_token_id)
        if self.shares_prefixes:
            if isinstance(items[0], EncodedRanking):
                return collate_shared_rankings(items, self.pad_token_id)
            return collate_shared_pairs(items, self.pad_token_id)
        if isinstance(items[0], EncodedRanking):
            return collate_rankings(items, self.pad_token_id)
        return collate_pairs(items, self.pad_token_id)


class PromptDataModule(ChatDataModule):
    """RL / evaluation prompts, left-padded (:func:`collate_prompts`); ``max_length`` bounds the prompt."""

    record_kind = "prompt"

    def encode(self, record: PromptExample, stats):
        kw = self._encode_kwargs()
        kw.pop("loss_on")
        return encode_prompt(self.tokenizer, record, stats=stats, **kw)

    def collate(self, items):
        return collate_prompts(items, self.pad_token_id)


__all__ = [
    "ChatDataModule",
    "PreferenceDataModule",
    "PromptDataModule",
    "SFTDataModule",
    "load_tokenizer",
]
