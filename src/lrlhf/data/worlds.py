"""Worlds: where a run's data comes from (``world=toy|hh_rlhf|files|gsm8k|constraints|sentiment``), each an object
chosen by ``_target_`` (``constraints``: :mod:`lrlhf.data.constraints`; ``sentiment``: :mod:`lrlhf.data.sentiment`,
whose preference pairs a ``pairs`` stage draws from the SFT policy).

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

:class:`GSM8KWorld` is a world of problems with reference answers and no preferences (RLVR): it writes the prompt and
SFT files alone, each record carrying its reference answer, and its judge is a math verifier (exact-answer rate).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lrlhf.data.records import PREFERENCE_KINDS, PreferencePair, PromptExample, Ranking, SFTExample
from lrlhf.data.splits import dedup_pairs, dedup_prompts, group_of, normalise_prompt, prompt_of, split_by_prompt
from lrlhf.data.summary import DataSummary
from lrlhf.utils.io import file_sha256

#: The files every world writes (a toy world writes rankings and its model too).
LAYOUT = ("sft_train", "sft_val", "pref_train", "pref_val", "pref_test", "judge_train", "judge_val",
          "rl_prompts", "eval_prompts")
#: The splits of the preference file, in order: shares of its prompts.
PREFERENCE_SPLITS = ("pref_train", "pref_val", "pref_test", "judge_train", "judge_val", "eval")


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:10]


#: A file's content digest by (path, size, mtime): a key is computed several times a run, a file hashed once.
_CONTENT_DIGESTS: dict[tuple, str] = {}


def _file_identity(path: str | None) -> dict | None:
    """What a source file contributes to a world's key: its size and the SHA-256 of its bytes. The content, not the
    modification time: the same data copied to a new machine or a fresh checkout keeps its world (and every stage
    built on it); an edited file gets a new one. The path itself is in the key through the world's settings."""
    if path is None:
        return None
    p = Path(path).expanduser()
    if not p.is_file():
        return {"path": str(p)}  # a hub dataset name, or missing (then check() says so)
    stat = p.stat()
    seen = (str(p.resolve()), stat.st_size, stat.st_mtime_ns)
    if seen not in _CONTENT_DIGESTS:
        _CONTENT_DIGESTS[seen] = file_sha256(p)
    return {"size": stat.st_size, "sha256": _CONTENT_DIGESTS[seen]}


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
        content["splits"] = "groups"  # a record's group keeps its tree in one split (worlds before: by prompt)
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
        summary.labelled = sum(p.labelled for p in deduped)  # people's labels that reach the splits
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


class PromptWorld:
    """What the worlds of prompts with a checkable record and no preferences share (:class:`GSM8KWorld`,
    :class:`lrlhf.data.constraints.ConstraintsWorld`): four files, ``limits`` on them, a key over the config and the
    source files (``SOURCES``: the fields naming them), the sources checked before anything is built, and the files
    written with ``world.json``. A subclass is a dataclass with ``limits``, ``name`` and ``judge`` fields."""

    has_gold = False
    has_model = False
    FILES = ("sft_train", "sft_val", "rl_prompts", "eval_prompts")
    SOURCES: tuple[str, ...] = ()

    def _check_limits(self) -> None:
        bad = {k: v for k, v in self.limits.items() if k not in self.FILES
               or (v is not None and (not isinstance(v, int) or v < 1))}
        if bad:
            raise ValueError(f"world.limits: {bad}: a limit is a file of {list(self.FILES)} and a count >= 1 (or null)")

    def key(self) -> str:
        content = {k: v for k, v in asdict(self).items() if k != "judge"}
        content["files"] = [_file_identity(getattr(self, k)) for k in self.SOURCES]
        return f"{self.name}-{_digest(content)}"

    def check(self) -> None:
        """Every source file given exists (a bad path fails before anything is built, naming the key)."""
        for key in self.SOURCES:
            value = getattr(self, key)
            if value is not None and not Path(value).expanduser().is_file():
                raise FileNotFoundError(f"world.{key}={value!r}: no such file ({Path(value).expanduser().resolve()})")

    def _write(self, out: Path, files: dict[str, list], **report: Any) -> None:
        """The files (each cut to its limit) and ``world.json`` with ``report``'s figures."""
        from lrlhf.data.formats import write_jsonl

        files = {name: rows if self.limits.get(name) is None else rows[:self.limits[name]]
                 for name, rows in files.items()}
        out.mkdir(parents=True, exist_ok=True)
        for name, rows in files.items():
            write_jsonl(rows, out / f"{name}.jsonl")
        report = {"world": self.name, "config": asdict(self), **report,
                  "files": {name: len(rows) for name, rows in files.items()}}
        (out / "world.json").write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")


