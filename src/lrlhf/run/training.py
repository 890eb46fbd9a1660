"""The one-stage trainer: a composed stage config in, a trained stage folder out.

:func:`fit_stage` builds the tokenizer, the LightningModule and the datamodule from the config (``module``,
``data``), the Trainer with its logger and callbacks, runs ``fit``, then :func:`finish_stage` leaves behind what
every module's one contract says (:mod:`lrlhf.modules.stage`): ``config.yaml``, ``summary.json``, the logger's
files, checkpoints and the export, under the stage's run folder. The stage kinds that train nothing themselves
(``eval``, ``rm_ensemble``, ``iterative``) are :mod:`lrlhf.run.stages`' table; the rounds and the ensemble call
:func:`fit_stage` for each stage they train.
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from lrlhf.run.planning import RESUMABLE_CHANGES, run_config
from lrlhf.utils.io import atomic_save_children, atomic_write_text
from lrlhf.utils.launch_signals import stop_if_signalled


def at_folder(cfg: DictConfig, out_dir: Path) -> DictConfig:
    """A copy of ``cfg`` whose ``paths.run_dir`` is ``out_dir``."""
    cfg = cfg.copy()
    with open_dict(cfg):
        cfg.paths.run_dir = str(out_dir)
    return cfg


def model_config(cfg: DictConfig):
    """The stage's model settings (``module.model`` or ``module.policy``) as a :class:`lrlhf.models.ModelConfig`."""
    from hydra.utils import instantiate

    for key in ("model", "policy"):
        if key in cfg.module:
            return instantiate(cfg.module[key], _convert_="all")
    raise ValueError("the recipe's module has neither `model` nor `policy`")


def make_logger(node: DictConfig):
    """The run's logger. An offline W&B run is told not to reference artifacts by client id: wandb 0.19 (the floor)
    then asked the server for its version at the first table (the sample table) and retried for minutes."""
    from hydra.utils import instantiate

    if "WandbLogger" in str(node.get("_target_")) and node.get("offline"):
        import wandb

        return instantiate(node, settings=wandb.Settings(allow_offline_artifacts=False))
    return instantiate(node)


#: what the console calls a PPO-kind stage by its advantage estimator (recipe=grpo_lora runs stage=ppo with GRPO)
METHOD_OF_ESTIMATOR = {"GAE": "ppo", "RLOO": "rloo", "GRPO": "grpo"}


def stage_label(cfg: DictConfig) -> str | None:
    """The stage's name as the console says it: ``cfg.stage``, or for a PPO-kind stage its method (``grpo``,
    ``rloo``; a subclass estimator: its class name)."""
    stage = cfg.get("stage")
    target = OmegaConf.select(cfg, "module.advantage._target_", default=None)
    if stage != "ppo" or not isinstance(target, str):
        return stage
    name = target.rsplit(".", 1)[-1]
    return METHOD_OF_ESTIMATOR.get(name, name)


def make_trainer(cfg: DictConfig, out_dir: Path):
    """The Trainer of ``cfg.trainer`` with the run's logger and callbacks; every resumable checkpoint stores the run
    config, which a resume is checked against."""
    from hydra.utils import instantiate

    from lrlhf.callbacks import ResumableCheckpoint, console_callbacks

    logger = make_logger(cfg.logger) if cfg.get("logger") else False
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c]
    stored = run_config(cfg)
    for callback in callbacks:  # the run config is stored with every checkpoint and checked on resume
        if isinstance(callback, ResumableCheckpoint) and not callback.config:
            callback.config = stored
            callback.allowed_config_changes = (*callback.allowed_config_changes, *RESUMABLE_CHANGES)
    # progress in rollouts / steps, a clean stop on SIGTERM / SIGINT
    callbacks += console_callbacks(stage_label(cfg), callbacks, cfg.trainer.get("enable_progress_bar", True))
    trainer = instantiate(cfg.trainer, logger=logger, callbacks=callbacks, default_root_dir=str(out_dir))
    if logger:
        logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    return trainer


def begin_stage(cfg: DictConfig, out_dir: Path, final_dir: Path) -> str:
    """Seed and threads, then ``config.yaml`` in ``out_dir`` (naming ``final_dir``) unless the run resumes (written
    once the checkpoint was accepted: a refused resume leaves the folder's config as it was). Returns that YAML."""
    import lightning.pytorch as pl
    import torch

    from lrlhf.utils.distributed import barrier, is_global_zero

    torch.set_num_threads(cfg.threads)
    pl.seed_everything(cfg.seed, verbose=False)
    config_yaml = OmegaConf.to_yaml(at_folder(cfg, final_dir), resolve=True)
    if is_global_zero():
        out_dir.mkdir(parents=True, exist_ok=True)
        if cfg.get("ckpt_path") is None:
            atomic_write_text(out_dir / "config.yaml", config_yaml)
    barrier()  # (only once a process group exists: before the first fit no other rank writes into out_dir)
    return config_yaml


