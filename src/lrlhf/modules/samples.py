"""The fixed-prompt sample table shared by the modules that generate (SFT, PPO).

Every N steps a module generates on its fixed prompts and logs one row per prompt: step, temperature,
prompt, response and, for toy-world prompts (``meta["task"]``), the gold utility.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import lightning.pytorch as pl

from lrlhf.data.records import PromptExample
from lrlhf.models.generation import SamplingConfig, generate_responses

COLUMNS = ["step", "temperature", "prompt", "response", "gold_utility"]


def gold_utility_or_none(prompt: PromptExample, response: str) -> float | None:
    """The toy world's gold utility of ``response`` when the prompt carries a task, else None."""
    if "task" not in prompt.meta:
        return None
    from lrlhf.data.toy import gold_utility  # only toy-world prompts carry a task

    return gold_utility(prompt.meta["task"], response)


def sample_table(
    model, tokenizer, prompts: Sequence[PromptExample], sampling: SamplingConfig, step: int
) -> tuple[list[str], list[list]]:
    """Generate one response per prompt: ``(columns, rows)`` as in :data:`COLUMNS`."""
    responses = generate_responses(model, tokenizer, prompts, sampling)
    rows = []
    for prompt, response in zip(prompts, responses, strict=True):
        text = prompt.prompt[-1]["content"] if prompt.prompt else ""
        rows.append([step, sampling.temperature, text, response, gold_utility_or_none(prompt, response)])
    return list(COLUMNS), rows


def log_table(module: pl.LightningModule, key: str, columns: list[str], rows: list[list]) -> None:
    """``logger.log_table`` where a logger has it (W&B), else append to ``<log_dir>/<key>.csv`` on rank 0."""
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
