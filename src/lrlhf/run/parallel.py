"""Building a run's needed stages several at a time (``jobs=N``), each in a process of its own.

A recipe that needs many stages (``recipe=frontier_text``: SFT, pairs, RM, then DPO, PPO, RLOO, GRPO, PPO on the
gold and the weak-KL PPO) builds them one after another by default. With ``jobs=2`` on a 2-core machine (each
stage at ``threads=1``), two stages whose needs are built run at once: the pairs beside PPO on the gold, then the
RM, DPO, and once the RM is built the weak-KL PPO (the longest) before PPO, RLOO and GRPO, as workers free.

1. :func:`build_stages` (the launch): starts a stage once every stage it reads is built and fewer than ``jobs`` are
   building (of the stages that can start, first those that more stages wait for, then the longest by
   :func:`start_order`), each as ``python -m lrlhf.run.stage_worker <spec>`` with its console in
   ``<run folder>/stage_logs/``; one that fails stops the others and the run, naming the stage, its exit status and
   its log's last lines.
2. :func:`lrlhf.run.stage_worker.main` (a worker): reloads the planned stage config the launch wrote, checks
   that it still hashes to the cache entry the launch planned (so the stage built is the one the plan reuses), then
   builds it as the launch would (:func:`lrlhf.run.cli._build_stage`: a building folder swapped into the cache,
   the stage's lock held).

Stages are built into the stage cache only (``cache=true``), by a launch of one process.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from omegaconf import OmegaConf

from lrlhf.run.planning import _stage_done
from lrlhf.utils.distributed import die_with_parent
from lrlhf.utils.io import atomic_write_text
from lrlhf.utils.launch_signals import Stopped

#: How long a stopped worker may take to stop at its next safe point before it is killed (seconds).
STOP_GRACE_S = 60.0


class StageBuildFailed(RuntimeError):
    """A stage built in a process of its own failed; the message names it, its exit status and its log."""


def _one_device(devices, accelerator) -> bool:
    if isinstance(devices, (list, tuple)) or type(devices).__name__ == "ListConfig":
        return len(devices) == 1  # trainer.devices=[0]
    if str(devices) == "auto":  # every GPU there is: one worker would take them all
        import torch

        return str(accelerator) == "cpu" or torch.cuda.device_count() <= 1
    return str(devices) in ("1", "None")


def one_process(processes: int, devices, accelerator=None) -> bool:
    """A launch of one process on one device (``trainer.devices``): it trains each stage alone, and may stop alone."""
    return processes <= 1 and _one_device(devices, accelerator)


def check_jobs(jobs, cache: bool, processes: int, devices, accelerator=None) -> int:
    """``jobs`` as an integer >= 1; several only for cached stages of a one-process, one-device launch."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1 (stages built at once), got {jobs!r}")
    if jobs > 1 and not cache:
        raise ValueError(f"jobs={jobs} builds the needed stages into the stage cache; with cache=false they are "
                         "built in the run folder one after another: drop jobs or cache=false")
    if jobs > 1 and not one_process(processes, devices, accelerator):
        raise ValueError(f"jobs={jobs} with trainer.devices={devices} ({processes} launched processes): every "
                         "process trains every stage on every device, so stages are built one after another; drop "
                         "jobs (or give the launch one device)")
    return jobs


def worker_command(spec: Path) -> list[str]:
    """The command that builds the stage ``spec`` describes (a test substitutes its own)."""
    return [sys.executable, "-m", "lrlhf.run.stage_worker", str(spec)]


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _status(code: int) -> str:
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"


