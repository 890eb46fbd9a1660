"""Concurrent launches: a run folder is held by the launch that runs in it (a second launch into it is refused,
naming the first; a killed launch's hold goes with it), and two launches needing the same stage build it once (the
other waits and reuses it), never a torn cache entry."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_cli import ROOT, _tiny, _train

from lrlhf.utils.locks import OwnedLock

HOLD = """
import sys, time
from lrlhf.utils.locks import OwnedLock
lock = OwnedLock(sys.argv[1])
assert lock.acquire()
print("held", flush=True)
time.sleep(600)
"""


def _holder(path: Path) -> subprocess.Popen:
    """Another process holding the lock at ``path`` until killed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True, env=env)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_lock_names_its_owner_and_goes_with_a_killed_process(tmp_path):
    path = tmp_path / "run" / ".lrlhf.lock"
    holder = _holder(path)
    try:
        lock = OwnedLock(path)
        assert not lock.acquire() and not lock.held
        assert lock.owner().startswith(f"pid {holder.pid} on ")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # the kernel released it with the process: taken over at once, the owner now this process
    assert lock.acquire() and lock.held and lock.owner().startswith(f"pid {os.getpid()} on ")
    second = OwnedLock(path)
    assert not second.acquire()  # exclusive within one process too
    lock.release()
    assert not lock.owner_file.exists() and second.acquire()
    second.release()


@pytest.mark.slow
def test_a_second_launch_into_a_held_run_folder_is_refused_naming_the_first(tmp_path):
    run = tmp_path / "run"
    holder = _holder(run / ".lrlhf.lock")
    try:
        out = _train(tmp_path, "recipe=sft", *_tiny("sft"), f"hydra.run.dir={run}", check=False)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert out.returncode == 1
    assert (f"lrlhf: error: the run folder {run} is in use by another launch (pid {holder.pid} on " in out.stderr
            and "give this one another folder (hydra.run.dir=...)" in out.stderr), out.stderr[-2000:]
    assert not (run / "summary.json").exists()
    # the holder was killed: the next launch takes the folder over and runs
    out = _train(tmp_path, "recipe=sft", *_tiny("sft"), f"hydra.run.dir={run}")
    assert (run / "summary.json").is_file() and not (run / ".lrlhf.lock.owner").exists()


@pytest.mark.slow
def test_two_launches_needing_one_stage_build_it_once(tmp_path):
    """The second launch plans the SFT stage while the first is building it: it waits, then reuses the entry."""
    shared = [*_tiny("rm"), 'stage_overrides.sft=["trainer.max_steps=300"]']  # long enough to overlap
    env = {**os.environ, "LRLHF_CACHE_DIR": str(tmp_path / "cache"), "WANDB_MODE": "offline",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    launches = []
    for name, log in zip("ab", logs, strict=True):
        with open(log, "w") as out:
            launches.append(subprocess.Popen([sys.executable, "train.py", "recipe=rm", *shared,
                                              f"hydra.run.dir={tmp_path / name}"], cwd=ROOT, env=env, stdout=out,
                                             stderr=subprocess.STDOUT))
        if name == "a":  # b starts once a holds the SFT stage
            deadline = time.monotonic() + 120
            while "building the `sft` stage" not in logs[0].read_text():
                assert time.monotonic() < deadline and launches[0].poll() is None, logs[0].read_text()[-2000:]
                time.sleep(0.2)
    codes = [launch.wait(timeout=600) for launch in launches]
    a, b = (log.read_text() for log in logs)
    assert codes == [0, 0], (a[-2000:], b[-2000:])
    assert "building the `sft` stage" in a and "building the `sft` stage" not in b
    assert "waiting for the `sft` stage another launch is building (pid " in b
    assert "reusing the `sft` stage another launch built meanwhile" in b
    entries = sorted(p.name for p in (tmp_path / "cache" / "stages").iterdir())
    assert [e for e in entries if e.startswith("sft-")] == [Path(b.split("reusing the `sft` stage another launch "
                                                                 "built meanwhile: ")[1].split()[0]).name], entries
    assert not [e for e in entries if e.endswith(".building")], entries  # nothing half-built left
