"""``jobs=N``: needed stages built several at a time, each in a process of its own (lrlhf.run.parallel)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict
from test_cli import EVAL_TINY, _compose, _train

from lrlhf.run import parallel, stage_worker
from lrlhf.run.parallel import StageBuildFailed, build_stages, check_jobs

# A stand-in for a stage build: records when it ran, sleeps, then leaves a finished stage (its summary.json), or
# exits with the status its recipe names ("fail3": 3) after writing a line to its console.
FAKE = """
import json, sys, time
from pathlib import Path
spec = Path(sys.argv[1]); meta = json.loads(spec.with_suffix(".json").read_text()); out = Path(meta["out_dir"])
start = time.monotonic()
spec.with_suffix(".pid").write_text(str(__import__("os").getpid()))
if meta["recipe"].startswith("fail"):
    print("a traceback the stage printed"); sys.exit(int(meta["recipe"][4:]))
time.sleep(float(meta["recipe"].split("_")[-1]))
out.mkdir(parents=True); (out / "summary.json").write_text("{}")
with open(spec.parent / "times.jsonl", "a") as f:
    f.write(json.dumps({"recipe": meta["recipe"], "start": start, "end": time.monotonic()}) + "\\n")
"""


def _fake(spec: Path) -> list[str]:
    return [sys.executable, "-c", FAKE, str(spec)]


def _stage(cache: Path, recipe: str, *reads: str, trainer=None):
    dep = OmegaConf.create({"deps": {r: str(cache / r) for r in reads}, "paths": {"run_dir": str(cache / recipe)},
                            **({"trainer": trainer} if trainer else {})})
    return recipe, dep, cache / recipe


def _steps():
    return (f"[{k}/9]" for k in range(1, 10))


def test_stages_start_when_what_they_read_is_built_and_never_more_than_jobs_at_once(tmp_path, capsys):
    cache, run = tmp_path / "stages", tmp_path / "run"
    # plan order: a, b and e read nothing, c reads a and b, d reads a
    todo = [_stage(cache, "a_2"), _stage(cache, "b_2"), _stage(cache, "c_0.1", "a_2", "b_2"),
            _stage(cache, "d_0.1", "a_2"), _stage(cache, "e_0.3")]
    build_stages(todo, 2, run, [], _steps(), command=_fake, poll_s=0.05)
    times = {r["recipe"]: r for r in map(json.loads, (run / "stage_logs" / "times.jsonl").read_text().splitlines())}
    assert set(times) == {"a_2", "b_2", "c_0.1", "d_0.1", "e_0.3"}
    a, b, c, d = (times[k] for k in ("a_2", "b_2", "c_0.1", "d_0.1"))
    assert a["start"] < b["end"] and b["start"] < a["end"]  # a and b built at once
    assert c["start"] >= max(a["end"], b["end"]) and d["start"] >= a["end"]  # each after what it reads
    spans = sorted((r["start"], r["end"]) for r in times.values())
    assert all(sum(s <= t < e for s, e in spans) <= 2 for t, _ in spans)  # jobs=2: never three at once
    out = capsys.readouterr().out
    assert out.count("building the `") == 5 and out.count("a process of its own") == 5 and "[5/9] building" in out


def test_free_workers_take_first_what_more_stages_wait_for_then_the_longest(tmp_path):
    cache = tmp_path / "stages"
    # frontier's shape: sft <- pairs <- rm <- {ppo, weak_kl}, pairs <- dpo, sft <- gold; plan order as the recipe's
    todo = [_stage(cache, "sft", trainer={"max_steps": 32}), _stage(cache, "pairs", "sft"),
            _stage(cache, "rm", "pairs", trainer={"max_steps": 192}),
            _stage(cache, "dpo", "sft", "pairs", trainer={"max_steps": 88}),
            _stage(cache, "ppo", "sft", "rm", trainer={"max_steps": 80}),
            _stage(cache, "gold", "sft", trainer={"max_steps": -1, "limit_train_batches": 30, "max_epochs": 4}),
            _stage(cache, "weak_kl", "sft", "rm", trainer={"max_steps": 800})]
    # the pairs (3 stages wait on them through the RM) before nothing-waits; among the leaves the longest first:
    # weak_kl 800, gold 30 x 4 = 120 batches, dpo 88, ppo 80
    assert [r for r, _, _ in parallel.start_order(todo)] == ["sft", "pairs", "rm", "weak_kl", "gold", "dpo", "ppo"]
    assert [r for r, _, _ in parallel.start_order(todo[::-1])][:3] == ["sft", "pairs", "rm"]
    # and so on one worker (jobs=1 of build_stages) the long leaf is built before the short one planned earlier
    run = tmp_path / "run"
    build_stages([_stage(cache, "short_0.1", trainer={"max_steps": 2}), _stage(cache, "long_0.1",
                  trainer={"max_steps": 9})], 1, run, [], _steps(), command=_fake, poll_s=0.05)
    started = [json.loads(line)["recipe"] for line in (run / "stage_logs" / "times.jsonl").read_text().splitlines()]
    assert started == ["long_0.1", "short_0.1"]


def test_a_failed_stage_starts_nothing_more_lets_the_running_ones_finish_and_stops_the_run(tmp_path, capsys):
    cache, run = tmp_path / "stages", tmp_path / "run"
    todo = [_stage(cache, "slow_2"), _stage(cache, "fail3"), _stage(cache, "after_0.1", "fail3"),
            _stage(cache, "x_0.1")]
    with pytest.raises(StageBuildFailed) as err:
        build_stages(todo, 2, run, [], _steps(), command=_fake, poll_s=0.05)
    message = str(err.value)
    assert "`fail3` stage failed (exit status 3)" in message and str(run / "stage_logs" / "fail3.log") in message
    assert "a traceback the stage printed" in message
    assert "waiting for the 1 other stage build(s) to finish" in capsys.readouterr().err
    assert (cache / "slow_2" / "summary.json").is_file()  # hours of another stage's work are kept
    assert not (cache / "after_0.1").exists() and not (cache / "x_0.1").exists()  # nothing started after the failure


def test_a_stopped_launch_stops_its_builds_a_stubborn_one_killed(tmp_path, monkeypatch):
    monkeypatch.setattr(parallel, "STOP_GRACE_S", 1.0)
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                 "signal.SIG_IGN); print(flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    stubborn.stdout.readline()  # its handler is set
    start = time.monotonic()
    parallel._stop({"a": ("a", polite, None, 0), "b": ("b", stubborn, None, 0)})
    assert polite.poll() == -signal.SIGTERM and stubborn.poll() == -signal.SIGKILL and time.monotonic() - start < 10


def test_sigterm_to_the_launch_stops_every_build_and_names_the_signal(tmp_path):
    script = f"""
