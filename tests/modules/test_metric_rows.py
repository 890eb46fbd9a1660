"""metrics.csv holds in a rollout's row what was logged for that rollout alone: a metric logged at some rollouts only
(a held-out evaluation every N rollouts) is not repeated in the rows after it (Lightning keeps a step metric's last
value until the epoch ends; PPOStage.on_train_batch_start forgets it)."""

# ruff: noqa: F811 -- the world / tokenizer fixtures come from test_ppo
import csv

import lightning.pytorch as pl
from lightning.pytorch.loggers import CSVLogger

from .test_ppo import _data, _fit, _module, tokenizer, world  # noqa: F401 (fixtures)


class EverySecond(pl.Callback):
    """Logs ``probe/second`` after rollouts 2 and 4 only (of 4), as the held-out evaluation logs every N rollouts."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if pl_module.rollouts_done % 2 == 0:
            pl_module.log("probe/second", float(pl_module.rollouts_done), batch_size=1)


def test_a_metric_logged_at_some_rollouts_is_in_their_rows_alone(world, tokenizer, tmp_path):
    module = _module(world, tokenizer)
    trainer = _fit(module, world, tokenizer, 4, tmp_path, logger=CSVLogger(tmp_path), callbacks=[EverySecond()])
    rows = list(csv.DictReader(open(f"{trainer.log_dir}/metrics.csv")))
    assert len(rows) == 4 and all(r["rollout/score"] != "" for r in rows)  # logged at every rollout: every row
    assert [r["probe/second"] for r in rows] == ["", "2.0", "", "4.0"]  # (before: "", 2.0, 2.0, 4.0)
    assert trainer.callback_metrics["probe/second"].item() == 4.0  # the last value stays for the callbacks


class AtFirst(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if pl_module.rollouts_done == 1:
            pl_module.log("probe/first", 1.0, batch_size=1)


def test_a_metric_logged_between_written_rows_reaches_the_next_row_once(world, tokenizer, tmp_path):
    module = _module(world, tokenizer)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, limit_train_batches=4, logger=CSVLogger(tmp_path),
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         log_every_n_steps=2, callbacks=[AtFirst()])  # rows after rollouts 2 and 4
    trainer.fit(module, datamodule=_data(world, tokenizer))
    rows = list(csv.DictReader(open(f"{trainer.log_dir}/metrics.csv")))
    assert [r["probe/first"] for r in rows] == ["1.0", ""]  # logged after rollout 1: in the row of rollout 2 alone
