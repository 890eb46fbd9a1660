"""Progress in the user's units, on Lightning's progress-bar machinery (a ``TQDMProgressBar``).

:class:`RunProgressBar` draws one bar per ``fit`` (the CLI trains by steps with ``max_epochs=-1``, so an epoch
count has no total and is not shown) and counts

- **rollouts** for a module with ``rollouts_done`` (PPO, RLOO, GRPO): ``N`` = rollouts done + the optimiser steps
  left (``max_steps - global_step``) / the steps one rollout makes (``updates_per_rollout`` of the batch size),
  bounded by the batches left when ``max_epochs`` or ``limit_train_batches`` bound the run; re-estimated after
  every rollout. After it: the last rollout's reward-model score and KL (``rollout/score``, ``rollout/kl_seq``)
  and the held-out utility when it was last measured (by ``HeldOutUtilityEarlyStopping``), with its rollout::

      ppo rollout 12/80 |███             | ETA 03:10 [00:41, 3.41s/rollout, reward=0.412, kl=1.93, held-out=0.521@10]

- **optimiser steps** otherwise (SFT, RM, DPO), out of ``trainer.estimated_stepping_batches``, with the metrics the
  module logs to the progress bar.

The bar of a resumed run starts where the checkpoint left off (its ETA counts only this run's pace). Validation
keeps Lightning's own bar on a terminal, and shows none into a file or a pipe. On a terminal the bar is redrawn at
every update; into a file or a pipe (a scheduler's log) at most every ``log_interval`` seconds, and once at the
end, where it stays as the stage's line: how far it went and how long it took. The bar updates after the other
callbacks at a batch end (it moves itself behind them at ``setup``, before :class:`~lrlhf.callbacks.StopOnSignal`),
so a held-out evaluation at this rollout is on this rollout's line; log lines and warnings go above the bar
(``lrlhf.utils.console``).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

from lrlhf.callbacks.early_stopping import HeldOutUtilityEarlyStopping
from lrlhf.callbacks.stop import StopOnSignal
from lrlhf.utils.console import route_logs_around_bars, stdout_is_terminal


def rollout_plan(trainer: pl.Trainer, pl_module: pl.LightningModule) -> int | None:
    """The number of rollouts this fit will have made when it ends (None: unbounded), from where it is now."""
    done = int(pl_module.rollouts_done)
    left: list[float] = []
    if trainer.max_steps is not None and trainer.max_steps >= 0:
        batch_size = getattr(trainer.datamodule, "batch_size", None)
        per_rollout = pl_module.updates_per_rollout(batch_size) if batch_size and hasattr(
            pl_module, "updates_per_rollout") else None
        if not per_rollout and done:  # measured: the steps of the rollouts so far
            per_rollout = trainer.global_step / done
        if per_rollout:
            left.append(math.ceil(max(trainer.max_steps - trainer.global_step, 0) / per_rollout))
    batches = trainer.num_training_batches
    if trainer.max_epochs is not None and trainer.max_epochs >= 0 and math.isfinite(batches):
        seen = trainer.fit_loop.epoch_loop.total_batch_idx + 1  # batches taken so far (a resumed run's too)
        left.append(max(batches * trainer.max_epochs - seen, 0))
    return done + int(min(left)) if left else None


class RunProgressBar(TQDMProgressBar):
    """One bar per fit, in rollouts or optimiser steps, with an ETA (see the module docstring).

    Args:
        stage: the bar's label (e.g. ``"ppo"``); default: the module's class name.
        log_interval: seconds between redraws when the output is not a terminal.
        refresh_rate: redraw every n-th batch (Lightning's meaning); 0 disables the bar.
    """

    TRAIN_FORMAT = "{desc} {unit} {n_fmt}/{total_fmt} |{bar:20}| ETA {remaining} [{elapsed}, {rate_fmt}{postfix}]"

    def __init__(self, stage: str | None = None, log_interval: float = 30.0, refresh_rate: int = 1):
        super().__init__(refresh_rate=refresh_rate)
        self.stage = stage
        self.log_interval = log_interval
        self._drawn_at = 0.0
        self._interactive = False

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        route_logs_around_bars()  # a callback's log line goes above the bar, not into it
        # after the other callbacks at a batch end (the held-out utility of this rollout is measured by then), before
        # StopOnSignal (last); rebinding, not mutating, the list the Trainer iterates over right now
        stops = [c for c in trainer.callbacks if isinstance(c, StopOnSignal)]
        trainer.callbacks = [c for c in trainer.callbacks if c is not self and c not in stops] + [self, *stops]

    # -------------------------------------------------------------------------------------- counting
    def progress(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> tuple[str, int, int | None]:
        """``(unit, done, total)``: rollouts for a module with ``rollouts_done``, optimiser steps otherwise."""
        if hasattr(pl_module, "rollouts_done"):
            return "rollout", int(pl_module.rollouts_done), rollout_plan(trainer, pl_module)
        total = trainer.estimated_stepping_batches
        return "step", trainer.global_step, int(total) if math.isfinite(total) else None

    def postfix(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, str]:
        """What follows the bar: reward, KL and the held-out utility for rollouts; the progress-bar metrics else."""
        if not hasattr(pl_module, "rollouts_done"):
            metrics = self.get_metrics(trainer, pl_module)
            metrics.pop("v_num", None)
            return {k: f"{v:.4g}" if isinstance(v, float) else str(v) for k, v in metrics.items()}
        found = trainer.callback_metrics
        out = {label: f"{float(found[key]):.3f}" for label, key in (("reward", "rollout/score"),
                                                                    ("kl", "rollout/kl_seq")) if key in found}
        stopper = next((c for c in trainer.callbacks if isinstance(c, HeldOutUtilityEarlyStopping)), None)
        if stopper is not None and stopper.history:
            last = stopper.history[-1]
            out["held-out"] = f"{last['utility']:.3f}@{last['rollout']}"
        return out

    # ------------------------------------------------------------------------------------------ bar
    def init_train_tqdm(self) -> Tqdm:
        trainer, pl_module = self.trainer, self.trainer.lightning_module
        unit, done, total = self.progress(trainer, pl_module)
        self._drawn_at = time.monotonic()
        self._interactive = stdout_is_terminal()
        return Tqdm(desc=self.stage or type(pl_module).__name__, unit=unit, initial=done, total=total,
                    position=2 * self.process_position, disable=self.is_disabled, leave=True, dynamic_ncols=True,
                    file=sys.stdout, smoothing=0, bar_format=self.TRAIN_FORMAT)

    def init_validation_tqdm(self) -> Tqdm:
        """Lightning's validation bar on a terminal; none into a file or a pipe, where each of its redraws would
        be a line of its own (``Validation DataLoader 0: 100%|...`` after every SFT and RM validation)."""
        return super().init_validation_tqdm() if stdout_is_terminal() else Tqdm(disable=True, file=sys.stdout)

    def init_sanity_tqdm(self) -> Tqdm:  # the sanity check's validation bar, alike
        return super().init_sanity_tqdm() if stdout_is_terminal() else Tqdm(disable=True, file=sys.stdout)

    def on_train_epoch_start(self, trainer: pl.Trainer, *_: Any) -> None:
        pass  # one bar for the whole fit (TQDMProgressBar resets it per epoch)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._update(trainer, pl_module, final=False)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        pass

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._update(trainer, pl_module, final=True)
        self.train_progress_bar.close()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self._train_progress_bar is not None and not self._train_progress_bar.disable:
            self._update(trainer, pl_module, final=True)
            self._train_progress_bar.close()

    def _update(self, trainer: pl.Trainer, pl_module: pl.LightningModule, final: bool) -> None:
        bar = self._train_progress_bar
        if bar is None or bar.disable:
            return
        _, done, total = self.progress(trainer, pl_module)
        bar.total = total
        bar.n = done
        bar.set_postfix(self.postfix(trainer, pl_module), refresh=False)
        now = time.monotonic()
        due = self._interactive or now - self._drawn_at >= self.log_interval
        if final or (due and self._should_update(done, total or 0)):
            bar.refresh()
            self._drawn_at = now


def console_callbacks(stage: str | None, callbacks: list[Callback], progress_bar: bool = True) -> list[Callback]:
    """The callbacks every CLI stage gets on top of ``callbacks`` (those of its config): the progress bar (unless
    ``progress_bar`` is off, the trainer's ``enable_progress_bar``, or ``callbacks`` has one) and the clean stop
    (unless there is one)."""
    from lightning.pytorch.callbacks import ProgressBar

    extra: list[Callback] = []
    if progress_bar and not any(isinstance(c, ProgressBar) for c in callbacks):
        extra.append(RunProgressBar(stage=stage))
    if not any(isinstance(c, StopOnSignal) for c in callbacks):
        extra.append(StopOnSignal(stage=stage))
    return extra
