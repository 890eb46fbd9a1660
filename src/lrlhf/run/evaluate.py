"""``recipe=eval``'s stage: the run's ``eval`` settings, seed, logger and the PPO stage whose checkpoints the
Goodhart plot shows, handed to :func:`lrlhf.eval.harness.run_eval` (which never reads the Hydra config)."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lrlhf.run.training import begin_stage, make_logger
from lrlhf.utils.io import atomic_write_text


def run_eval_stage(cfg: DictConfig, out_dir: Path, final_dir: Path) -> dict:
    """Evaluate the policies of ``cfg.eval`` into ``out_dir`` (one launched process: no collective runs in it; with
    ``jobs=N`` its samples are drawn in N worker processes)."""
    from hydra.utils import instantiate

    from lrlhf.eval.harness import run_eval
    from lrlhf.utils.distributed import is_global_zero

    begin_stage(cfg, out_dir, final_dir)
    if not is_global_zero():
        return {"stage": "eval", "run_dir": str(out_dir)}
    settings = instantiate(cfg.eval, _convert_="all")
    stage = settings.goodhart_stage
    goodhart = str(cfg.deps[stage]) if stage and stage in cfg.deps else None
    logger = make_logger(cfg.logger) if cfg.get("logger") else None
    summary = {"stage": "eval", "run_dir": str(out_dir),
               **run_eval(settings, out_dir, int(cfg.seed), goodhart_folder=goodhart, logger=logger,
                          hyperparams=OmegaConf.to_container(cfg, resolve=True) if logger is not None else None,
                          workers=int(cfg.get("jobs") or 1))}  # jobs=N: its draws in N processes
    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary
