"""Iterative RLHF (``recipe=iterative_ppo``): label the current policy's samples, refresh the RM, continue PPO.

Round ``r = 1..R`` (``rounds.settings.n``) lives in ``<run folder>/round_<r>/``; the settings are
``rounds.settings.*`` (:class:`Rounds`), the annotator ``rounds.annotator`` (:mod:`lrlhf.eval.annotators`):

1. ``labels.jsonl``: round 1 takes the first ``initial_labels`` pairs of the world's ``pref_train`` (labelled on the
   world's SFT-era candidates). A later round first draws its pairs (``pairs.jsonl``): ``samples_per_prompt``
   responses of the previous round's policy to each next fresh prompt (``pref_train`` prompts round 1 did not use, in
   file order, from where the previous round stopped; never an evaluation prompt), distinct ones paired
   (``pairs_per_prompt`` per prompt), until ``labels_per_round`` pairs; then the annotator labels them.
2. ``rm/``: the reward model (``recipe=rm``) on every round's labels so far (``replay``: the fraction of an earlier
   round's labels kept, a seeded subset), from the SFT model (``rm_init=sft``) or continuing the previous round's
   (``previous``). The RM stage calibrates it on the world's fixed held-out preference completions, the same in every
   round, so a calibrated reward of 0 means the same to PPO in every round (mean and std logged).
3. ``ppo/``: PPO (this recipe's module) with that reward model for ``ppo_steps`` optimiser steps, from the previous
   round's policy: its adapter continued on the SFT base, the reference staying SFT (``reference=sft``), or its
   merged weights as the new base and reference (``previous``).
4. ``figures.json``: held-out gold (the world's judge) and the PPO stage's comparison with its reference, KL, labels,
   the calibrated proxy, and the reward models' pairwise accuracy against the world's judge on held-out samples of the
   policy the round started from (this round's RM: after the refresh; the previous round's: before) and of the
   policy PPO made (:mod:`lrlhf.eval.round_figures`).

Every step writes atomically and is skipped once done, so ``ckpt_path=last`` resumes a killed run at the round and
step where it stopped (a PPO stage from its last checkpoint). ``rounds.json``, ``rounds.md`` and ``rounds.png`` (gold
and proxy across rounds) sum it up; the final policy is ``round_<R>/ppo/export``.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from lrlhf.eval.annotators import Pair, preference_record
from lrlhf.eval.round_figures import (
    HeldOut,
    held_out_prompts,
    held_out_samples,
    pair_accuracy,
    per_prompt,
    policy,
    rm_scorer,
    write_report,
)
from lrlhf.run.planning import check_resume, compose_recipe, needed_overrides
from lrlhf.run.training import at_folder, fit_stage
from lrlhf.utils.io import atomic_write_text, swap_folder_in, write_json_lines

RM_INITS = ("sft", "previous")
REFERENCES = ("sft", "previous")


@dataclass
class Rounds:
    """The loop's settings (``rounds.*`` of ``recipe=iterative_ppo``); the annotator is ``rounds.annotator``."""

    n: int = 2
    """R: rounds, each one RM refresh and one PPO stage."""
    initial_labels: int = 6000
    """Pairs of the world's ``pref_train`` the first RM learns from (its first N lines)."""
    labels_per_round: int = 2000
    """The labelling budget of each later round (on-policy pairs)."""
    samples_per_prompt: int = 8
    """K responses sampled per fresh prompt, of which distinct ones are paired."""
    pairs_per_prompt: int = 4
    """Pairs labelled per fresh prompt (at most)."""
    ppo_steps: int | list[int] = 160
    """Optimiser steps of each round's PPO stage (a multiple of the steps one rollout makes), or one per round."""
    replay: float = 1.0
    """Fraction of each earlier round's labels the refreshed RM learns from again (1: the union of all)."""
    rm_init: str = "sft"
    """``sft``: each round's RM is trained from the SFT model; ``previous``: it continues the previous round's."""
    rm_steps: int | None = None
    """Optimiser steps of each RM stage; null: the RM recipe's (``hparams.rm.max_steps``)."""
    reference: str = "sft"
    """``sft``: the policy adapter continues on the SFT base, the reference stays SFT; ``previous``: the previous
    round's merged policy is the base and the reference."""
    seed: int = 0
    """Sampling and replay subsets (the run's ``seed``)."""

    def __post_init__(self):
        for key in ("n", "samples_per_prompt", "pairs_per_prompt"):
            least = 2 if key == "samples_per_prompt" else 1
            if getattr(self, key) < least:
                raise ValueError(f"rounds.settings.{key} must be >= {least}, got {getattr(self, key)}")
        steps = self.ppo_steps if isinstance(self.ppo_steps, list) else [self.ppo_steps] * self.n
        if len(steps) != self.n or min(steps) < 1:
            raise ValueError(f"rounds.settings.ppo_steps must be one number >= 1 or {self.n} of them (one per round, "
                             f"rounds.settings.n={self.n}), got {self.ppo_steps}")
        if self.initial_labels < 1 or self.labels_per_round < 0:
            raise ValueError(f"rounds.settings.initial_labels must be >= 1 and rounds.settings.labels_per_round >= 0, "
                             f"got {self.initial_labels} and {self.labels_per_round}")
        if not 0.0 <= self.replay <= 1.0:
            raise ValueError(f"rounds.settings.replay must be in [0, 1], got {self.replay}")
        if self.rm_init not in RM_INITS:
            raise ValueError(f"rounds.settings.rm_init must be one of {RM_INITS}, got {self.rm_init!r}")
        if self.reference not in REFERENCES:
            raise ValueError(f"rounds.settings.reference must be one of {REFERENCES}, got {self.reference!r}")
        if self.pairs_per_prompt > self.samples_per_prompt * (self.samples_per_prompt - 1) // 2:
            raise ValueError(f"rounds.settings.pairs_per_prompt={self.pairs_per_prompt}: {self.samples_per_prompt} "
                             "samples per prompt (rounds.settings.samples_per_prompt) make at most "
                             f"{self.samples_per_prompt * (self.samples_per_prompt - 1) // 2} distinct pairs")
        if self.rm_steps is not None and self.rm_steps < 1:
            raise ValueError(f"rounds.settings.rm_steps must be >= 1 or null, got {self.rm_steps}")

    def steps(self, r: int) -> int:
        """PPO optimiser steps of round ``r`` (1-based)."""
        return self.ppo_steps[r - 1] if isinstance(self.ppo_steps, list) else self.ppo_steps


