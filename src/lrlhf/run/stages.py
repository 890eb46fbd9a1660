"""The stage kinds a recipe may name (``stage:``), one table: what runs a stage of each kind, whether it is one
training run (which the stage cache can hold for a recipe that needs it), and what is checked once the world is
built, before any stage is.

A kind that trains (``sft``, ``rm``, ``ppo``, ``dpo``, ``kto``) is :func:`lrlhf.run.training.fit_stage`; ``eval``
evaluates policies and trains nothing (:mod:`lrlhf.run.evaluate`); ``rm_ensemble`` trains N ``rm`` stages into one
artefact (:mod:`lrlhf.run.rm_ensemble`); ``iterative`` runs rounds of labels, RM and PPO stages
(:mod:`lrlhf.run.rounds`); ``pairs`` samples and labels the SFT policy's own pairs (:mod:`lrlhf.run.pairs`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from lrlhf.run.evaluate import run_eval_stage
from lrlhf.run.pairs import run_pairs
from lrlhf.run.rm_ensemble import run_ensemble
from lrlhf.run.rounds import check_start, run_rounds
from lrlhf.run.training import fit_stage


@dataclass(frozen=True)
class StageKind:
    """One kind of stage: ``run(cfg, out_dir, final_dir, overrides) -> summary``."""

    trains: bool
    """One Trainer.fit: the stage cache can hold a run of it for a recipe that needs it."""
    run: Callable[[DictConfig, Path, Path, list[str]], dict]
    """``out_dir``: where it is built; ``final_dir``: where it will be moved once complete; ``overrides``: the
    launch's (the stages a kind runs itself take the shared ones)."""
    check_start: Callable[[DictConfig, Path], object] | None = None
    """On global rank 0, once the world is built and before any stage is: a check of the run folder and data."""
    summary_for_every_rank: bool = True
    """The other ranks of a launch read the summary rank 0 wrote once the stage ran (False: ``eval``, which rank 0
    runs alone while the others return at once)."""


def _fit(cfg, out_dir, final_dir, overrides):
    return fit_stage(cfg, out_dir, final_dir)


KINDS: dict[str, StageKind] = {
    **{name: StageKind(trains=True, run=_fit) for name in ("sft", "rm", "ppo", "dpo", "kto")},
    "eval": StageKind(trains=False, run=lambda cfg, out, final, overrides: run_eval_stage(cfg, out, final),
                      summary_for_every_rank=False),
    "pairs": StageKind(trains=False, run=lambda cfg, out, final, overrides: run_pairs(cfg, out, final)),
    "rm_ensemble": StageKind(trains=False, run=lambda cfg, out, final, overrides: run_ensemble(cfg, out, final)),
    "iterative": StageKind(trains=False, run=lambda cfg, out, final, overrides: run_rounds(cfg, out, overrides),
                           check_start=check_start),
}
#: Every stage a recipe may name.
STAGES = tuple(KINDS)
#: The stages one training run makes, which the stage cache can hold for a recipe that needs them.
TRAINED_STAGES = tuple(name for name, kind in KINDS.items() if kind.trains)


def kind_of(cfg: DictConfig) -> StageKind:
    """The kind of ``cfg.stage``; an unknown one fails naming the key."""
    if cfg.stage not in KINDS:
        raise ValueError(f"stage must be one of {', '.join(KINDS)}, got {cfg.stage!r}")
    return KINDS[cfg.stage]


def run_stage(cfg: DictConfig, out_dir: Path, final_dir: Path | None = None, overrides: list[str] = ()) -> dict:
    """Run the stage ``cfg`` into ``out_dir`` by its kind; returns its summary."""
    return kind_of(cfg).run(cfg, out_dir, final_dir or out_dir, list(overrides))