def instruction_sources(alpaca: str | None, self_instruct: str | None) -> list[tuple[str, str]]:
    """``(instruction, answer)`` of every instruction without an input, in file order, duplicates dropped:
    ``alpaca`` (LLaMA-Factory's alpaca sample, a JSON list ``{instruction, input, output}``) and ``self_instruct``
    (the self-instruct seed tasks, JSON lines ``{instruction, instances: [{input, output}]}``: its first instance);
    either may be None."""
    out, seen = [], set()
    if alpaca is not None:
        for row in json.loads(Path(alpaca).expanduser().read_text(encoding="utf-8")):
            if not row.get("input", "").strip():
                out.append((row["instruction"], row.get("output", "")))
    if self_instruct is not None:
        for line in Path(self_instruct).expanduser().read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                first = (row.get("instances") or [{}])[0]
                if not first.get("input", "").strip():
                    out.append((row["instruction"], first.get("output", "")))
    return [(p, a) for p, a in out if p.strip() and not (p in seen or seen.add(p))]


@dataclass
class GSM8KWorld(PromptWorld):
    """GSM8K (grade-school math word problems, ``{"question", "answer"}`` JSON lines, plain or gzip; the answer a
    worked solution whose last line is ``#### <number>``) as a world for a verifiable reward: every prompt record
    carries its problem's ``answer`` field in ``meta`` (``reward=math`` and the judge read the reference there,
    :mod:`lrlhf.data.math_answers`). No preference files: its recipes need no reward model (``recipe=grpo_gsm8k``).

    Files: ``rl_prompts`` (the ``train`` problems less ``val_problems`` of them, drawn with ``seed``), ``sft_train``
    (the same problems with their worked solution, calculator notes ``<<48/2=24>>`` removed), ``sft_val`` (the
    ``val_problems`` held out: early stopping's and the sample table's prompts), ``eval_prompts`` (the ``test``
    problems: the final held-out exact-answer rate). ``template`` turns a question into the user turn (``{question}``).
    ``limits`` caps a file's records (a short CPU run).
    """

    train: str
    test: str
    template: str = '{question}\nLet\'s think step by step and output the final answer after "####".'
    val_problems: int = 64
    limits: dict = field(default_factory=dict)
    seed: int = 0
    judge: str = "lrlhf.data.math_answers:math_answer_judge"
    name: str = "gsm8k"

    SOURCES = ("train", "test")

    def __post_init__(self):
        if "{question}" not in self.template:
            raise ValueError(f"world.template must hold {{question}}, got {self.template!r}")
        if self.val_problems < 1:
            raise ValueError(f"world.val_problems must be >= 1 (early stopping's prompts), got {self.val_problems}")
        self._check_limits()

    def describe(self) -> str:
        return f"the {self.name} world from {self.train} and {self.test}"

    def build(self, out: Path) -> None:
        train, test = _problems(self.train), _problems(self.test)
        if len(train) <= self.val_problems:
            raise ValueError(f"world.train={self.train!r} has {len(train)} problems: more than world.val_problems="
                             f"{self.val_problems} are needed")
        order = list(range(len(train)))
        random.Random(self.seed).shuffle(order)
        held, rest = sorted(order[:self.val_problems]), sorted(order[self.val_problems:])
        files = {"rl_prompts": [self._prompt(train[i]) for i in rest],
                 "sft_train": [self._demonstration(train[i]) for i in rest],
                 "sft_val": [self._demonstration(train[i]) for i in held],
                 "eval_prompts": [self._prompt(problem) for problem in test]}
        self._write(out, files, sources={"train": len(train), "test": len(test)})

    def _prompt(self, problem: dict) -> PromptExample:
        return PromptExample([{"role": "user", "content": self.template.format(question=problem["question"])}],
                             meta={"answer": problem["answer"]})

    def _demonstration(self, problem: dict) -> SFTExample:
        solution = re.sub(r"<<[^>]*>>", "", problem["answer"])  # the calculator notes are not text to imitate
        return SFTExample([*self._prompt(problem).prompt, {"role": "assistant", "content": solution}],
                          meta={"answer": problem["answer"]})


def _problems(path: str) -> list[dict]:
    """The ``{"question", "answer"}`` rows of a JSON-lines file (gzip when its name ends in ``.gz``); an error names
    the file and the line."""
    opener = gzip.open if str(path).endswith(".gz") else open
    rows = []
    with opener(Path(path).expanduser(), "rt", encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not JSON ({err})") from None
            missing = [k for k in ("question", "answer") if not isinstance(row.get(k), str) or not row[k].strip()]
            if missing:
                raise ValueError(f"{path}:{number}: field(s) {missing} missing or not text; a problem is "
                                 '{"question": str, "answer": str} (GSM8K)')
            rows.append(row)
    return rows


__all__ = ["LAYOUT", "PREFERENCE_SPLITS", "FilesWorld", "GSM8KWorld", "PromptWorld", "ToyWorld"]
