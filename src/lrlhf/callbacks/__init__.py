"""Callbacks that observe and decide: early stopping on held-out utility, resumable checkpoints,
the sample table (prompt, response, reward, judge, KL);
and the console's: progress in rollouts or steps, a clean stop on SIGTERM / SIGINT (``console_callbacks``).

Each takes plain keyword arguments, so a Hydra ``callbacks/<name>.yaml`` with a ``_target_`` builds it.
"""

from lrlhf.callbacks.checkpoint import ResumableCheckpoint, atomic_save_checkpoint
from lrlhf.callbacks.csv_logger import ResumableCSVLogger
from lrlhf.callbacks.early_stopping import HeldOutUtilityEarlyStopping
from lrlhf.callbacks.progress import RunProgressBar, console_callbacks
from lrlhf.callbacks.reward_audit import HighRewardAudit
from lrlhf.callbacks.samples import SampleTable
from lrlhf.callbacks.stop import StopOnSignal, TrainingStopped
from lrlhf.eval.plots import plot_goodhart  # kept importable from here; it lives in eval/plots.py

__all__ = [
    "HeldOutUtilityEarlyStopping",
    "HighRewardAudit",
    "ResumableCSVLogger",
    "ResumableCheckpoint",
    "RunProgressBar",
    "SampleTable",
    "StopOnSignal",
    "TrainingStopped",
    "atomic_save_checkpoint",
    "console_callbacks",
    "plot_goodhart",
]
