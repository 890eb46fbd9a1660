"""``recipe=rm_ensemble``: N reward models trained as ``recipe=rm`` with seeds ``seed + i * ensemble.seed_stride``
(another head initialisation and data order each, the same SFT base and data), exported as one artefact.

The stage folder holds ``members/member_<i>/`` (each a whole ``rm`` stage: config, summary, ``model/``) and
``model/``, the ensemble (:mod:`lrlhf.models.ensemble`: ``reward_ensemble.json`` naming the members' ``model``
folders, an identity calibration). ``summary.json`` has every member's and the ensemble's pairwise accuracy on the
test pairs (one rule for all), with the members' disagreement on the test completions (the scale PPO's
``reward/ensemble_std`` is read on). PPO, RLOO and GRPO use it with ``reward=ensemble``
(``configs/reward/ensemble.yaml``).

Stopped and resumed (``python train.py recipe=rm_ensemble``, then the printed command with ``ckpt_path=last``): the
members already trained with this config are kept, the interrupted one resumes from its checkpoint. A needed
ensemble stage (built into the cache) is built again from its start, as any needed stage.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from lrlhf.models.ensemble import write_ensemble
from lrlhf.run.training import begin_stage, fit_stage


@dataclass
class EnsembleSettings:
    """``ensemble.*`` of ``recipe=rm_ensemble`` (built when planning: a bad value fails before any stage)."""

    members: int = 3
    """N >= 2 reward models."""
    seed_stride: int = 1
    """Member ``i`` trains with ``seed + i * seed_stride``."""
    combine: object = None
    """The artefact's default combination rule (:mod:`lrlhf.functional.ensemble_rules`); None = the mean."""
    data_fraction: float = 1.0
    """Each member trains on a random fraction of the training prompts (all pairs of a prompt together), drawn with
    its own seed: members that saw other data disagree more off-distribution. 1.0 = every member on every pair."""

    def __post_init__(self):
        if not 0 < self.data_fraction <= 1:
            raise ValueError(f"ensemble.data_fraction must be in (0, 1], got {self.data_fraction}")
        if self.members < 2:
            raise ValueError(f"ensemble.members must be >= 2 (recipe=rm trains one RM), got {self.members}")
        if self.seed_stride < 1:
            raise ValueError(f"ensemble.seed_stride must be >= 1, got {self.seed_stride}")
        from lrlhf.functional.ensemble_rules import EnsembleCombine

        if self.combine is not None and not isinstance(self.combine, EnsembleCombine):
            raise ValueError(f"ensemble.combine must be an EnsembleCombine (lrlhf.functional.ensemble_rules), got "
                             f"{type(self.combine).__name__}")


#: A member's training pairs (``ensemble.data_fraction < 1``), in its folder.
SUBSET_FILE = "train_pairs.jsonl"


def write_subset(source, path: Path, fraction: float, seed: int) -> None:
    """The pairs of a random ``fraction`` of the prompts of the JSONL file ``source`` (seeded), in file order."""
    import random

    from lrlhf.utils.io import atomic_write_text

    source = Path(str(source))
    if source.suffix != ".jsonl" or not source.is_file():
        raise ValueError(f"ensemble.data_fraction < 1 needs data.train to be a local JSONL file, got {source}")
    lines = [line for line in source.read_text().splitlines() if line.strip()]
    keys = [json.dumps(json.loads(line).get("prompt"), sort_keys=True) for line in lines]
    prompts = sorted(set(keys))
    keep = set(random.Random(seed).sample(prompts, max(1, round(fraction * len(prompts)))))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(line + "\n" for line, key in zip(lines, keys, strict=True) if key in keep))


def member_config(cfg: DictConfig, i: int, folder: Path, seed: int, data_fraction: float = 1.0) -> DictConfig:
    """Member ``i``'s ``rm`` stage config: the ensemble's, with its own seed (``data.seed`` follows ``seed``) and,
    with ``data_fraction < 1``, its own training pairs (``<its folder>/train_pairs.jsonl``), no logger of its own
    and no resume (:func:`run_ensemble` decides that)."""
    sub = cfg.copy()
    with open_dict(sub):
        sub.world = OmegaConf.create(OmegaConf.to_container(cfg.world, resolve=True))  # the ensemble's world
        sub.stage = "rm"
        sub.seed = seed
        sub.paths.run_dir = str(folder)
        sub.logger = None  # N loggers in one process would share one W&B run
        sub.ckpt_path = None
        if data_fraction < 1:
            sub.data.train = "${paths.run_dir}/" + SUBSET_FILE
        del sub["ensemble"]
    return sub


