"""A clean stop on SIGTERM and SIGINT: at the next safe point, with a resumable checkpoint, saying how to resume.

A scheduler sends SIGTERM before it preempts a job or its time runs out (SLURM: on preemption, and with
``--signal=TERM@120`` 120 s before the limit); a user presses Ctrl+C (SIGINT). While ``fit`` trains,
:class:`StopOnSignal`:

1. on the first SIGTERM or SIGINT only sets a flag (and says so, on global rank 0);
2. at the next batch end -- PPO / RLOO / GRPO: after a whole rollout and its update epochs; SFT, RM, DPO: after
   an optimiser step (a batch that only accumulates gradients is not a boundary) -- the ranks agree whether any
   of them was signalled (one all-reduce per boundary), so every rank stops at the same boundary;
3. writes a resumable checkpoint there: through the run's :class:`~lrlhf.callbacks.ResumableCheckpoint`
   (``rollout=N.ckpt`` and ``last.ckpt``; reused when it has just written this boundary's), else ``last.ckpt`` in
   the first ``ModelCheckpoint``'s folder (what ``ckpt_path=last`` finds), else
   ``<default_root_dir>/checkpoints/last.ckpt``;
4. raises :class:`TrainingStopped`, a ``SystemExit`` with status 128 + the signal's number (143 for SIGTERM, 130
   for SIGINT): no export, no summary. ``lrlhf.run.cli.main`` prints :meth:`TrainingStopped.message`: the same
   command with ``hydra.run.dir=<run folder> ckpt_path=last``.

When: Lightning logs a step's metrics row after the batch-end hooks, so the stop raises only once the row is
logged -- at the next batch start (prompts only, before any rollout) or the end of training -- and
``ResumableCheckpoint``'s ``last.ckpt`` points at the boundary's checkpoint only then (a kill in between resumes
before the step). A boundary that ends in a validation stops after it (``on_validation_end``), its checkpoint
written after it: saved before, the resumed run would skip the validation and its row.

A second SIGINT raises ``KeyboardInterrupt`` at once (no new checkpoint; the last periodic one stands); a second
SIGTERM changes nothing (the stop is under way).

Lightning's own SIGTERM handling (it sets ``trainer.received_sigterm`` and raises ``SIGTERMException`` after the
batch, writing no checkpoint) is set aside while training runs: the handlers are installed at
``on_train_start``, after the Trainer registered its own at fit start, and put back at ``on_train_end`` or
``on_exception``, before the Trainer restores the ones it found. A SIGTERM Lightning caught before
``on_train_start`` (during the fit's setup: a PPO run's reward calibration) is taken over and Lightning's flag cleared
(:func:`lrlhf.utils.compat.take_over_sigterm`): left set, its loop ended the process after the first batch with
status 0 and no message. A SIGTERM during a stage's test outside training is Lightning's: ``lrlhf.run.cli.main``
ends the launch with 143 and a line when its loop raises; one on the test's last batch is not seen (see issue notes).

The callback runs last at a batch end (at ``setup`` it moves itself to the end of ``trainer.callbacks``): the
checkpoint, early-stopping and KL callbacks have done this boundary's work, so the checkpoint is the one the
periodic callback would write here and the resumed run equals an uninterrupted one.
"""

from __future__ import annotations

import os
import shlex
import signal
import threading
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from lrlhf.callbacks.checkpoint import ResumableCheckpoint, atomic_save_checkpoint
from lrlhf.utils.compat import take_over_sigterm, validates_after_this_batch
from lrlhf.utils.launch_signals import take_pending

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TrainingStopped(SystemExit):
    """Training stopped on a signal at a safe point, after writing ``checkpoint`` (exit status 128 + signal).

    Attributes: ``signal_name``; ``stage`` (e.g. ``"ppo"``, or None); ``unit`` (``"rollout"`` or ``"step"``);
    ``done`` (rollouts or optimiser steps completed); ``checkpoint``; ``run_dir`` (the Trainer's
    ``default_root_dir``); ``resume_key`` (``ckpt_path=last`` or the checkpoint's path); ``global_zero``.
    """

    def __init__(self, signum: int, stage: str | None, unit: str, done: int, checkpoint: Path, run_dir: str,
                 resume_key: str, global_zero: bool):
        super().__init__(128 + int(signum))
        self.signal_name = signal.Signals(signum).name
        self.stage, self.unit, self.done = stage, unit, done
        self.checkpoint, self.run_dir, self.resume_key, self.global_zero = checkpoint, run_dir, resume_key, global_zero

    def message(self, args: list[str], prog: str = "python train.py") -> str:
        """What to tell the user, given the command's arguments (``train.py`` overrides) and how it was launched
        (``prog``: ``python train.py`` or ``lrlhf train``)."""
        stage = f"the `{self.stage}` stage" if self.stage else "training"
        if not Path(self.checkpoint).exists():  # a needed stage's build folder: removed, nothing half-built is kept
            return (f"stopped on {self.signal_name} while building {stage} ({self.unit} {self.done}); a needed stage "
                    "is cached only once complete, so the same command builds it again from its start:\n"
                    f"  {_command(args, prog)}")
        keep = [a for a in args if a.lstrip("+").split("=", 1)[0] not in ("hydra.run.dir", "ckpt_path")]
        resume = _command([*keep, f"hydra.run.dir={self.run_dir}", f"ckpt_path={self.resume_key}"], prog)
        return (f"stopped on {self.signal_name} after {self.unit} {self.done} of {stage}; checkpoint: "
                f"{self.checkpoint}\nresume with:\n  {resume}")