def fit_stage(cfg: DictConfig, out_dir: Path, final_dir: Path | None = None) -> dict:
    """Train one stage into ``out_dir`` and return its summary (also written as ``summary.json``).

    ``final_dir``: where ``out_dir`` will be moved once complete (a cached stage is built in a temporary folder
    and swapped in); the written config and summary name that place.

    Several processes (``trainer.devices=N``, torchrun, srun): every rank trains (``fit`` is collective), in the
    same ``out_dir``; only global rank 0 writes ``config.yaml``, the export and ``summary.json`` (the other ranks
    take part in gathering a sharded model and wait at a barrier; the summary they return lacks rank 0's part).
    """
    from hydra.utils import instantiate

    from lrlhf.models import load_tokenizer
    from lrlhf.utils.distributed import barrier, is_global_zero

    zero = is_global_zero()
    final_dir = final_dir or out_dir
    config_yaml = begin_stage(cfg, out_dir, final_dir)
    tokenizer = load_tokenizer(model_config(cfg))
    module = instantiate(cfg.module, tokenizer=tokenizer, _convert_="all")
    data = instantiate(cfg.data, tokenizer=tokenizer, _convert_="all")
    trainer = make_trainer(cfg, out_dir)
    trainer.fit(module, datamodule=data, ckpt_path=cfg.ckpt_path)
    if zero and cfg.get("ckpt_path") is not None:
        atomic_write_text(out_dir / "config.yaml", config_yaml)
    summary = {"stage": cfg.stage, "method": stage_label(cfg), "run_dir": str(out_dir),
               **finish_stage(cfg, module, data, trainer, out_dir, own=final_dir == out_dir)}
    summary = json.loads(json.dumps(summary, default=str).replace(str(out_dir), str(final_dir)))
    if zero:
        atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    barrier()  # summary.json is written
    return summary


def _whole(cfg, module, trainer):
    """The trained module whole on global rank 0 (None on the other ranks): :func:`lrlhf.strategies.whole_module`
    with a fresh module built from ``cfg.module`` to load a gathered sharded state into."""
    from hydra.utils import instantiate

    from lrlhf.strategies import whole_module

    return whole_module(module, trainer, lambda: instantiate(cfg.module, tokenizer=module.tokenizer, _convert_="all"))


def finish_stage(cfg, module, data, trainer, out_dir: Path, own: bool = True) -> dict:
    """What every stage leaves behind, by the modules' one contract (:mod:`lrlhf.modules.stage`): the figures of
    training, the callbacks' part (early stopping restores its chosen checkpoint), then on global rank 0 the
    module's held-out evaluations, its export (swapped into place), and for a policy the comparison with SFT.
    ``own``: the launch's own stage (not one built into the cache, which a SIGTERM stops once it is built)."""
    summary = module.stage_summary(trainer, out_dir)  # every rank
    if getattr(data, "reports", None):
        summary["data"] = dict(data.reports)  # per split: records, kept, every drop by reason
    for callback in trainer.callbacks:
        if callable(getattr(callback, "stage_summary", None)):
            summary.update(callback.stage_summary(trainer, module))  # every rank (a sharded restore is collective)
    whole = _whole(cfg, module, trainer)
    if whole is None:  # another rank than 0: rank 0 evaluates and exports
        return summary
    summary.update(whole.finish(data, out_dir, trained=module))
    summary.update(atomic_save_children(out_dir, whole.export_stage))
    if cfg.get("eval") and whole.policy_name:
        if own:  # a SIGTERM during the held-out loop: the export is written, no minutes of sampling first
            stop_if_signalled()
        from lrlhf.eval import compare_with_sft
        from lrlhf.models import load_causal_lm

        ev = cfg.eval
        summary.update(compare_with_sft(whole.model, load_causal_lm(model_config(cfg)), whole.tokenizer,
                                        ev.prompts, whole.policy_name, n_samples=ev.n_samples, seed=cfg.seed,
                                        temperature=ev.temperature, max_new_tokens=ev.max_new_tokens,
                                        judge=ev.get("judge") or "toy_gold", max_prompts=ev.get("max_prompts"),
                                        max_prompt_length=ev.get("max_prompt_length") or 1024))
    return summary
