"""train.py resumes SFT through ResumableCheckpoint (callbacks/default.yaml): another lr or batch size is refused, and
an SFT run stopped and resumed with ckpt_path=last exports the same weights as an uninterrupted one, bitwise."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["world=toy_tiny"]


def _train(tmp_path, *args, check=True):
    env = {**os.environ, "LRLHF_CACHE_DIR": str(tmp_path / "cache"), "WANDB_MODE": "offline",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    out = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    if check:
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


@pytest.mark.slow
def test_sft_resume_is_checked_and_equals_an_uninterrupted_run(tmp_path):
    from safetensors.torch import load_file

    # total_steps fixed: the cosine schedule must not depend on where the first part stopped (trainer.max_steps)
    common = ["recipe=sft", "logger=none", *SMALL, "data.batch_size=8", "+module.config.total_steps=4",
              "module.config.warmup_steps=1", "callbacks.checkpoint.every_n_rollouts=3"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    _train(tmp_path, *common, f"hydra.run.dir={straight}", "trainer.max_steps=4")
    # 8 batches per epoch: stopped mid-epoch, after step 2 (saved at the end of training, not a multiple of 3)
    _train(tmp_path, *common, f"hydra.run.dir={split}", "trainer.max_steps=2")
    last = split / "checkpoints" / "last.ckpt"
    assert last.is_symlink() and last.resolve().name == "rollout=000002.ckpt"

    for change, message in (("module.config.lr=0.001", "config.module.config.lr: checkpoint 0.003, this run 0.001"),
                            ("data.batch_size=4", "config.data.batch_size: checkpoint 8, this run 4")):
        out = _train(tmp_path, *common, f"hydra.run.dir={split}", "trainer.max_steps=4", "ckpt_path=last", change,
                     check=False)
        assert out.returncode != 0 and "cannot resume" in out.stderr and message in out.stderr, out.stderr[-3000:]

    out = _train(tmp_path, *common, f"hydra.run.dir={split}", "trainer.max_steps=4", "ckpt_path=last")
    assert "Restoring states from the checkpoint" in out.stdout + out.stderr
    assert last.resolve().name == "rollout=000004.ckpt"
    a = load_file(straight / "merged" / "model.safetensors")
    b = load_file(split / "merged" / "model.safetensors")
    assert a.keys() == b.keys() and [k for k in a if not torch.equal(a[k], b[k])] == []
