"""Tables logged during training (the sample table, the high-reward audit): to a logger that takes tables, else to a
CSV file in the log folder."""

from __future__ import annotations

import csv
from pathlib import Path


def log_table(module, key: str, columns: list[str], rows: list[list]) -> None:
    """``logger.log_table`` for each of a LightningModule's loggers that has it (W&B), else append ``rows`` to
    ``<log_dir>/<key>.csv`` on global rank 0 (the header when the file is new)."""
    trainer = module.trainer
    wrote = False
    for logger in module.loggers:
        if hasattr(logger, "log_table"):
            logger.log_table(key=key, columns=columns, data=rows, step=trainer.global_step)
            wrote = True
    log_dir = trainer.log_dir  # a collective under DDP: every rank asks
    if not wrote and trainer.is_global_zero and log_dir is not None:
        path = Path(log_dir) / f"{key}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        new = not path.exists()
        with path.open("a", newline="") as f:
            writer = csv.writer(f)
            if new:
                writer.writerow(columns)
            writer.writerows(rows)


__all__ = ["log_table"]