# ------------------------------------------------------------------------------------------- labels
def _key(prompt) -> str:
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False)


def prompt_pool(pref_train: Path, initial_labels: int, eval_prompts: Path) -> tuple[list[dict], list]:
    """``(initial pair lines, fresh prompts)``: the first ``initial_labels`` lines of ``pref_train`` and, as
    :class:`~lrlhf.data.records.PromptExample`, the prompts of the other lines that none of those has, in file
    order, each once (the meta of a pair, e.g. its ``both_bad``, is not the prompt's: only a toy ``task`` is
    kept). A prompt of ``eval_prompts`` among them is an error (labels never see a held-out prompt)."""
    from lrlhf.data.formats import PREFERENCE_KINDS, load_records
    from lrlhf.data.records import PromptExample

    lines = _read_jsonl(pref_train)
    if len(lines) < initial_labels:
        raise ValueError(f"rounds.settings.initial_labels={initial_labels}, but {pref_train} holds {len(lines)} pairs")
    records, _ = load_records(str(pref_train), PREFERENCE_KINDS, verbose=False, drop_identical=False)
    held_out = {_key(p.prompt) for p in load_records(str(eval_prompts), "prompt", verbose=False)[0]}
    seen = {_key(r.prompt) for r in records[:initial_labels]}
    fresh = []
    for record in records[initial_labels:]:
        key = _key(record.prompt)
        if key in held_out:
            raise ValueError(f"{pref_train}: a preference prompt is also in {eval_prompts}; the rounds would label "
                             "a held-out prompt")
        if key not in seen:
            seen.add(key)
            meta = {k: v for k, v in record.meta.items() if k == "task"}  # a pair's other fields are not the prompt's
            fresh.append(PromptExample(record.prompt, meta=meta))
    return lines[:initial_labels], fresh


