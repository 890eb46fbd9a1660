"""``recipe=grpo_constraints`` (#32) through train.py at a tiny size: the constraints world built from the real
prompt files in ``../shared/data`` (skipped when absent), GRPO with the prompt's constraint as the reward, the held-out
satisfaction of the start and of the policy with their intervals, the rule's pass rate per rollout."""

import csv
import json
from pathlib import Path

import pytest
from test_cli import _train

from lrlhf.data.constraints import KINDS, instruction

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
LIMITS = {"rl_prompts": 12, "sft_train": 12, "sft_val": 4, "eval_prompts": 8}


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED / "llama-factory" / "alpaca_en_demo.json").is_file(),
                    reason="../shared/data is absent (an outside clone)")
def test_grpo_on_instruction_constraints_runs_end_to_end(tmp_path, tiny_real_model):
    run = tmp_path / "run"
    out = _train(tmp_path, "recipe=grpo_constraints", "model=hf", f"model.name_or_path={tiny_real_model}",
                 "hparams=smollm2", "logger=csv", f"hydra.run.dir={run}",
                 *[f"world.limits.{k}={v}" for k, v in LIMITS.items()], "trainer.limit_train_batches=3",
                 "hparams.ppo.group_batch_size=4",  # 4 prompts x 8 samples: 3 rollouts are the 12 RL prompts
                 "module.config.max_new_tokens=8", "callbacks.early_stopping.every_n_rollouts=1")
    assert "plan: grpo_constraints 3 rollouts" in out.stdout and "building the constraints world" in out.stdout
    assert "trainer.limit_train_batches=N" in out.stdout  # the key that sets the run's length
    assert not (tmp_path / "cache" / "stages").exists()  # no SFT, no reward model: the instruct model is the start
    world = next((tmp_path / "cache" / "worlds").iterdir())
    report = json.loads((world / "world.json").read_text())
    assert report["prompts"] > 500 and set(report["eval_kinds"]) == set(KINDS)
    for line in (world / "eval_prompts.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert row["prompt"][-1]["content"].endswith(instruction(row["constraint"]))
    summary = json.loads((run / "summary.json").read_text())
    for name in ("sft", "grpo"):  # satisfaction of the start and of the policy on the held-out prompts
        lo, hi = summary[f"judge/{name}_interval"]
        assert 0.0 <= lo <= summary[f"judge/{name}"] <= hi <= 1.0
    rows = list(csv.DictReader((run / "logs" / "metrics.csv").open()))
    sampled = [float(r["rollout/groups_sampled"]) for r in rows if r.get("rollout/groups_sampled")]
    assert sampled == [4.0] * 3  # three rollouts of 4 groups each, dynamic sampling's count logged for every one
    rates = [float(r["reward/constraint"]) for r in rows if r.get("reward/constraint")]
    assert all(0.0 <= x <= 1.0 for x in rates)  # the rule's pass rate on the groups kept, where any was kept
