"""``python -m lrlhf.run.stage_worker <spec.yaml>``: build one needed stage in a process of its own, for a launch with
``jobs=N`` (:mod:`lrlhf.run.parallel`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from lrlhf.run.parallel import StageBuildFailed
from lrlhf.run.planning import _stage_done, cache_folder
from lrlhf.utils import launch_signals


def main(argv: list[str] | None = None) -> None:
    """Build the one stage the launch planned in ``<spec.yaml>`` (its meta in ``<spec.json>``)."""
    from hydra import initialize_config_dir

    from lrlhf.run.cli import ROOT, _build_stage, hold_stage, register
    from lrlhf.utils.console import setup_console, verbose_requested  # before transformers is imported

    # the launch stopping this build outside its training: the building folder is removed, the stage's lock released
    launch_signals.install(replace=True)  # an ignored SIGTERM inherited from the launch's parent included
    spec = Path((sys.argv[1:] if argv is None else argv)[0])
    meta = json.loads(spec.with_suffix(".json").read_text())
    setup_console(verbose_requested([])[0], wandb_offline=True)  # the launch's --verbose: LRLHF_VERBOSE
    register()
    dep = OmegaConf.load(spec)
    OmegaConf.set_struct(dep, True)
    recipe, out_dir = meta["recipe"], Path(meta["out_dir"])
    if cache_folder(dep, recipe) != out_dir:
        raise StageBuildFailed(f"the `{recipe}` stage's config reloaded from {spec} hashes to "
                               f"{cache_folder(dep, recipe).name}, not the planned {out_dir.name}")
    lock = hold_stage(recipe, out_dir)
    try:  # in Hydra's context, as in the launch: a stage that composes another recipe (iterative RLHF's RMs)
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
            if not _stage_done(out_dir):
                _build_stage(recipe, dep, out_dir, Path(meta["run_dir"]), list(meta["overrides"]), True, "")
    finally:
        lock.release()


if __name__ == "__main__":
    main()
