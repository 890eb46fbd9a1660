"""Building a run's needed stages several at a time (``jobs=N``), each in a process of its own.

A recipe that needs many stages (``recipe=frontier_text``: SFT, pairs, RM, then DPO, PPO, RLOO, GRPO, PPO on the
gold and the weak-KL PPO) builds them one after another by default. With ``jobs=2`` on a 2-core machine (each
stage at ``threads=1``), two stages whose needs are built run at once: after the RM, DPO and PPO, then the next two.

1. :func:`build_stages` (the launch): starts a stage once every stage it reads is built and fewer than ``jobs`` are
   building, each as ``python -m lrlhf.run.stage_worker <spec>`` with its console in
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
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lrlhf.run.planning import _stage_done

#: How long a stopped worker may take to stop at its next safe point before it is killed (seconds).
STOP_GRACE_S = 60.0


class StageBuildFailed(RuntimeError):
    """A stage built in a process of its own failed; the message names it, its exit status and its log."""


def check_jobs(jobs, cache: bool, processes: int, devices) -> int:
    """``jobs`` as an integer >= 1; several only for cached stages of a one-process, one-device launch."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1 (stages built at once), got {jobs!r}")
    if jobs > 1 and not cache:
        raise ValueError(f"jobs={jobs} builds the needed stages into the stage cache; with cache=false they are "
                         "built in the run folder one after another: drop jobs or cache=false")
    if jobs > 1 and (processes > 1 or str(devices) not in ("1", "auto", "None")):
        raise ValueError(f"jobs={jobs} with trainer.devices={devices} ({processes} launched processes): every "
                         "process trains every stage, so stages are built one after another; drop jobs")
    return jobs


def worker_command(spec: Path) -> list[str]:
    """The command that builds the stage ``spec`` describes (a test substitutes its own)."""
    return [sys.executable, "-m", "lrlhf.run.stage_worker", str(spec)]


def _ready(dep: DictConfig) -> bool:
    return all(_stage_done(Path(p)) for p in (dep.get("deps") or {}).values() if p)


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _stop(running: dict) -> None:
    for _, proc, _, _ in running.values():
        if proc.poll() is None:
            proc.terminate()  # the stage stops at its next safe point; its building folder is removed
    deadline = time.monotonic() + STOP_GRACE_S
    for _, proc, _, _ in running.values():
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()  # its half-built folder is removed by the next launch (a build whose process is gone)
            proc.wait()


def build_stages(todo: list, jobs: int, run_dir: Path, overrides: list[str], steps: Iterator[str],
                 command: Callable[[Path], list[str]] = worker_command, poll_s: float = 0.5) -> None:
    """Build every stage of ``todo`` (``(recipe, cfg, out_dir)`` in plan order), at most ``jobs`` at once, each
    when the stages it reads are built; ``steps`` yields the console's ``[k/n]`` of each start."""
    logs = run_dir / "stage_logs"
    logs.mkdir(parents=True, exist_ok=True)
    waiting, running = list(todo), {}  # out_dir -> (recipe, process, log, start time)

    def on_term(signum, frame):  # the launch stopped (SIGTERM) stops its workers too, as Ctrl+C does
        os.write(2, b"\nSIGTERM: stopping the stages being built\n")
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        while waiting or running:
            for recipe, dep, out_dir in list(waiting):
                if len(running) >= jobs:
                    break
                if not _ready(dep):
                    continue
                waiting.remove((recipe, dep, out_dir))
                if _stage_done(out_dir):  # another launch built it meanwhile
                    print(f"{next(steps)} reusing the `{recipe}` stage another launch built: {out_dir}", flush=True)
                    continue
                spec = logs / f"{out_dir.name}.yaml"
                OmegaConf.save(dep, spec)  # unresolved: the worker resolves it as the launch would
                meta = {"recipe": recipe, "out_dir": str(out_dir), "run_dir": str(run_dir), "overrides": overrides}
                spec.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
                log = logs / f"{out_dir.name}.log"
                with log.open("w") as out:
                    proc = subprocess.Popen(command(spec), stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
                running[out_dir] = (recipe, proc, log, time.monotonic())
                print(f"{next(steps)} building the `{recipe}` stage this recipe needs, in {out_dir} (a process of "
                      f"its own, {len(running)} of jobs={jobs} building; its console: {log})", flush=True)
            if not running and waiting:  # nothing builds and nothing can start: a stage reads one no plan builds
                names = ", ".join(f"`{r}`" for r, _, _ in waiting)
                raise StageBuildFailed(f"the {names} stage(s) read stages that are not built and not planned")
            if not running:
                break
            time.sleep(poll_s)
            for out_dir, (recipe, proc, log, start) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[out_dir]
                if proc.returncode != 0 or not _stage_done(out_dir):
                    raise StageBuildFailed(
                        f"building the `{recipe}` stage failed (exit status {proc.returncode}); its console: {log}"
                        f"\n{_tail(log)}")
                print(f"built the `{recipe}` stage in {(time.monotonic() - start) / 60:.1f} min: {out_dir}",
                      flush=True)
    finally:
        _stop(running)
        signal.signal(signal.SIGTERM, previous)