def _command(args: list[str], prog: str) -> str:
    return " ".join([prog, *(shlex.quote(a) for a in args)])


class StopOnSignal(Callback):
    """Stop training at the next safe point on SIGTERM / SIGINT, with a resumable checkpoint (module docstring).

    Args:
        stage: the stage's name, for the message (e.g. ``"ppo"``).
    """

    def __init__(self, stage: str | None = None):
        self.stage = stage
        self.received: int | None = None
        self._previous: dict[int, object] = {}
        self._announce = True
        self._step_at_batch_start = -1
        self._stopping: int | None = None  # the signal of a stop decided at a boundary, raised once its row is logged
        self._checkpoint: tuple[Path, str] | None = None

    # ----------------------------------------------------------------------------------- handlers
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # last at every hook: rebinding (not mutating) the list the Trainer is iterating over right now
        trainer.callbacks = [c for c in trainer.callbacks if c is not self] + [self]

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        lightning = take_over_sigterm(trainer)  # Lightning's flag, cleared: taken over
        earlier = take_pending()  # the launch's: a SIGTERM in an earlier Trainer's held-out loop of this stage
        self.received = signal.SIGTERM if lightning or earlier is not None else None
        self._announce = trainer.is_global_zero
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame) -> None:
        if signum == signal.SIGINT and self.received is not None:
            self._restore()
            raise KeyboardInterrupt
        if self.received is not None:
            return
        self.received = signum
        if self._announce:  # os.write: a print here could re-enter a write the signal interrupted
            what = "SIGINT (Ctrl+C)" if signum == signal.SIGINT else signal.Signals(signum).name
            again = "; Ctrl+C again stops at once, without one" if signum == signal.SIGINT else ""
            os.write(2, f"\n{what}: stopping at the next safe point with a checkpoint{again}\n".encode())

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            if signal.getsignal(signum) == self._handle and handler is not None:
                signal.signal(signum, handler)
        self._previous = {}

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._stopping is not None:
            self._stop(trainer, pl_module)
        self._restore()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._restore()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore()

    # ---------------------------------------------------------------------------------- the stop
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._stopping is not None:  # the boundary's row is logged now
            self._stop(trainer, pl_module)
        self._step_at_batch_start = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not hasattr(pl_module, "rollouts_done") and trainer.global_step == self._step_at_batch_start:
            return  # mid gradient accumulation (the same on every rank): the gradients would be in no checkpoint
        if not trainer.strategy.reduce_boolean_decision(self.received is not None, all=False):
            return
        self._stopping = self.received if self.received is not None else signal.SIGTERM  # another rank's signal
        if not validates_after_this_batch(trainer):  # else saved after the validation (on_validation_end)
            self._checkpoint = self._save(trainer, pl_module)

    def on_validation_end(self, trainer, pl_module) -> None:
        if self._stopping is not None and not trainer.sanity_checking:
            self._stop(trainer, pl_module)

    def _stop(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._checkpoint is None:  # the boundary's validation: after it, or it did not run after all
            self._checkpoint = self._save(trainer, pl_module)
        checkpoint, resume_key = self._checkpoint
        resumable = next((c for c in trainer.checkpoint_callbacks if isinstance(c, ResumableCheckpoint)), None)
        if resumable is not None:
            resumable.point_last(trainer, checkpoint)
        signum, self._stopping, self._checkpoint = self._stopping, None, None
        self._restore()
        rollouts = getattr(pl_module, "rollouts_done", None)
        unit, done = ("rollout", int(rollouts)) if rollouts is not None else ("step", trainer.global_step)
        raise TrainingStopped(signum, self.stage, unit, done, checkpoint, str(trainer.default_root_dir), resume_key,
                              trainer.is_global_zero)

    @staticmethod
    def _save(trainer: pl.Trainer, pl_module: pl.LightningModule) -> tuple[Path, str]:
        """Write the checkpoint (a collective); its path and the ``ckpt_path`` value that resumes from it. A
        ``ResumableCheckpoint``'s ``last.ckpt`` is left for :meth:`_stop` to point, once the step's row is logged."""
        callbacks = trainer.checkpoint_callbacks
        resumable = next((c for c in callbacks if isinstance(c, ResumableCheckpoint)), None)
        if resumable is not None:
            rollouts = ResumableCheckpoint._rollouts(trainer, pl_module)
            path = Path(resumable.dirpath) / f"rollout={rollouts:06d}.ckpt"
            if resumable.last_model_path != str(path):  # not written at this boundary by the periodic save
                path = resumable.save(trainer, rollouts, point_last=False)
            return path, "last"
        plain = next((c for c in callbacks if isinstance(c, ModelCheckpoint) and c.dirpath), None)
        if plain is not None:
            path = Path(plain.dirpath) / f"{plain.CHECKPOINT_NAME_LAST}{plain.FILE_EXTENSION}"
            return atomic_save_checkpoint(trainer, path), "last"
        path = Path(trainer.default_root_dir) / "checkpoints" / "last.ckpt"
        if trainer.is_global_zero:
            path.parent.mkdir(parents=True, exist_ok=True)
        trainer.strategy.barrier("StopOnSignal.save")
        return atomic_save_checkpoint(trainer, path), str(path)