import sys; sys.path[:0] = {[str(Path(__file__).parent)]!r}
from pathlib import Path
from test_parallel import _fake, _stage, _steps
from lrlhf.run.parallel import build_stages
from lrlhf.utils.launch_signals import Stopped
cache = Path({str(tmp_path / "stages")!r})
try:
    build_stages([_stage(cache, "a_60"), _stage(cache, "b_60")], 2, Path({str(tmp_path / "run")!r}), [], _steps(),
                 command=_fake, poll_s=0.05)
except Stopped as stop:  # as lrlhf.run.cli.main ends a stopped launch
    print(f"interrupted ({{stop}})", file=sys.stderr)
    sys.exit(stop.code)
"""
    launch = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    pids = [tmp_path / "run" / "stage_logs" / f"{n}_60.pid" for n in "ab"]
    deadline = time.monotonic() + 60
    while not all(p.is_file() and p.read_text() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    launch.send_signal(signal.SIGTERM)
    _, err = launch.communicate(timeout=60)
    assert launch.returncode == 128 + signal.SIGTERM and "SIGTERM" in err and "stopping 2 stage build(s)" in err
    for pid in (int(p.read_text()) for p in pids):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # gone (the launch waited for them: no zombie)


def test_a_launch_stopped_by_a_signal_exits_as_the_signal_would():
    # 143 for SIGTERM (a scheduler reads it as "terminated"), 130 for Ctrl+C, as a process the signal ended
    script = """
import signal, sys
from lrlhf.run import cli
from lrlhf.utils.launch_signals import Stopped
def task(cfg):
    from lightning.pytorch.utilities.exceptions import SIGTERMException
    raise {"jobs=2": Stopped(signal.SIGTERM), "jobs=1": KeyboardInterrupt, "jobs=3": SIGTERMException}[
        sys.argv[-1]]
