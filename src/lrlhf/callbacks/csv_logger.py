"""A CSV logger whose ``metrics.csv`` survives a restart in the same run folder (``logger=csv``).

Lightning's ``CSVLogger`` deletes an existing ``metrics.csv`` when its writer starts, so a run resumed with
``ckpt_path=last`` in its folder lost every row logged before the restart. :class:`ResumableCSVLogger` keeps them:
at its first save, rows of the earlier file at or after the first step the new run logs are dropped (a resumed run
logs the steps after its checkpoint again) and the rest stay, so every step's row is in the file once; a fresh run
in an old folder starts at step 0 and so replaces the old rows. The file is rewritten atomically.
"""

from __future__ import annotations

import csv
import io
import os

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from lrlhf.utils.io import atomic_write_text


class _KeepingWriter(ExperimentWriter):
    """Lightning's writer, less the deletion of an earlier ``metrics.csv``."""

    def _check_log_dir_exists(self) -> None:  # Lightning's deletes metrics.csv here (called by __init__)
        self._earlier: list[dict[str, str]] | None = None
        if os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, newline="", encoding="utf-8") as f:
                self._earlier = list(csv.DictReader(f))

    def save(self) -> None:
        if self._earlier is not None and self.metrics:
            first = min(m["step"] for m in self.metrics)
            kept = [row for row in self._earlier if row.get("step") and float(row["step"]) < first]
            keys = sorted({k for row in kept for k in row} | set(self.metrics_keys))
            text = io.StringIO()
            writer = csv.DictWriter(text, fieldnames=keys)
            writer.writeheader()
            writer.writerows(kept)
            atomic_write_text(self.metrics_file_path, text.getvalue())
            self.metrics_keys, self._earlier = keys, None
        super().save()


class ResumableCSVLogger(CSVLogger):
    """``CSVLogger`` (same arguments) whose ``metrics.csv`` keeps the rows of an interrupted run (module docstring)."""

    @property
    @rank_zero_experiment
    def experiment(self) -> _KeepingWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _KeepingWriter(log_dir=self.log_dir)
        return self._experiment


__all__ = ["ResumableCSVLogger"]
