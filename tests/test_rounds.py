"""Iterative RLHF through train.py (recipe=iterative_ppo, lrlhf.run.rounds): two tiny rounds (labelled by a pairwise
callable); the file-exchange annotator's round trip; a run stopped while waiting for labels and again by SIGTERM
inside a round's PPO stage, then resumed, ends with the same policy as an uninterrupted run, bitwise; no label is
on a held-out prompt."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["world=toy_tiny", "world.sizes.pref_train=40"]
TINY = ["recipe=iterative_ppo", "logger=csv", *SMALL, "rounds.settings.n=2", "rounds.settings.initial_labels=40",
        "rounds.settings.labels_per_round=20", "rounds.settings.ppo_steps=8", "rounds.settings.rm_steps=10",
        'stage_overrides.sft=["trainer.max_steps=10"]', "data.batch_size=8", "module.config.minibatch_size=8",
        "callbacks.early_stopping.every_n_rollouts=1", "callbacks.early_stopping.patience=null",
        "callbacks.checkpoint.every_n_rollouts=1"]
PAIRWISE = ["rounds/annotator=pairwise", "rounds.annotator.judge=cli_subclass:prefer_longer"]


def _env(tmp_path):
    return {**os.environ, "LRLHF_CACHE_DIR": str(tmp_path / "cache"), "WANDB_MODE": "offline",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}


def _train(tmp_path, *args, check=True):
    out = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, env=_env(tmp_path), capture_output=True,
                         text=True, timeout=600)
    if check:
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _world(tmp_path) -> Path:
    return next((tmp_path / "cache" / "worlds").iterdir())


def _same_policy(a: Path, b: Path) -> None:
    from safetensors.torch import load_file

    x, y = (load_file(p / "round_2" / "ppo" / "export" / "adapter" / "adapter_model.safetensors") for p in (a, b))
    assert x.keys() == y.keys() and [k for k in x if not torch.equal(x[k], y[k])] == []


@pytest.mark.slow
def test_two_rounds_then_file_exchange_and_resume_mid_round_equal_an_uninterrupted_run(tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    _check_two_tiny_rounds(tmp_path, straight, _train(tmp_path, *TINY, *PAIRWISE, f"hydra.run.dir={straight}"))

    exchange = ["rounds/annotator=file_exchange"]
    out = _train(tmp_path, *TINY, *exchange, f"hydra.run.dir={split}", check=False)
    to_label = split / "labelling" / "round_2.to_label.jsonl"
    assert out.returncode == 1 and "label the" in out.stderr and str(to_label) in out.stderr, out.stderr[-2000:]
    assert (split / "round_1" / "ppo" / "summary.json").is_file() and not (split / "round_2" / "rm").exists()
    rows = _jsonl(to_label)
    assert [r["id"] for r in rows] == list(range(len(rows))) and all(r["label"] is None for r in rows)
    drawn = _jsonl(split / "round_2" / "pairs.jsonl")  # kept: the resumed round labels these, never a new draw
    assert [(p["a"], p["b"]) for p in drawn] == [(r["chosen"][0]["content"], r["rejected"][0]["content"]) for r in rows]
    # a person labels (here by the straight run's rule), in another order, through the labelled file
    labelled = [{**r, "label": {1.0: 1, 0.0: 0, 0.5: 0.5}[_prefer(r)]} for r in reversed(rows)]
    (split / "labelling" / "round_2.labelled.jsonl").write_text("".join(json.dumps(r) + "\n" for r in labelled))

    # resumed: round 2 is labelled from the file; stopped again by SIGTERM inside round 2's PPO stage
    args = [sys.executable, "train.py", *TINY, *exchange, f"hydra.run.dir={split}", "ckpt_path=last"]
    proc = subprocess.Popen(args, cwd=ROOT, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    first_checkpoint = split / "round_2" / "ppo" / "checkpoints" / "rollout=000001.ckpt"
    deadline = time.monotonic() + 300
    while not first_checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, stdout[-3000:]
    assert "stopped on SIGTERM" in stdout and f"hydra.run.dir={split}" in stdout and "ckpt_path=last" in stdout
    assert not (split / "round_2" / "ppo" / "summary.json").exists()

    out = _train(tmp_path, *TINY, *exchange, f"hydra.run.dir={split}", "ckpt_path=last")
    assert "Restoring states from the checkpoint" in out.stdout + out.stderr
    assert _jsonl(split / "round_2" / "labels.jsonl") == _jsonl(straight / "round_2" / "labels.jsonl")
    _same_policy(straight, split)


def _check_two_tiny_rounds(tmp_path, run, out):
    """Two rounds labelled the policy's samples, refreshed the RM and continued PPO."""
    assert "== lrlhf iterative: done ==" in out.stdout and "| round |" in out.stdout
    summary = json.loads((run / "rounds.json").read_text())
    assert [row["round"] for row in summary] == [1, 2]
    first, second = _jsonl(run / "round_1" / "labels.jsonl"), _jsonl(run / "round_2" / "labels.jsonl")
    world = _world(tmp_path)
    assert first == [{**r, "round": 1} for r in _jsonl(world / "pref_train.jsonl")[:40]]
    assert 0 < len(second) <= 20 and {r["round"] for r in second} == {2}
    assert all(r["chosen"] != r["rejected"] and r["target"] in (0.5, 1.0) and "both_bad" not in r for r in second)
    # the round-2 pairs are samples of round 1's policy for prompts round 1 did not label, never held-out ones
    used = {json.dumps(r["prompt"]) for r in first}
    held_out = {json.dumps(r["prompt"]) for r in _jsonl(world / "eval_prompts.jsonl")}
    assert not {json.dumps(r["prompt"]) for r in second} & (used | held_out)
    # the RM of round 2 learned from both rounds' labels; round 2's PPO continued round 1's adapter, reference SFT
    assert len(_jsonl(run / "round_2" / "rm_train.jsonl")) == len(first) + len(second)
    ppo2 = (run / "round_2" / "ppo" / "config.yaml").read_text()
    assert f"init_adapter: {run}/round_1/ppo/export/adapter" in ppo2 and f"rm: {run}/round_2/rm" in ppo2
    rows = {row["round"]: row for row in summary}
    assert rows[2]["labels_total"] == len(first) + len(second) and "rm_accuracy_before" in rows[2]
    assert (run / "rounds.png").is_file() and (run / "rounds.md").read_text().count("\n") == 4


def _prefer(row: dict) -> float:
    from cli_subclass import prefer_longer

    return prefer_longer(None, row["chosen"][0]["content"], row["rejected"][0]["content"])


def test_a_second_launch_into_a_run_folder_with_rounds_is_refused(tmp_path):
    run = tmp_path / "run"
    (run / "round_1").mkdir(parents=True)
    out = _train(tmp_path, *TINY, f"hydra.run.dir={run}", check=False)
    assert out.returncode == 1 and "holds rounds of an earlier run" in out.stderr, out.stderr[-2000:]