cli._task = task
cli.main([sys.argv[-1]])
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src"), "WANDB_MODE": "offline"}
    # and Lightning's SIGTERMException (a SystemExit with no status: exit 0) from a stage's test loop: 143 too
    for arg, code, named in (("jobs=2", 143, "interrupted (SIGTERM)"), ("jobs=1", 130, "interrupted (Ctrl+C)"),
                             ("jobs=3", 143, "interrupted (SIGTERM); a stage being built is dropped")):
        out = subprocess.run([sys.executable, "-c", script, arg], capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == code and named in out.stderr, out.stderr[-2000:]


def test_a_stage_that_reads_an_unplanned_unbuilt_stage_is_an_error_before_any_build(tmp_path):
    cache = tmp_path / "stages"
    with pytest.raises(StageBuildFailed, match="neither built nor planned: `x_0.1` reads .*never"):
        build_stages([_stage(cache, "a_0.1"), _stage(cache, "x_0.1", "never")], 2, tmp_path / "run", [], _steps(),
                     command=_fake)
    assert not (cache / "a_0.1").exists()


@pytest.mark.parametrize(("jobs", "cache", "processes", "devices", "error"), [
    (0, True, 1, 1, "jobs must be an integer >= 1"), ("2", True, 1, 1, "jobs must be an integer"),
    (2, False, 1, 1, "cache=false"), (2, True, 2, 1, "2 launched processes"), (2, True, 1, 2, "trainer.devices=2"),
    (2, True, 1, [0, 1], "trainer.devices=\\[0, 1\\]"),
])
def test_jobs_is_checked_before_any_work(jobs, cache, processes, devices, error):
    with pytest.raises(ValueError, match=error):
        check_jobs(jobs, cache, processes, devices)
    assert check_jobs(1, False, 2, 4) == 1 and check_jobs(2, True, 1, "auto", "cpu") == 2
    assert check_jobs(2, True, 1, [0]) == 2


def test_a_worker_refuses_a_config_that_no_longer_hashes_to_the_planned_stage(tmp_path, monkeypatch):
    monkeypatch.setattr("lrlhf.utils.console.setup_console", lambda *a, **k: None)  # the test process's own
    dep = _compose(["recipe=sft", "world=toy_tiny", f"paths.cache_dir={tmp_path}"])
    with open_dict(dep):
        dep.world.dir = str(tmp_path / "world")
    spec = tmp_path / "sft-000000000000.yaml"
    OmegaConf.save(dep, spec)
    meta = {"recipe": "sft", "out_dir": str(tmp_path / "stages" / "sft-000000000000"), "run_dir": str(tmp_path),
            "overrides": []}
    spec.with_suffix(".json").write_text(json.dumps(meta))
    sigterm = signal.getsignal(signal.SIGTERM)  # the worker takes SIGTERM over: this test process gets it back
    try:
        with pytest.raises(StageBuildFailed, match="hashes to sft-[0-9a-f]{12}, not the planned sft-000000000000"):
            stage_worker.main([str(spec)])
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    assert not (tmp_path / "stages").exists()


@pytest.mark.slow
def test_jobs_2_builds_the_stages_a_sequential_launch_reuses(tmp_path):
    """recipe=frontier's needs (SFT, RM, DPO, PPO, RLOO, GRPO, PPO on the gold, iterative RLHF: a stage that composes
    recipes of its own, in Hydra's context) built two at a time; the same command with jobs=1 then finds every one
    of them (the workers' stages are the plan's, keys and all) and builds nothing."""
    small = ["rounds.settings.n=2", "rounds.settings.initial_labels=40", "rounds.settings.labels_per_round=20",
             "rounds.settings.ppo_steps=4", "rounds.settings.rm_steps=4", "data.batch_size=8",
             "module.config.minibatch_size=8"]
    iterative = "+stage_overrides.iterative=[" + ",".join(f'"{o}"' for o in small) + "]"
    tiny = [*EVAL_TINY, "world.sizes.pref_train=40", iterative,
            'stage_overrides.rloo=["trainer.max_steps=2","data.batch_size=2","eval=null"]',
            'stage_overrides.grpo=["trainer.max_steps=2","data.batch_size=2","eval=null"]',
            'stage_overrides.ppo_gold=["reward=gold","trainer.max_steps=4","data.batch_size=8","eval=null"]']
    out = _train(tmp_path, "recipe=frontier", "logger=none", "jobs=2", f"hydra.run.dir={tmp_path / 'run'}", *tiny)
    assert out.stdout.count("(a process of its own,") == 8 and "2 of jobs=2 building" in out.stdout
    logs = sorted(p.name.rsplit("-", 1)[0] for p in (tmp_path / "run" / "stage_logs").glob("*.log"))
    assert logs == ["dpo_lora", "grpo_lora", "iterative_ppo", "ppo_lora", "ppo_lora", "rloo_lora", "rm", "sft"]
    again = _train(tmp_path, "recipe=frontier", "logger=none", f"hydra.run.dir={tmp_path / 'again'}", *tiny)
    assert "building the `" not in again.stdout and again.stdout.count("reusing the `") == 8
    assert "in 2 processes (jobs=2)" in out.stdout and "processes (jobs=" not in again.stdout
    # the evaluation's draws in two processes are one process's: every figure of every row, the curves too
    results = [json.loads((tmp_path / run / "eval_results.json").read_text()) for run in ("run", "again")]
    for key in ("rows", "bon_curve", "bon_gold_curve"):
        assert results[0][key] == results[1][key], key