def on_policy_pairs(model, tokenizer, prompts: list, sampling, *, samples_per_prompt: int, pairs_per_prompt: int,
                    budget: int, seed: str) -> tuple[list[Pair], int]:
    """``(pairs, prompts used)``: ``budget`` pairs of distinct responses of ``model`` (fewer only when ``prompts`` run
    out), at most ``pairs_per_prompt`` per prompt, taken from ``prompts`` in order, in blocks (a prompt whose
    ``samples_per_prompt`` samples are all one text gives none, so a block may leave the budget short); each pair's
    order is drawn with ``seed``. Iterative RLHF's rounds and the ``pairs`` stage (:mod:`lrlhf.run.pairs`) draw
    their pairs here."""
    import dataclasses

    from lrlhf.models.generation import generate_responses

    k = samples_per_prompt
    block = max(1, math.ceil(budget / pairs_per_prompt))
    rng = random.Random(seed)
    pairs, used = [], 0
    while len(pairs) < budget and used < len(prompts):
        chunk = prompts[used:used + block]
        texts = generate_responses(model, tokenizer, [p for p in chunk for _ in range(k)],
                                   dataclasses.replace(sampling, seed=sampling.seed + used), batch_size=64)
        for i, prompt in enumerate(chunk):
            used += 1
            distinct = list(dict.fromkeys(texts[i * k:(i + 1) * k]))
            options = [(a, b) for a in range(len(distinct)) for b in range(a + 1, len(distinct))]
            for a, b in rng.sample(options, min(pairs_per_prompt, len(options))):
                if rng.random() < 0.5:
                    a, b = b, a
                pairs.append(Pair(prompt, distinct[a], distinct[b]))
            if len(pairs) >= budget:
                break
    return pairs[:budget], used


def replayed(lines: list[dict], fraction: float, seed: str) -> list[dict]:
    """A seeded subset of ``round(fraction * len(lines))`` lines, in their order."""
    if fraction >= 1.0:
        return lines
    keep = sorted(random.Random(seed).sample(range(len(lines)), round(fraction * len(lines))))
    return [lines[i] for i in keep]


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_start(cfg: DictConfig, run_dir: Path) -> tuple[list[dict], list, int]:
    """Before any stage is built (the world is): refuse a second launch into a run folder that holds rounds
    (without ``ckpt_path``) and a prompt pool too small for the rounds. Returns ``prompt_pool``'s two lists and
    the fresh prompts of a round."""
    from hydra.utils import instantiate

    rounds: Rounds = instantiate(cfg.rounds.settings, _convert_="all")
    devices = cfg.trainer.get("devices", 1)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or (isinstance(devices, int) and devices > 1) or (
            not isinstance(devices, (int, str)) and len(devices) > 1):
        raise ValueError(f"recipe=iterative_ppo runs on one process (trainer.devices={devices}, WORLD_SIZE="
                         f"{os.environ.get('WORLD_SIZE', '1')}): its rounds write one run folder; launch it on one")
    why = {"reference": "PPO attaches it to the policy's base, which would be the previous policy",
           "rm_init": "continuing one from its folder is not supported"}
    for key, value in (("reference", rounds.reference), ("rm_init", rounds.rm_init)):
        if value == "previous" and OmegaConf.select(cfg, "hparams.rm.lora") is not None:
            raise ValueError(f"rounds.settings.{key}=previous needs a fully fine-tuned reward model, but "
                             f"hparams.rm.lora is set (a LoRA RM is an adapter of the SFT base: {why[key]}); use "
                             f"rounds.settings.{key}=sft")
    if cfg.get("ckpt_path") is None and (run_dir / "round_1").exists():
        raise ValueError(f"{run_dir} holds rounds of an earlier run: resume it with ckpt_path=last, or choose "
                         "another hydra.run.dir")
    initial, fresh = prompt_pool(Path(cfg.world.dir) / "pref_train.jsonl", rounds.initial_labels,
                                 Path(cfg.eval.prompts))
    per_round = math.ceil(rounds.labels_per_round / rounds.pairs_per_prompt)
    if (rounds.n - 1) * per_round > len(fresh):
        raise ValueError(f"rounds: {rounds.n - 1} later rounds x {per_round} fresh prompts (rounds.settings."
                         f"labels_per_round / pairs_per_prompt) need {(rounds.n - 1) * per_round}, but pref_train has "
                         f"{len(fresh)} prompts beyond its first rounds.settings.initial_labels={rounds.initial_labels}"
                         " pairs")
    return initial, fresh, per_round


