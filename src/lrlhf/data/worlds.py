"""Worlds: where a run's data comes from (``world=toy|hh_rlhf|files``), each an object chosen by ``_target_``.

A world is built once into ``<paths.cache_dir>/worlds/<key>/`` with one file layout that every recipe reads
(``${world.dir}/<file>``), so a recipe runs unchanged on any world:

=====================  ==========================================================================================
``sft_train|val``      demonstrations (SFT)
``pref_train|val``     preference pairs (or rankings) for the proxy reward model
``pref_test``          held-out pairs: the reward model's test accuracy
``judge_train|val``    a disjoint part of the preferences: the **held-out judge** RM (``recipe=judge_rm``), used by
                       early stopping and the evaluations where there is no gold utility (Gao et al., 2022)
``rl_prompts``         RL prompts
``eval_prompts``       held-out prompts of the final evaluation (in no other file)
``world.json``         what was built, from what, with the counts of every file and of every drop
=====================  ==========================================================================================

Every prompt, and every group (a record's ``group`` or ``message_tree_id``: one conversation tree), sits in one
split only (:func:`lrlhf.data.splits.split_by_prompt`); the SFT validation prompts,
which early stopping samples on, are neither RL nor evaluation prompts. A world also names its ``judge``
(``eval.judge`` and ``callbacks.early_stopping.utility`` default to it): the toy world's gold utility, or for data
without gold the judge RM. ``has_gold`` tells whether the world has a gold utility (only the toy world does).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lrlhf.data.records import PREFERENCE_KINDS, PreferencePair, PromptExample, Ranking, SFTExample
from lrlhf.data.splits import dedup_pairs, dedup_prompts, group_of, normalise_prompt, prompt_of, split_by_prompt
from lrlhf.data.summary import DataSummary

#: The files every world writes (a toy world writes rankings and its model too).
LAYOUT = ("sft_train", "sft_val", "pref_train", "pref_val", "pref_test", "judge_train", "judge_val",
          "rl_prompts", "eval_prompts")
#: The splits of the preference file, in order: shares of its prompts.
PREFERENCE_SPLITS = ("pref_train", "pref_val", "pref_test", "judge_train", "judge_val", "eval")


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:10]


def _file_identity(path: str | None) -> dict | None:
    if path is None:
        return None
    p = Path(path).expanduser()
    if not p.is_file():
        return {"path": str(p)}  # a hub dataset name, or missing (then check() says so)
    stat = p.stat()
    return {"path": str(p.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


@dataclass
class ToyWorld:
    """The embedded toy world (docs/toy_world.md): gold utility, simulated annotators, a tiny model."""

    seed: int = 0
    sizes: dict = field(default_factory=dict)
    judge: str = "toy_gold"
    name: str = "toy"

    has_gold = True
    has_model = True  # model=toy loads ${world.dir}/model

    def key(self) -> str:
        content = {**self.sizes, "layout": 2}  # layout 2: with the judge files
        return f"seed{self.seed}-{hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:10]}"

    def check(self) -> None:
        from lrlhf.data.toy import WorldSizes

        WorldSizes(**self.sizes)

    def build(self, out: Path) -> None:
        from lrlhf.data.toy import WorldConfig, WorldSizes, build_world
        from lrlhf.data.toy.world import judge_records
        from lrlhf.utils.io import write_json_lines

        sizes = WorldSizes(**self.sizes)
        Path(out).mkdir(parents=True, exist_ok=True)
        for name, records in judge_records(WorldConfig(seed=self.seed, sizes=sizes)).items():
            write_json_lines(Path(out) / f"{name}.jsonl", records)
        build_world(out, seed=self.seed, sizes=sizes)  # its world.json last: the mark of a complete world

    def describe(self) -> str:
        return "the toy world"


@dataclass
class FilesWorld:
    """A world from your own files: a preference (or ranking) file, and optionally an SFT file and a prompt file.

    The preference file's prompts are split by a seeded hash into ``fractions`` (:data:`PREFERENCE_SPLITS`);
    ``limits`` caps the records of any file (a short CPU run). Without ``sft``, the SFT data are each
    ``pref_train`` / ``pref_val`` prompt with its preferred answer (a pair's chosen side when its target is above
    0.5; a ranking's best). Without ``prompts``, the RL prompts are the ``pref_train`` prompts. An SFT or prompt
    file's records whose prompt is an evaluation or judge prompt are removed (counted in world.json).
    """

    preferences: str
    sft: str | None = None
    prompts: str | None = None
    fractions: dict = field(default_factory=lambda: {
        "pref_train": 0.5, "pref_val": 0.05, "pref_test": 0.1, "judge_train": 0.2, "judge_val": 0.03, "eval": 0.12})
    limits: dict = field(default_factory=dict)
    seed: int = 0
    judge: str = "rm:judge"
    name: str = "files"

    has_gold = False
    has_model = False

    def __post_init__(self):
        unknown = sorted(set(self.fractions) - set(PREFERENCE_SPLITS))
        if unknown:
            raise ValueError(f"world.fractions: unknown split(s) {unknown}; the splits are {list(PREFERENCE_SPLITS)}")
        self.fractions = {name: float(self.fractions.get(name, 0.0)) for name in PREFERENCE_SPLITS}
        total = sum(self.fractions.values())
        if any(v < 0 for v in self.fractions.values()) or abs(total - 1.0) > 1e-6:
            raise ValueError(f"world.fractions must be shares >= 0 summing to 1, got {self.fractions} (sum {total})")
        for split in ("pref_train", "pref_test", "judge_train", "eval"):
            if self.fractions[split] <= 0:
                raise ValueError(f"world.fractions.{split} must be above 0: the world needs that split")
        bad = {k: v for k, v in self.limits.items() if k not in (*LAYOUT, "eval")
               or (v is not None and (not isinstance(v, int) or v < 1))}
        if bad:
            raise ValueError(f"world.limits: {bad}: a limit is a file of {list(LAYOUT)} and a count >= 1 (or null)")

    def key(self) -> str:
        content = {k: v for k, v in asdict(self).items() if k not in ("judge",)}
        content["files"] = [_file_identity(p) for p in (self.preferences, self.sft, self.prompts)]
        content["splits"] = "groups"  # #36: a record's group keeps its tree in one split (worlds before: by prompt)
        return f"{self.name}-{_digest(content)}"

    def check(self) -> None:
        """Each named local file exists (a bad path fails before anything is built, naming the key)."""
        for key in ("preferences", "sft", "prompts"):
            value = getattr(self, key)
            if value is None:
                continue
            path = Path(value).expanduser()
            looks_local = path.suffix in (".json", ".jsonl", ".gz", ".parquet") or value.startswith((".", "/", "~"))
            if looks_local and not path.is_file():
                where = "" if path.is_absolute() else f" ({path.resolve()})"
                raise FileNotFoundError(f"world.{key}={value!r}: no such file{where}")

    def describe(self) -> str:
        return f"the {self.name} world from {self.preferences}"

    # ------------------------------------------------------------------------------------------------ build
    def build(self, out: Path) -> None:
        from lrlhf.data.formats import load_records, write_jsonl

        report: dict[str, Any] = {"world": self.name, "config": asdict(self), "sources": {}}
        records, summary = load_records(self.preferences, PREFERENCE_KINDS, verbose=False)
        pairs = [r for r in records if isinstance(r, PreferencePair)]
        deduped = dedup_pairs(pairs, summary) if pairs else []
        records = deduped + [r for r in records if isinstance(r, Ranking)]
        report["sources"]["preferences"] = summary.as_dict()
        parts = split_by_prompt(records, self.fractions, seed=self.seed)
        files: dict[str, list] = {name: self._limit(name, parts[name]) for name in PREFERENCE_SPLITS
                                  if name != "eval"}
        held_out = {normalise_prompt(prompt_of(r)) for name in ("eval", "judge_train", "judge_val")
                    for r in parts[name]}
        held_out |= {group for name in ("eval", "judge_train", "judge_val") for r in parts[name]
                     if (group := group_of(r)) is not None}
        eval_prompts = dedup_prompts([PromptExample(prompt_of(r), meta=dict(r.meta)) for r in parts["eval"]])
        files["eval_prompts"] = self._limit("eval_prompts", eval_prompts)

        if self.sft is None:
            files["sft_train"] = self._limit("sft_train", _demonstrations(files["pref_train"]))
            files["sft_val"] = self._limit("sft_val", _demonstrations(files["pref_val"]))
        else:
            sft, sft_summary = load_records(self.sft, "sft", verbose=False)
            sft = self._without(sft, held_out, sft_summary)
            split = split_by_prompt(sft, {"train": 0.95, "val": 0.05}, seed=self.seed)
            files["sft_train"] = self._limit("sft_train", split["train"])
            files["sft_val"] = self._limit("sft_val", split["val"] or split["train"][-1:])
            report["sources"]["sft"] = sft_summary.as_dict()
        sft_val = {normalise_prompt(prompt_of(r)) for r in files["sft_val"]}  # early stopping's prompts
        if self.prompts is None:
            rl = [PromptExample(prompt_of(r), meta=dict(r.meta)) for r in files["pref_train"]]
            rl_summary = DataSummary(source="pref_train prompts", kind="prompt", read=len(rl))
        else:
            rl, rl_summary = load_records(self.prompts, "prompt", verbose=False)
            rl = self._without(rl, held_out, rl_summary)
        rl = [r for r in dedup_prompts(rl, rl_summary) if normalise_prompt(r.prompt) not in sft_val]
        files["rl_prompts"] = self._limit("rl_prompts", rl)
        report["sources"]["rl_prompts"] = rl_summary.as_dict()

        out.mkdir(parents=True, exist_ok=True)
        for name, rows in files.items():
            if not rows:
                raise ValueError(f"world={self.name}: the {name} file would be empty (world.fractions "
                                 f"{self.fractions}, world.limits {self.limits}); give it a larger share or more data")
            write_jsonl(rows, out / f"{name}.jsonl")
        report["files"] = {name: len(rows) for name, rows in files.items()}
        groups = {name: len({g for r in rows if (g := group_of(r)) is not None}) for name, rows in files.items()}
        if any(groups.values()):  # each group sits in one split (lrlhf.data.splits.split_keys)
            report["groups"] = groups
        (out / "world.json").write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")

    def _limit(self, name: str, rows: list) -> list:
        limit = self.limits.get(name)
        return rows if limit is None else rows[:limit]

    @staticmethod
    def _without(records: list, held_out: set[str], summary: DataSummary) -> list:
        """``records`` less those whose prompt or group is in ``held_out``."""
        kept = [r for r in records if normalise_prompt(prompt_of(r)) not in held_out and group_of(r) not in held_out]
        if len(kept) < len(records):
            summary.drop("held_out_prompt", len(records) - len(kept))
        return kept


def _demonstrations(records: list) -> list[SFTExample]:
    """Each prompt with its preferred answer: a pair's chosen side when it won (target above 0.5), a ranking's
    best; ties and lost pairs give none."""
    out, seen = [], set()
    for r in records:
        key = normalise_prompt(r.prompt)
        if key in seen:
            continue
        if isinstance(r, PreferencePair):
            best = r.chosen if r.target > 0.5 else r.rejected if r.target < 0.5 else None
        else:
            best = r.completions[min(range(len(r.ranks)), key=r.ranks.__getitem__)]
        if best:
            seen.add(key)
            out.append(SFTExample([*r.prompt, *best], meta={k: v for k, v in r.meta.items() if k != "target"}))
    return out


__all__ = ["LAYOUT", "PREFERENCE_SPLITS", "FilesWorld", "ToyWorld"]