def _stop(running: dict) -> None:
    """Stop the builds still running: each at its next safe point (its building folder removed), killed after
    :data:`STOP_GRACE_S`, or at once on a second signal."""
    alive = [proc for _, proc, _, _ in running.values() if proc.poll() is None]
    if not alive:
        return

    def kill_now(signum, frame):
        for proc in alive:
            proc.kill()

    handlers = {s: signal.signal(s, kill_now) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        print(f"stopping {len(alive)} stage build(s) at their next safe point (up to {STOP_GRACE_S:.0f} s; a second "
              "Ctrl+C kills them)", file=sys.stderr, flush=True)
        for proc in alive:
            proc.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in alive:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()  # its half-built folder is removed by the next launch (a build whose process is gone)
                proc.wait()
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def _reads(dep) -> list[Path]:
    """The stage folders a planned stage reads (its ``deps``)."""
    return [Path(p) for p in (dep.get("deps") or {}).values() if p]


def _steps_of(dep) -> int:
    """A stage's optimiser steps (``trainer.max_steps``, or its batches x epochs when those bound it): a rough
    measure of how long it builds; 0 for a stage that does not train (the pairs: sampling)."""
    def count(value) -> int:  # a positive int, else 0 (null, -1: unbounded, a fraction, a bool)
        return value if type(value) is int and value > 0 else 0

    trainer = dep.get("trainer") or {}
    return count(trainer.get("max_steps")) or \
        count(trainer.get("limit_train_batches")) * (count(trainer.get("max_epochs")) or 1)


def start_order(todo: list) -> list:
    """``todo`` in the order free workers take the stages that can start: first the stages more planned stages read
    (directly or through others: the RM before DPO, since PPO, RLOO and GRPO wait for it), then the longer by
    optimiser steps (the weak-KL PPO's 800 before PPO's 80: a long build started last is a tail on one worker),
    then plan order. The order changes which stage starts when, never what is built."""
    readers = {out_dir: set() for _, _, out_dir in todo}
    for _, dep, out_dir in todo:
        for p in _reads(dep):
            if p in readers:
                readers[p].add(out_dir)

    def waiting_on(out_dir) -> set:  # every planned stage that reads it, directly or through others
        seen, frontier = set(), [out_dir]
        while frontier:
            new = readers[frontier.pop()] - seen
            seen |= new
            frontier.extend(new)
        return seen

    rank = {stage[2]: (-len(waiting_on(stage[2])), -_steps_of(stage[1]), i) for i, stage in enumerate(todo)}
    return sorted(todo, key=lambda stage: rank[stage[2]])


def _unplanned(todo: list) -> list[str]:
    planned = {out_dir for _, _, out_dir in todo}
    return [f"`{recipe}` reads {p}" for recipe, dep, _ in todo for p in _reads(dep)
            if p not in planned and not _stage_done(p)]


def build_stages(todo: list, jobs: int, run_dir: Path, overrides: list[str], steps: Iterator[str],
                 command: Callable[[Path], list[str]] = worker_command, poll_s: float = 0.5) -> None:
    """Build every stage of ``todo`` (``(recipe, cfg, out_dir)`` in plan order), at most ``jobs`` at once, each
    when the stages it reads are built, in :func:`start_order`; ``steps`` yields the console's ``[k/n]`` of each
    start. A stage that fails starts nothing more; the builds running then finish (they stay in the cache), and the
    run stops naming it."""
    if missing := _unplanned(todo):
        raise StageBuildFailed(f"a stage reads a stage that is neither built nor planned: {'; '.join(missing)}")
    logs = run_dir / "stage_logs"
    logs.mkdir(parents=True, exist_ok=True)
    waiting, running, failed = start_order(todo), {}, []  # running: out_dir -> (recipe, process, log, start time)

    def on_signal(signum, frame):  # the launch stopped: its workers stop too, as on Ctrl+C
        raise Stopped(signum)  # 128 + signum: 143 for SIGTERM, as a process the signal ended

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        while running or (waiting and not failed):
            for out_dir, (recipe, proc, log, start) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[out_dir]
                if proc.returncode != 0 or not _stage_done(out_dir):
                    failed.append(f"building the `{recipe}` stage failed ({_status(proc.returncode)}); its console: "
                                  f"{log}\n{_tail(log)}")
                    print(f"lrlhf: {failed[-1]}" + (f"\nwaiting for the {len(running)} other stage build(s) to "
                          "finish (they stay in the cache; Ctrl+C stops them)" if running else ""),
                          file=sys.stderr, flush=True)
                    continue
                print(f"built the `{recipe}` stage in {(time.monotonic() - start) / 60:.1f} min: {out_dir}",
                      flush=True)
            for recipe, dep, out_dir in list(waiting) if not failed else ():
                if len(running) >= jobs:
                    break
                if not all(_stage_done(p) and p not in running for p in _reads(dep)):
                    continue
                waiting.remove((recipe, dep, out_dir))
                if _stage_done(out_dir):  # another launch built it meanwhile
                    print(f"{next(steps)} reusing the `{recipe}` stage another launch built: {out_dir}", flush=True)
                    continue
                spec = logs / f"{out_dir.name}.yaml"
                atomic_write_text(spec, OmegaConf.to_yaml(dep))  # unresolved: the worker resolves it as the launch
                meta = {"recipe": recipe, "out_dir": str(out_dir), "run_dir": str(run_dir), "overrides": overrides}
                atomic_write_text(spec.with_suffix(".json"), json.dumps(meta, indent=2) + "\n")
                log = logs / f"{out_dir.name}.log"
                with log.open("w") as out:
                    running[out_dir] = (recipe, subprocess.Popen(
                        command(spec), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        start_new_session=True, preexec_fn=die_with_parent if sys.platform == "linux" else None),
                        log, time.monotonic())
                print(f"{next(steps)} building the `{recipe}` stage this recipe needs, in {out_dir} (a process of "
                      f"its own, {len(running)} of jobs={jobs} building; its console: {log})", flush=True)
            if running:
                time.sleep(poll_s)
            elif waiting and not failed:  # cannot happen after _unplanned: a guard against a hang
                raise StageBuildFailed(f"nothing can start: {', '.join(f'`{r}`' for r, _, _ in waiting)}")
        if failed:
            raise StageBuildFailed("\n".join(failed))
    finally:
        _stop(running)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
