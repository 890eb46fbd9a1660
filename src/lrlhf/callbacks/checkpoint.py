"""Checkpoints that really resume (a resumed run continues bitwise), on Lightning's own machinery.

:class:`ResumableCheckpoint` is a ``ModelCheckpoint`` subclass, so ``trainer.fit(..., ckpt_path="last")`` finds
its ``last.ckpt``. Lightning's checkpoint already holds the trained weights, optimisers, schedulers, loop
progress (global step), callback states (early stopping) and the datamodule's sampler position; the module's
``on_save_checkpoint`` adds the KL controller's state (beta, saved once) and ``rollouts_done``. This callback adds
what is missing and makes the write safe:

- **When**: after a Trainer batch, i.e. after a whole rollout and its update epochs (never mid-update), every
  ``every_n_rollouts`` rollouts, and after the batch that ends training (``save_at_end``). A module without
  ``rollouts_done`` (SFT, RM, DPO) counts Trainer batches, and a save falls due only at a batch that ended with
  an optimiser step (never mid gradient accumulation: the accumulated gradients are in no checkpoint). File
  ``rollout=000012.ckpt``; the last ``keep_last_k`` are kept.
- **Frozen weights are not stored**: every parameter no optimiser updates (the frozen base under the adapters,
  the reward model) is dropped from ``state_dict``; what is stored instead is their identity, a SHA-256 per
  top-level part (``model``, ``reward_model``) and where they were loaded from. On resume the module loads them
  from their source as usual (``configure_model``) and the digests are compared before anything is restored.
- **RNG**: python, numpy, torch and CUDA states, of every rank (each rank samples its own stream). Each rollout
  starts from exactly the state the previous one ended in (restored at ``on_train_batch_start``), so draws made
  between batches (a new DataLoader iterator draws a seed from the global generator) cannot make a resumed run
  differ from an uninterrupted one.
- **Sharded strategies** (``strategy=fsdp2``, or ``fsdp`` with ``state_dict_type: sharded``): the checkpoint is
  a folder written by torch.distributed.checkpoint, one shard per rank plus Lightning's ``meta.pt``. It keeps
  the frozen weights (each rank stores only its shard, and the sharded loader needs every key), so there is no
  frozen-weight digest to compare; the config is compared when the checkpoint's metadata is restored (after
  the strategy has loaded the weights, before training continues). The folder is fsynced file by file and
  renamed like a file.
- **Config**: the module's hyperparameters, its reward calibration and the resolved run ``config`` (given by
  the CLI) are stored and compared on resume; a difference outside ``allowed_config_changes`` (fnmatch
  patterns of dotted keys) is refused with the keys and both values. Keys that Lightning restores from the
  checkpoint after the module is built (:data:`RESTORED_KEYS`: the optimiser's lr, weight decay, betas, eps; the
  LR schedule's warmup, kind, total steps; the KL coefficient) are refused even where a pattern allows them: the
  run would go on with the checkpoint's value whatever the config says. Library versions are stored; a
  difference only warns.
- **Atomic**: ``torch.save`` writes ``.<name>.<pid>.partial`` next to the target (no temporary file in
  ``$TMPDIR``), which is fsynced and renamed over the target; ``last.ckpt`` is a symlink replaced (by rename)
  only after the new file is complete. A process killed mid-write leaves the previous ``last`` intact; its
  leftover ``.*.partial`` files are removed at the next ``setup``.
- **Loading**: the file's integrity first (``checkpoint_io``: the zip's CRC-32s; a bad ``last`` falls back to the
  newest intact ``rollout=*.ckpt``, an explicit bad path is refused), then with ``weights_only=True`` (the
  checkpoint holds tensors, numbers, strings, lists and dicts only).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_warn

from lrlhf.callbacks.checkpoint_io import (
    ROLLOUT_FILE,
    _fsync,
    _remove,
    _VerifyingCheckpointIO,
    checkpoint_problem,
    fall_back,
)
from lrlhf.strategies import is_sharded
from lrlhf.utils.compat import validates_after_this_batch
from lrlhf.utils.io import recover_folder, swap_folder_in
from lrlhf.utils.state import (
    flatten,
    frozen_identity,
    frozen_keys,
    library_versions,
    rng_state,
    set_rng_state,
    trained_parameter_ids,
)

META_KEY = "lrlhf"
"""Top-level checkpoint key of what this callback adds."""
FORMAT_VERSION = 1

_OPTIMISER = ("restored from the checkpoint's optimiser state (its param_groups, and the LR scheduler's base_lrs); "
              "the change would not take effect")
_SCHEDULER = ("restored from the checkpoint's LR scheduler state (its step, base and current learning rates; the "
              "schedule's shape is rebuilt from the config only from the second resumed step on); the change would "
              "not take effect as configured")
#: Config keys, by their last dotted part, that a resume refuses to change even where ``allowed_config_changes``
#: allows them: Lightning restores what they set from the checkpoint after the module is built (the optimiser's
#: param_groups, the LR scheduler's state; the KL controller's beta), so the run would not use the new value.
RESTORED_KEYS: dict[str, str] = {
    **dict.fromkeys(("lr", "learning_rate", "weight_decay", "betas", "eps", "momentum"), _OPTIMISER),
    **dict.fromkeys(("warmup_steps", "scheduler", "total_steps"), _SCHEDULER),
    **dict.fromkeys(("kl_coef", "init_kl_coef"), "restored from the checkpoint's KL controller state; the change "
                                                 "would not take effect"),
}


def config_problems(old: dict, new: dict, allowed: tuple[str, ...] | list[str] = ()) -> list[str]:
    """``"config <key>: checkpoint <a>, this run <b>"`` for each dotted key of the nested dicts ``old`` (the
    checkpoint's) and ``new`` whose values differ, except keys matching an fnmatch pattern of ``allowed`` -- unless
    the key is one of :data:`RESTORED_KEYS`: then the line also names the pattern and why it is refused."""
    old, new = flatten(old), flatten(new)
    problems = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if a == b:
            continue
        pattern = next((p for p in allowed if fnmatch.fnmatchcase(key, p)), None)
        reason = RESTORED_KEYS.get(key.rsplit(".", 1)[-1])
        if pattern is None:
            problems.append(f"config {key}: checkpoint {a!r}, this run {b!r}")
        elif reason is not None:
            problems.append(f"config {key}: checkpoint {a!r}, this run {b!r} (allowed by {pattern!r}, but {reason})")
    return problems


def _all_ranks(value: Any) -> list[Any]:
    """``value`` of every rank, in rank order (``[value]`` in a single process). A collective."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def atomic_save_checkpoint(trainer: pl.Trainer, path: str | Path) -> Path:
    """``trainer.save_checkpoint`` into ``.<name>.<pid>.partial`` next to ``path``, fsync, rename, fsync the folder.

    Collective like ``trainer.save_checkpoint`` (every rank calls it; rank 0 writes and renames).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    trainer.save_checkpoint(tmp, weights_only=False)  # the full training state, not only the weights
    if trainer.is_global_zero:
        _fsync(tmp)
        if tmp.is_dir():  # sharded: the old folder is moved aside, not deleted before the new one is in place
            swap_folder_in(tmp, path)
        else:
            if path.is_dir() and not path.is_symlink():  # a folder (the strategy changed) is not replaced by rename
                shutil.rmtree(path)
            os.replace(tmp, path)
        _fsync(path.parent)
    trainer.strategy.barrier("atomic_save_checkpoint")
    return path


def _scalar_metrics(metrics: dict) -> dict[str, float]:
    """The one-number entries of ``trainer.callback_metrics`` as floats (weights-only loadable)."""
    out = {}
    for key, value in metrics.items():
        try:
            out[str(key)] = float(value)
        except (TypeError, ValueError, RuntimeError):  # a tensor of several numbers, or not a number
            continue
    return out


def _plain(value: Any) -> Any:
    """A weights-only-loadable copy of a config value (dataclasses and mappings as dicts, paths as strings)."""
    if is_dataclass(value) and not isinstance(value, type):
        value = asdict(value)
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


class ResumableCheckpoint(ModelCheckpoint):
    """Resumable checkpoints at rollout boundaries (see the module docstring).

    Args:
        dirpath: folder of the checkpoints; None = Lightning's default (``<log dir>/checkpoints``).
        every_n_rollouts: save after every n-th rollout (Trainer batch; for a module without ``rollouts_done``,
            SFT / RM / DPO, a batch), at the end of the first batch from there that ended with an optimiser step
            (never mid gradient accumulation).
        keep_last_k: rollout checkpoints kept (the one ``last.ckpt`` points to is never removed).
        config: the resolved run config (e.g. the Hydra config as a dict), stored and checked on resume.
        allowed_config_changes: fnmatch patterns of dotted config keys that may differ on resume (e.g.
            ``"trainer.max_steps"``); keys are ``hparams.<...>`` (the module's) and ``config.<...>``.
        verify_frozen: compare the digests of the frozen weights on resume (off only to skip hashing a huge base).
        save_at_end: also save after the batch that ends training (``max_steps`` reached, or the last batch of
            ``max_epochs``), so a finished run is resumable to train on.
    """

    CHECKPOINT_NAME_LAST = "last"

    def __init__(
        self,
        dirpath: str | Path | None = None,
        every_n_rollouts: int = 1,
        keep_last_k: int = 3,
        config: dict | None = None,
        allowed_config_changes: tuple[str, ...] | list[str] = (),
        verify_frozen: bool = True,
        save_at_end: bool = True,
    ):
        if every_n_rollouts < 1:
            raise ValueError(f"callbacks.checkpoint.every_n_rollouts must be >= 1, got {every_n_rollouts}")
        if keep_last_k < 1:
            raise ValueError(f"callbacks.checkpoint.keep_last_k must be >= 1, got {keep_last_k}")
        super().__init__(dirpath=dirpath, save_top_k=0, save_last=False, save_on_train_epoch_end=False)
        self.every_n_rollouts = every_n_rollouts
        self.keep_last_k = keep_last_k
        self.config = _plain(config or {})
        self.allowed_config_changes = tuple(allowed_config_changes)
        self.verify_frozen = verify_frozen
        self.save_at_end = save_at_end
        self.last_paths: set[str] = set()  # what ckpt_path="last" resolved to (a bad one falls back)
        self._step_at_batch_start = -1
        self._due = False
        self._after_validation: int | None = None  # a save put off until this step's validation has run
        self._unpointed: Path | None = None  # a checkpoint written, last.ckpt not yet pointing at it
        self._pl_module: pl.LightningModule | None = None
        self._frozen_identity: dict | None = None
        self._next_rng: dict | None = None
        self._restored_metrics: dict[str, float] = {}
        self.saved: list[str] = []

    @property
    def state_key(self) -> str:
        return self._generate_state_key(every_n_rollouts=self.every_n_rollouts)

    # ------------------------------------------------------------------------------------------ setup
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._pl_module = pl_module
        io = trainer.strategy.checkpoint_io
        if not isinstance(io, _VerifyingCheckpointIO):
            trainer.strategy.checkpoint_io = _VerifyingCheckpointIO(io, self)
        if trainer.is_global_zero and self.dirpath and Path(self.dirpath).is_dir():
            for stale in Path(self.dirpath).glob(".*.partial"):  # a write killed midway (never read)
                _remove(stale)
            for moved in Path(self.dirpath).glob(".*.old"):  # a sharded folder's swap killed midway
                recover_folder(moved.with_name(moved.name[1:-len(".old")]))

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        io = trainer.strategy.checkpoint_io
        if isinstance(io, _VerifyingCheckpointIO) and io.callback is self:
            trainer.strategy.checkpoint_io = io.inner

    # -------------------------------------------------------------------------------------- the loop
    def on_fit_start(self, trainer, pl_module) -> None:
        """A resumed run starts with the metrics the checkpoint's run had last logged (Lightning clears them after
        restoring the callbacks): a run resumed from its final checkpoint trains nothing and still reports its last
        figures."""
        import torch

        restored, self._restored_metrics = self._restored_metrics, {}
        for key, value in restored.items():
            trainer.callback_metrics.setdefault(key, torch.tensor(value))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._save_put_off(trainer)  # its validation did not run after all
        self._step_at_batch_start = trainer.global_step
        if self._next_rng is not None:  # the state the previous rollout ended in (or the resumed one)
            set_rng_state(self._next_rng)
            self._next_rng = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._next_rng = rng_state()
        rollouts = self._rollouts(trainer, pl_module)
        if trainer.sanity_checking or rollouts <= 0:
            return
        self._due = self._due or rollouts % self.every_n_rollouts == 0
        if trainer.global_step == self._step_at_batch_start:
            return  # no optimiser step in this batch (gradient accumulation): the gradients are in no checkpoint
        if self._due or (self.save_at_end and self._training_ends(trainer)):
            self._due = False
            if validates_after_this_batch(trainer):  # saved once it ran (on_validation_end): see _save_put_off
                self._after_validation = rollouts
            else:  # last.ckpt points at it once the step's row is logged: see _save_put_off
                self._unpointed = self.save(trainer, rollouts, point_last=False)

    def _save_put_off(self, trainer) -> None:
        """The save of a step that ends in a validation, made after it: the checkpoint then holds the validation's
        figures (a relaunch of a finished run reports the final ones, not the previous validation's) and a kill
        during the validation resumes before the step, so it runs again (saved before it, a resume skipped it and
        metrics.csv lost its row). The checkpoint's RNG is the batch end's, as a save at the batch end would have.

        Any other step's checkpoint is written at its batch end, but ``last.ckpt`` is pointed at it only here (the
        next batch start, or the end of training): Lightning logs a step's row after the batch-end hooks, so a kill
        between the two resumes before the step and logs its row again (pointed at once, the row was lost)."""
        if self._after_validation is not None:
            rollouts, self._after_validation = self._after_validation, None
            self.save(trainer, rollouts)
        if self._unpointed is not None:
            self.point_last(trainer, self._unpointed)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        pass  # rollout boundaries only

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._save_put_off(trainer)

    def on_exception(self, trainer, pl_module, exception) -> None:
        pass  # an exception mid-rollout is not a boundary; the last complete checkpoint stands

    def on_train_end(self, trainer, pl_module) -> None:
        self._save_put_off(trainer)

    @staticmethod
    def _training_ends(trainer: pl.Trainer) -> bool:
        """Whether the batch that just ended is the last one of ``fit`` (``max_steps``, or ``max_epochs``' last)."""
        if trainer.max_steps is not None and trainer.max_steps >= 0 and trainer.global_step >= trainer.max_steps:
            return True
        progress = trainer.fit_loop.epoch_loop.batch_progress
        epoch_ends = progress.is_last_batch or progress.current.ready >= trainer.num_training_batches
        max_epochs = trainer.max_epochs
        return epoch_ends and max_epochs is not None and max_epochs >= 0 and trainer.current_epoch + 1 >= max_epochs

    @staticmethod
    def _rollouts(trainer: pl.Trainer, pl_module: pl.LightningModule) -> int:
        done = getattr(pl_module, "rollouts_done", None)
        return int(done) if done is not None else trainer.fit_loop.epoch_loop.total_batch_idx + 1

    # ------------------------------------------------------------------------------------------ write
    def save(self, trainer: pl.Trainer, rollouts: int, point_last: bool = True) -> Path:
        """Write ``rollout=<n>.ckpt`` atomically, then (``point_last``) point ``last.ckpt`` at it and prune."""
        dirpath = Path(self.dirpath)
        dirpath.mkdir(parents=True, exist_ok=True)
        path = atomic_save_checkpoint(trainer, dirpath / f"rollout={rollouts:06d}.ckpt")
        self.last_model_path = self._last_checkpoint_saved = str(path)
        self._last_global_step_saved = trainer.global_step
        if point_last:
            self.point_last(trainer, path)
        return path

    def point_last(self, trainer: pl.Trainer, path: Path) -> None:
        """Point ``last.ckpt`` at the checkpoint ``path`` (atomically), then prune (a collective)."""
        self._unpointed = None
        dirpath = Path(self.dirpath)
        if trainer.is_global_zero:
            last = dirpath / f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}"
            tmp = dirpath / f".{last.name}.{os.getpid()}.partial"
            tmp.unlink(missing_ok=True)
            os.symlink(path.name, tmp)
            os.replace(tmp, last)
            _fsync(dirpath)
            self._prune(dirpath, keep=path.name)
        trainer.strategy.barrier("ResumableCheckpoint.save")

    def _prune(self, dirpath: Path, keep: str) -> None:
        files = sorted((int(m.group(1)), p) for p in dirpath.iterdir() if (m := ROLLOUT_FILE.match(p.name)))
        self.saved = [p.name for _, p in files[-self.keep_last_k:]]
        for _, p in files[:-self.keep_last_k]:
            if p.name != keep:
                _remove(p)

    def _find_last_checkpoints(self, trainer: pl.Trainer) -> set[str]:
        """What ``ckpt_path="last"`` resolves to, remembered so that the checkpoint IO may fall back from it when
        it is corrupt or truncated. A ``last.ckpt`` pointing to a missing file (Lightning would skip it and train
        from scratch) is replaced here by the newest intact rollout checkpoint, with a warning."""
        found = set()
        for path in super()._find_last_checkpoints(trainer):
            if os.path.islink(path) and not os.path.exists(path):
                path = fall_back(Path(path), checkpoint_problem(path))
            found.add(path)
        self.last_paths = {os.path.normpath(p) for p in found}
        return found

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        """Drop frozen weights, add identity, config, versions and RNG (on every checkpoint of this trainer).

        Called on every rank (the RNG states are gathered: a collective)."""
        sharded = is_sharded(trainer)
        rng = self._next_rng if self._next_rng is not None else rng_state()  # the next batch starts from it
        # sharded: every key stays (the sharded loader needs them; each rank holds only its shard anyway)
        frozen = [] if sharded else frozen_keys(pl_module, trained_parameter_ids(trainer.optimizers))
        state = checkpoint["state_dict"]
        for key in frozen:
            state.pop(key, None)
        if self._frozen_identity is None or set(self._frozen_identity["keys"]) != set(frozen):
            identity = frozen_identity(pl_module, frozen) if self.verify_frozen else {}
            self._frozen_identity = {"keys": sorted(frozen), "parts": identity}
        checkpoint[META_KEY] = {
            "format": FORMAT_VERSION,
            "frozen_keys": list(self._frozen_identity["keys"]),
            "frozen": self._frozen_identity["parts"],
            "frozen_sources": self._sources(pl_module),
            "config": self._config(pl_module),
            "versions": library_versions(),
            "rng": rng,
            "rng_per_rank": _all_ranks(rng),
            "sharded": sharded,
            "rollouts_done": self._rollouts(trainer, pl_module),
            "global_step": trainer.global_step,
            "metrics": _scalar_metrics(trainer.callback_metrics),  # what was last logged (for a resume's summary)
        }
        # Lightning's copy of the hyperparameters may hold objects a weights-only load refuses
        if "hyper_parameters" in checkpoint:
            checkpoint["hyper_parameters"] = _plain(checkpoint["hyper_parameters"])

    def _config(self, pl_module: pl.LightningModule) -> dict:
        """The module's hyperparameters, its frozen reward calibration (not a hyperparameter of PPOModule) and
        the run config."""
        spec = getattr(pl_module, "calibration_spec", None)  # one measured in the run: compared by its settings
        calibration = {"measured_by": type(spec).__name__, **_plain(spec)} if spec is not None else _plain(
            getattr(pl_module, "calibration", None))
        return {"hparams": _plain(dict(pl_module.hparams)), "config": self.config, "calibration": calibration}

    @staticmethod
    def _sources(pl_module: pl.LightningModule) -> dict[str, str | None]:
        """Where the frozen parts come from, as far as the module says (PPOModule: base config, RM path)."""
        model_config = getattr(pl_module, "model_config", None)
        reward_path = getattr(pl_module, "_reward_source", None)  # a path, or a RewardAdapter holding one
        reward_path = getattr(reward_path, "path", reward_path)
        return {
            "model": getattr(model_config, "name_or_path", None) if model_config is not None else None,
            "reward_model": str(reward_path) if reward_path is not None else None,
        }

    # ------------------------------------------------------------------------------------------- read
    def verify(self, checkpoint: dict, path) -> None:
        """Refuse ``checkpoint`` (before Lightning restores anything) if its config, keys or frozen weights
        differ from this run's; the message names each difference."""
        meta = checkpoint.get(META_KEY)
        pl_module = self._pl_module
        if meta is None or pl_module is None:
            return
        problems = config_problems(meta["config"], self._config(pl_module), self.allowed_config_changes)
        # A sharded checkpoint's metadata has no state_dict: the strategy loaded the weights strictly (every key).
        expected = set(pl_module.state_dict()) if "state_dict" in checkpoint else set()
        stored = set(checkpoint.get("state_dict", ())) | set(meta["frozen_keys"])
        for label, keys in (("missing from the checkpoint", expected - stored),
                            ("in the checkpoint but not in this model", stored - expected)):
            if keys:
                problems.append(f"{len(keys)} weights {label}, e.g. {sorted(keys)[:3]}")
        if self.verify_frozen and meta["frozen"] and not stored - expected:
            now = frozen_identity(pl_module, meta["frozen_keys"])
            sources = self._sources(pl_module)
            for part, ident in meta["frozen"].items():
                if now.get(part, {}).get("sha256") != ident["sha256"]:
                    problems.append(
                        f"frozen weights of {part!r} differ: checkpoint sha256 {ident['sha256'][:16]} (loaded from "
                        f"{meta['frozen_sources'].get(part)!r}), this run {now.get(part, {}).get('sha256', '-')[:16]}"
                        f" (loaded from {sources.get(part)!r})"
                    )
        if problems:
            raise ValueError(f"cannot resume from {path}:\n  " + "\n  ".join(problems))
        versions = library_versions()
        changed = {k: (v, versions.get(k)) for k, v in meta["versions"].items() if versions.get(k) != v}
        if changed:
            rank_zero_warn(f"resuming from {path} with other library versions (checkpoint, now): {changed}; "
                           "the run may not continue bitwise")
        # The frozen weights are not in the checkpoint: they stay as configure_model loaded them (checked above).
        pl_module.strict_loading = False

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        meta = checkpoint.get(META_KEY)
        if meta is None:
            return
        if "state_dict" not in checkpoint:  # sharded: the checkpoint IO (and its verify) was not used
            self.verify(checkpoint, getattr(trainer, "ckpt_path", None))
        self._restored_metrics = dict(meta.get("metrics") or {})
        per_rank = meta.get("rng_per_rank") or [meta["rng"]]
        # this rank's stream; a run resumed on another number of ranks continues rank 0's on every rank
        self._next_rng = per_rank[trainer.global_rank] if len(per_rank) == trainer.world_size else meta["rng"]

    def state_dict(self) -> dict[str, Any]:
        return {"dirpath": str(self.dirpath), "last_model_path": self.last_model_path, "saved": list(self.saved)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_model_path = state_dict.get("last_model_path", "")
        self.saved = list(state_dict.get("saved", []))