def held_out_settings(cfg: DictConfig) -> HeldOut:
    """Where and how the rounds' figures sample a policy: the run's ``eval`` node as :class:`HeldOut`."""
    ev = cfg.eval
    return HeldOut(str(ev.prompts), ev.judge, int(ev.max_new_tokens), ev.get("max_prompts"),
                   ev.get("max_prompt_length") or 1024)


# ---------------------------------------------------------------------------------------------- loop
class RoundLoop:
    """Runs the rounds of ``cfg`` (see the module docstring) in ``run_dir``; ``overrides``: the launch's overrides,
    of which the RM stages take the shared ones (:func:`lrlhf.run.planning.needed_overrides`)."""

    def __init__(self, cfg: DictConfig, run_dir: Path, overrides: list[str]):
        from hydra.utils import instantiate

        self.cfg, self.run_dir, self.overrides = cfg, run_dir, list(overrides)
        self.held_out = held_out_settings(cfg)
        self.rounds: Rounds = instantiate(cfg.rounds.settings, _convert_="all")
        self.annotator = instantiate(cfg.rounds.annotator, _convert_="all")
        self.resuming = cfg.get("ckpt_path") is not None

    def folder(self, r: int) -> Path:
        return self.run_dir / f"round_{r}"

    def run(self) -> dict:
        rounds = self.rounds
        initial, fresh, _ = check_start(self.cfg, self.run_dir)
        rows = []
        for r in range(1, rounds.n + 1):
            self.folder(r).mkdir(parents=True, exist_ok=True)
            labels = self.labels(r, initial, fresh)
            rm = self.reward_model(r)
            ppo = self.ppo(r, rm)
            rows.append(self.figures(r, labels, rm, ppo))
        return self.report(rows)

    # ----------------------------------------------------------------- the steps of a round
    def policy_folder(self, r: int) -> str:
        """The policy round ``r`` starts from, merged (round 1: SFT)."""
        return f"{self.cfg.deps.sft}/merged" if r == 1 else str(self.folder(r - 1) / "ppo" / "export" / "merged")

    def labels(self, r: int, initial: list[dict], fresh: list) -> list[dict]:
        """Round ``r``'s labelled pairs (``labels.jsonl``). A later round first draws its pairs (``pairs.jsonl``;
        ``labelling.json``: which fresh prompts it used, from where the previous round stopped), then has them
        labelled: a resumed round (e.g. waiting for people's labels) labels the pairs it drew, never new ones."""
        path = self.folder(r) / "labels.jsonl"
        if path.is_file():
            return _read_jsonl(path)
        if r == 1:
            used = {"prompts_from": 0, "prompts_to": 0}
            atomic_write_text(self.folder(r) / "labelling.json", json.dumps(used) + "\n")
            rows = [{**line, "round": 1} for line in initial]
        else:
            pairs = self.pairs(r, fresh)
            labels = self.annotator.label(pairs, r) if pairs else []
            rows = [preference_record(p, lab, round=r) for p, lab in zip(pairs, labels, strict=True) if lab is not None]
        write_json_lines(path, rows)
        return rows

    def pairs(self, r: int, fresh: list) -> list[Pair]:
        """Round ``r``'s pairs to label, drawn once (``pairs.jsonl``) from the previous round's policy."""
        from lrlhf.data.records import PromptExample
        from lrlhf.models.generation import SamplingConfig

        path = self.folder(r) / "pairs.jsonl"
        if not path.is_file():
            start = json.loads((self.folder(r - 1) / "labelling.json").read_text())["prompts_to"]
            pairs, n = [], 0
            if self.rounds.labels_per_round > 0:
                model, tokenizer = policy(self.policy_folder(r))
                sampling = SamplingConfig(max_new_tokens=self.cfg.module.config.max_new_tokens, temperature=1.0,
                                          seed=self.rounds.seed * 1000 + r)
                pairs, n = on_policy_pairs(
                    model, tokenizer, fresh[start:], sampling, samples_per_prompt=self.rounds.samples_per_prompt,
                    pairs_per_prompt=self.rounds.pairs_per_prompt, budget=self.rounds.labels_per_round,
                    seed=f"lrlhf-rounds:{self.rounds.seed}:{r}:pairs")
            if len(pairs) < self.rounds.labels_per_round:
                print(f"warning: round {r}: {len(pairs)} pairs to label, fewer than rounds.settings.labels_per_round="
                      f"{self.rounds.labels_per_round}: the fresh prompts ran out ({len(fresh)} beyond the initial "
                      "labels)")
            used = {"prompts_from": start, "prompts_to": start + n, "pairs": len(pairs)}
            atomic_write_text(self.folder(r) / "labelling.json", json.dumps(used) + "\n")
            rows = [{"prompt": p.prompt.prompt, "meta": p.prompt.meta, "a": p.a, "b": p.b} for p in pairs]
            write_json_lines(path, rows)
        return [Pair(PromptExample(row["prompt"], meta=row["meta"]), row["a"], row["b"]) for row in _read_jsonl(path)]

    def reward_model(self, r: int) -> Path:
        out = self.folder(r) / "rm"
        if (out / "summary.json").is_file():
            return out
        train = []
        for earlier in range(1, r + 1):
            lines = _read_jsonl(self.folder(earlier) / "labels.jsonl")
            train += lines if earlier == r else replayed(lines, self.rounds.replay, f"{self.rounds.seed}:{r}:{earlier}")
        write_json_lines(self.folder(r) / "rm_train.jsonl", train)
        overrides = [f"data.train={self.folder(r) / 'rm_train.jsonl'}", "logger=none"]
        if self.rounds.rm_steps is not None:
            overrides.append(f"trainer.max_steps={self.rounds.rm_steps}")
        if self.rounds.rm_init == "previous" and r > 1:
            overrides.append(f"module.model.name_or_path={self.folder(r - 1) / 'rm' / 'model'}")
        sub = compose_recipe("rm", needed_overrides(self.cfg, "rm", self.overrides, overrides))
        with open_dict(sub):
            sub.world.dir, sub.deps, sub.logger = self.cfg.world.dir, {"sft": self.cfg.deps.sft}, None
        building = self.folder(r) / ".rm.building"
        shutil.rmtree(building, ignore_errors=True)
        self._stage(at_folder(sub, building), building, out)
        swap_folder_in(building, out)
        return out

    def ppo(self, r: int, rm: Path) -> Path:
        out = self.folder(r) / "ppo"
        if (out / "summary.json").is_file():
            return out
        sub = self.cfg.copy()
        with open_dict(sub):
            sub.stage = "ppo"
            sub.deps.rm = str(rm)
            sub.trainer.max_steps = sub.module.config.total_steps = self.rounds.steps(r)  # a decay per round
            sub.data.seed = self.cfg.seed * 1000 + r  # another prompt order each round
            sub.ckpt_path = "last" if self.resuming and (out / "checkpoints" / "last.ckpt").exists() else None
            if r > 1 and self.rounds.reference == "sft":
                sub.module.init_adapter = str(self.folder(r - 1) / "ppo" / "export" / "adapter")
            elif r > 1:
                sub.module.policy.name_or_path = self.policy_folder(r)
            del sub["rounds"]
        sub = at_folder(sub, out)
        if sub.ckpt_path is None:
            shutil.rmtree(out, ignore_errors=True)  # a start that left no checkpoint
        else:
            check_resume(sub)
        self._stage(sub, out, out)
        return out

    def _stage(self, sub: DictConfig, out: Path, final: Path) -> None:
        """:func:`~lrlhf.run.training.fit_stage`; a stop on a signal names this run's folder to resume (the rounds
        resume as a whole)."""
        try:
            fit_stage(sub, out, final)
        except SystemExit as stop:
            if hasattr(stop, "run_dir") and hasattr(stop, "resume_key"):  # lrlhf.callbacks.TrainingStopped
                stop.run_dir, stop.resume_key = str(self.run_dir), "last"
            raise

    def samples(self, r: int) -> dict:
        """Round ``r``'s final policy's held-out samples, judged (``r = 0``: SFT), cached in the run folder."""
        path = self.run_dir / "heldout_samples" / f"policy_{r}.json"
        if not path.is_file():
            folder = f"{self.cfg.deps.sft}/merged" if r == 0 else str(self.folder(r) / "ppo" / "export" / "merged")
            path.parent.mkdir(exist_ok=True)
            samples = held_out_samples(folder, self.held_out, seed=self.cfg.seed + 7919)
            atomic_write_text(path, json.dumps(samples) + "\n")
        return json.loads(path.read_text())

    def figures(self, r: int, labels: list[dict], rm: Path, ppo: Path) -> dict:
        """Round ``r``'s row: labels, the RM's calibration, the PPO stage's held-out comparison with SFT and KL, and on
        held-out samples judged by the world's judge: the proxy (calibrated RM score) of the round's policy and the
        round's RM's pairwise accuracy on the samples of the policy it was refreshed for (``rm_accuracy_after``) and
        of the policy PPO made with it (``rm_accuracy_end``: the next round's ``before``)."""
        from lrlhf.functional.stats import bootstrap_interval

        path = self.folder(r) / "figures.json"
        if path.is_file():
            return json.loads(path.read_text())
        summary = json.loads((ppo / "summary.json").read_text())
        calibration = json.loads((rm / "model" / "reward_calibration.json").read_text())
        row = {"round": r, "labels": len(labels), "ppo_steps": self.rounds.steps(r),
               "calibration": {k: calibration.get(k) for k in ("mean", "std")},
               **{k: summary[k] for k in summary if k.startswith(("gold/", "judge/", "chosen/", "rollout/", "kl/"))}}
        prompts = held_out_prompts(self.held_out)
        start, end = self.samples(r - 1), self.samples(r)
        score = rm_scorer(rm / "model")
        for name, s in (("after", start), ("end", end)):
            s_a, s_b = score(prompts, s["a"]), score(prompts, s["b"])
            row[f"rm_accuracy_{name}"] = pair_accuracy(s_a, s_b, s["u_a"], s["u_b"])
            if name == "end":
                proxy = per_prompt([(x + y) / 2 for x, y in zip(s_a, s_b, strict=True)])
                row["proxy"] = sum(proxy) / len(proxy)
                row["proxy_interval"] = list(bootstrap_interval(proxy))
        gold = per_prompt([(x + y) / 2 for x, y in zip(end["u_a"], end["u_b"], strict=True)])
        row["judge_samples"], row["judge_samples_interval"] = sum(gold) / len(gold), list(bootstrap_interval(gold))
        if r > 1:
            row["rm_accuracy_before"] = json.loads((self.folder(r - 1) / "figures.json").read_text())["rm_accuracy_end"]
        atomic_write_text(path, json.dumps(row, indent=2, default=str) + "\n")
        return row

    def report(self, rows: list[dict]) -> dict:
        total = 0
        for row in rows:
            total += row["labels"]
            row["labels_total"] = total
        from lrlhf.functional.stats import bootstrap_interval

        final = self.folder(self.rounds.n) / "ppo"
        out = {"stage": "iterative", "run_dir": str(self.run_dir), "rounds": rows, "labels_total": total,
               "ppo_steps_total": sum(self.rounds.steps(r) for r in range(1, self.rounds.n + 1)),
               "export": str(final / "export")}
        # the final policy against SFT on the same held-out prompts (whatever each round's reference was)
        kind = "gold" if self.cfg.eval.judge == "toy_gold" else "judge"
        sft, last = self.samples(0), self.samples(self.rounds.n)
        u_sft, u_last = (per_prompt([(x + y) / 2 for x, y in zip(s["u_a"], s["u_b"], strict=True)])
                         for s in (sft, last))
        diff = [b - a for a, b in zip(u_sft, u_last, strict=True)]
        for name, values in (("sft", u_sft), ("iterative", u_last), ("iterative_minus_sft", diff)):
            out[f"{kind}/{name}"] = sum(values) / len(values)
            out[f"{kind}/{name}_interval"] = list(bootstrap_interval(values))
        out.update(write_report(rows, self.run_dir))
        atomic_write_text(self.run_dir / "summary.json", json.dumps(out, indent=2, default=str) + "\n")
        return out


def run_rounds(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> dict:
    """:class:`RoundLoop` ``(cfg, run_dir, overrides).run()``."""
    return RoundLoop(cfg, run_dir, overrides).run()


__all__ = ["RoundLoop", "Rounds", "check_start", "held_out_settings", "on_policy_pairs", "prompt_pool", "replayed",
           "run_rounds"]