def run_ensemble(cfg: DictConfig, out_dir: Path, final_dir: Path) -> dict:
    """Train the members (:func:`~lrlhf.run.training.fit_stage` each), write the ensemble into ``out_dir/model`` and
    return the summary."""
    from hydra.utils import instantiate

    from lrlhf.utils.distributed import barrier, is_global_zero
    from lrlhf.utils.io import atomic_write_text

    begin_stage(cfg, out_dir, final_dir)
    settings: EnsembleSettings = instantiate(cfg.ensemble, _convert_="all")
    members = []
    for i in range(settings.members):
        folder, final = out_dir / "members" / f"member_{i}", final_dir / "members" / f"member_{i}"
        seed = int(cfg.seed) + i * settings.seed_stride
        sub = member_config(cfg, i, folder, seed, settings.data_fraction)
        expected = OmegaConf.to_yaml(member_config(cfg, i, final, seed, settings.data_fraction), resolve=True)
        done = (folder / "summary.json").is_file() and (folder / "config.yaml").read_text() == expected
        if not done:
            resume = cfg.get("ckpt_path") is not None and (folder / "checkpoints" / "last.ckpt").is_file() and (
                folder / "config.yaml").is_file() and (folder / "config.yaml").read_text() == expected
            if resume:
                with open_dict(sub):
                    sub.ckpt_path = "last"
            elif folder.exists() and is_global_zero():  # another config, or a start without a checkpoint
                shutil.rmtree(folder)
            barrier()
            if settings.data_fraction < 1 and is_global_zero():
                write_subset(cfg.data.train, folder / SUBSET_FILE, settings.data_fraction, seed)
            barrier()
            print(f"reward ensemble: member {i + 1}/{settings.members} (seed {seed})"
                  f"{', resumed' if resume else ''}", flush=True)
            try:
                fit_stage(sub, folder, final)
            except SystemExit as stop:  # a clean stop: the ensemble resumes as a whole
                if hasattr(stop, "run_dir") and hasattr(stop, "resume_key"):  # lrlhf.callbacks.TrainingStopped
                    stop.run_dir, stop.resume_key = str(final_dir), "last"
                raise
        members.append(folder)
    if not is_global_zero():  # every rank trained the members; rank 0 writes the artefact
        barrier()
        return json.loads((out_dir / "summary.json").read_text())
    write_ensemble(out_dir / "model", [m / "model" for m in members], settings.combine)
    summary = {"stage": "rm_ensemble", "run_dir": str(final_dir), "export": str(final_dir / "model"),
               "members": settings.members, **ensemble_figures(out_dir / "model", cfg.data.get("test"), members)}
    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    barrier()
    return summary


def ensemble_figures(folder: Path, test_file, members: list[Path]) -> dict:
    """Pairwise accuracy on the test pairs (ties and multi-turn answers left out) of each member and of the
    ensemble's mean and worst-case rules, one rule for all (a pair counts when the better answer scores higher),
    with bootstrap intervals; the members' disagreement (std of calibrated scores) on the test completions and the
    mean correlation of their scores."""
    import torch

    from lrlhf.data.formats import PREFERENCE_KINDS, load_records
    from lrlhf.data.records import PromptExample, as_pairs
    from lrlhf.functional.ensemble_rules import EnsembleMean, WorstCase, disagreement
    from lrlhf.functional.stats import bootstrap_interval
    from lrlhf.models import ModelConfig, load_tokenizer
    from lrlhf.models.ensemble import load_reward_ensemble
    from lrlhf.rewards.text import reward_model_scorer

    if not test_file:
        return {}
    pairs = [p for p in as_pairs(load_records(test_file, PREFERENCE_KINDS, verbose=False)[0])
             if p.target != 0.5 and len(p.chosen) == 1 and len(p.rejected) == 1]
    if not pairs:
        return {}
    ensemble = load_reward_ensemble(folder)
    tokenizer = load_tokenizer(ModelConfig(str(members[0] / "model")))
    prompts = [PromptExample(p.prompt) for p in pairs]

    def member_scores(texts: list[str]) -> torch.Tensor:  # (N, P) calibrated
        rows = []
        for model, calibration in zip(ensemble.members, ensemble.calibrations, strict=True):
            raw = torch.tensor(reward_model_scorer(model, tokenizer)(prompts, texts), dtype=torch.float64)
            rows.append(calibration.normalise(raw))
        return torch.stack(rows)

    chosen = member_scores([p.chosen[0]["content"] for p in pairs])
    rejected = member_scores([p.rejected[0]["content"] for p in pairs])
    first_better = torch.tensor([p.target > 0.5 for p in pairs])

    def accuracy(a: torch.Tensor, b: torch.Tensor) -> tuple[float, list[float]]:
        hits = torch.where(first_better, a > b, b > a).double().tolist()
        return sum(hits) / len(hits), list(bootstrap_interval(hits))

    figures: dict = {"member_test_accuracy": [], "member_test_accuracy_interval": []}
    for i in range(len(members)):
        acc, interval = accuracy(chosen[i], rejected[i])
        figures["member_test_accuracy"].append(acc)
        figures["member_test_accuracy_interval"].append(interval)
    for name, rule in (("mean", EnsembleMean()), ("worst_case", WorstCase())):
        acc, interval = accuracy(rule(chosen), rule(rejected))
        figures[f"ensemble_test_accuracy_{name}"], figures[f"ensemble_test_accuracy_{name}_interval"] = acc, interval
    figures["test_disagreement_mean"] = float(torch.cat([disagreement(chosen), disagreement(rejected)]).mean())
    corr = torch.corrcoef(torch.cat([chosen, rejected], dim=1))
    n = corr.shape[0]
    figures["member_score_correlation_mean"] = float((corr.sum() - n) / (n * (n - 1)))
    figures["test_pairs"] = len(pairs)
    return figures
