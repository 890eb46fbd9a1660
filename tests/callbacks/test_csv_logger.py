"""ResumableCSVLogger: a restart in the run folder keeps the rows logged before it, each step's row once."""

import csv

from lrlhf.callbacks import ResumableCSVLogger


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _log(root, steps, value):
    logger = ResumableCSVLogger(save_dir=str(root), name="logs", version="")
    for step in steps:
        logger.log_metrics({"loss": value + step}, step=step)
    logger.save()
    return logger


def test_a_restart_keeps_the_earlier_rows_and_logs_the_resumed_steps_once(tmp_path):
    first = _log(tmp_path, range(6), 100.0)  # killed after step 5, its last checkpoint at step 3
    path = first.experiment.metrics_file_path
    _log(tmp_path, [4, 5, 6, 7], 200.0)  # resumed from step 3: steps 4 and 5 run again
    rows = _rows(path)
    assert [int(r["step"]) for r in rows] == list(range(8))
    assert [float(r["loss"]) for r in rows] == [100.0 + s for s in range(4)] + [200.0 + s for s in range(4, 8)]


def test_new_keys_after_a_restart_extend_the_header(tmp_path):
    _log(tmp_path, range(2), 0.0)
    logger = ResumableCSVLogger(save_dir=str(tmp_path), name="logs", version="")
    logger.log_metrics({"loss": 1.0, "kl": 0.5}, step=2)
    logger.save()
    rows = _rows(logger.experiment.metrics_file_path)
    assert [r["step"] for r in rows] == ["0", "1", "2"] and rows[2]["kl"] == "0.5" and rows[0]["kl"] == ""


def test_a_fresh_run_in_an_old_folder_replaces_its_rows(tmp_path):
    _log(tmp_path, range(5), 0.0)
    logger = _log(tmp_path, range(2), 50.0)
    assert [float(r["loss"]) for r in _rows(logger.experiment.metrics_file_path)] == [50.0, 51.0]
