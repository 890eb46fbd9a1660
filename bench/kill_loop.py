"""SIGKILL a run again and again (during stage builds, training and checkpoint writes), resume it each time with
``ckpt_path=last``, and check that nothing was lost, for every training recipe.

``python bench/kill_loop.py --out /tmp/killloop [--recipes ppo_lora,sft,...] [--kills 20] [--seed 0]``

For each recipe (``--recipes``, default :data:`RECIPES`: SFT, RM, DPO, KTO, RLOO and GRPO with dynamic sampling,
the RM ensemble, PPO), two runs of ``python train.py recipe=<recipe>`` (small sizes, CSV metrics, a checkpoint
every Trainer batch or rollout), each in its own cache, run folder and ``TMPDIR``:

- **straight**: uninterrupted;
- **killed**: started, SIGKILLed in turn after a random delay, as soon as a checkpoint write is under way (a
  ``.partial`` file appears), or during a stage build (a recipe that needs one: the cached stages are removed
  first, so the resumed run must rebuild them, bitwise alike, and its checkpoint's frozen-weight digests must still
  match), restarted with ``ckpt_path=last`` until ``--kills`` kills are done, then run to its end.

Checked and printed: the exported weights are bitwise equal; ``logs/metrics.csv`` holds each step's row exactly
once and the same values (its recipe's key metric); ``summary.json`` has every figure the straight run's has, with the
same values; no orphan (``.building`` stage folders, ``.partial`` checkpoint files, ``.export-*.tmp`` folders, files
left in ``TMPDIR``). Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORLD = ["world.sizes.sft_train=256", "world.sizes.sft_val=16", "world.sizes.pref_train=96", "world.sizes.pref_val=16",
         "world.sizes.pref_test=16", "world.sizes.rl=128", "world.sizes.eval=16"]
NEEDED = ['stage_overrides.sft=["trainer.max_steps=60","trainer.val_check_interval=30"]',
          'stage_overrides.rm=["trainer.max_steps=40","trainer.val_check_interval=20"]']
EVERY = ["callbacks.checkpoint.every_n_rollouts=1", "callbacks.checkpoint.keep_last_k=2", "trainer.log_every_n_steps=1"]
RL = ["data.batch_size=16", "callbacks.early_stopping.every_n_rollouts=4", "callbacks.early_stopping.patience=null",
      "eval.n_samples=1"]
#: recipe -> (its overrides, the metrics.csv column every row of it has, whether it needs a stage built first)
RECIPES = {
    "ppo_lora": ([*NEEDED, "trainer.max_steps=120", *RL], "rollout/kl_seq", True),
    "sft": (["trainer.max_steps=60", "trainer.val_check_interval=30", "data.batch_size=16"], "train/loss", False),
    "rm": ([*NEEDED, "trainer.max_steps=40", "trainer.val_check_interval=20"], "train/loss", True),
    "dpo_lora": ([*NEEDED, "trainer.max_steps=40", "trainer.val_check_interval=20", "eval=null"], "train/loss", True),
    "kto_lora": ([*NEEDED, "trainer.max_steps=40", "trainer.val_check_interval=20", "eval=null"], "train/loss", True),
    "rloo_lora": ([*NEEDED, "trainer.max_steps=40", *RL], "rollout/kl_seq", True),
    "grpo_lora": ([*NEEDED, "trainer.max_steps=40", "module/group_filter=dynamic_sampling", *RL], "rollout/kl_seq",
                  True),
}


def command(recipe: str, run: Path, resume: bool) -> list[str]:
    return [sys.executable, "train.py", f"recipe={recipe}", "logger=csv", f"hydra.run.dir={run}", *WORLD, *EVERY,
            *RECIPES[recipe][0], *(["ckpt_path=last"] if resume else [])]


def environment(base: Path) -> dict:
    tmp = base / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "LRLHF_CACHE_DIR": str(base / "cache"), "TMPDIR": str(tmp), "WANDB_MODE": "offline",
            "PYTHONPATH": str(ROOT / "src")}


def straight(recipe: str, base: Path) -> float:
    start = time.perf_counter()
    subprocess.run(command(recipe, base / "run", False), cwd=ROOT, env=environment(base), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def _building(base: Path) -> bool:
    stages = base / "cache" / "stages"
    return stages.is_dir() and any(stages.glob(".*.building"))


def _writing(base: Path) -> bool:
    return any((base / "run").rglob(".*.partial")) or any((base / "cache").rglob(".*.partial"))


def killed(recipe: str, base: Path, kills: int, rng: random.Random) -> tuple[list[dict], float]:
    """Kill ``kills`` times, then finish; returns what each kill hit and the total wall time."""
    log, start, done = [], time.perf_counter(), 0
    modes = ("random", "checkpoint write", "stage build") if RECIPES[recipe][2] else ("random", "checkpoint write")
    while True:
        resume = (base / "run" / "checkpoints" / "last.ckpt").exists()
        mode = modes[done % len(modes)] if done < kills else "finish"
        if mode == "stage build":  # the stages are cached after their first build: remove them to rebuild one
            for stage in (base / "cache" / "stages").glob("*"):
                shutil.rmtree(stage)
        last = base / "run" / "checkpoints" / "last.ckpt"
        before = os.readlink(last) if last.is_symlink() else None
        proc = subprocess.Popen(command(recipe, base / "run", resume), cwd=ROOT, env=environment(base),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if mode == "finish":
            if proc.wait() != 0:
                raise SystemExit(f"the final run failed (exit {proc.returncode})")
            return log, time.perf_counter() - start
        hit, kill_at = None, None
        while proc.poll() is None:
            now = time.perf_counter()
            if mode == "checkpoint write" and _writing(base):
                hit = ("stage build" if _building(base) else "training") + " (checkpoint write)"
            elif mode == "stage build" and _building(base) and kill_at is None:
                kill_at = now + rng.uniform(0.2, 3.0)  # somewhere in the build (load, train, export)
            elif mode == "random" and kill_at is None and last.is_symlink() and os.readlink(last) != before:
                kill_at = now + rng.uniform(0.0, 1.5)  # a rollout was saved: this launch made progress
            if kill_at is not None and now >= kill_at:
                hit = ("stage build" if _building(base) else "training") + (
                    " (checkpoint write)" if _writing(base) else "")
            if hit:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                break
            time.sleep(0.01)
        if hit is None:  # it finished before the kill: nothing left to kill
            log.append({"kill": done + 1, "mode": mode, "hit": "finished first"})
            return log, time.perf_counter() - start
        done += 1
        log.append({"kill": done, "mode": mode, "hit": hit, "exit": proc.returncode})
        print(f"{recipe} kill {done}: {mode} -> {hit}", flush=True)


def _weights(run: Path) -> dict[str, bytes]:
    """Every exported weight file of the run (``export/``, ``merged/``, ``model/``: where its kind exports)."""
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*.safetensors"))
            if p.relative_to(run).parts[0] not in ("checkpoints", "logs")}


def _rows(run: Path, key: str) -> list[dict]:
    with (run / "logs" / "metrics.csv").open() as f:
        return [r for r in csv.DictReader(f) if r.get(key)]


def _orphans(base: Path, straight: Path) -> list[str]:
    """Leftovers of the kills: half-built stages, partial checkpoints or exports, and whatever is in TMPDIR that
    the straight run did not leave there too (torch keeps an empty ``torchinductor_<user>`` cache folder)."""
    found = [str(p) for p in (base / "cache").rglob(".*.building")]
    found += [str(p) for p in base.rglob(".*.partial")]
    found += [str(p) for p in base.rglob(".export-*.tmp")]
    expected = {p.relative_to(straight / "tmp") for p in (straight / "tmp").rglob("*")}
    found += [str(p) for p in (base / "tmp").rglob("*") if p.relative_to(base / "tmp") not in expected]
    return found


def soak(recipe: str, out: Path, kills: int, rng: random.Random) -> bool:
    """One recipe's straight and killed runs and their comparison, printed; whether every check holds."""
    t_straight = straight(recipe, out / "straight")
    print(f"{recipe}: straight run {t_straight:.1f} s", flush=True)
    log, t_killed = killed(recipe, out / "killed", kills, rng)
    a, b = out / "straight" / "run", out / "killed" / "run"
    weights_a, weights_b = _weights(a), _weights(b)
    key = RECIPES[recipe][1]
    rows_a, rows_b = _rows(a, key), _rows(b, key)
    summary_a = json.loads((a / "summary.json").read_text())
    summary_b = json.loads((b / "summary.json").read_text())
    skip = {"run_dir", "export", "adapter", "goodhart_plot", "chosen/checkpoint", "reused"}  # paths differ
    checks = {
        "kills": sum(1 for e in log if e["hit"] != "finished first"),
        "weights bitwise equal": bool(weights_a) and weights_a == weights_b,
        "weight files": len(weights_a),
        "metric rows (straight, killed)": (len(rows_a), len(rows_b)),
        "each step's row once, same values": bool(rows_a) and [r["step"] for r in rows_b] == [r["step"] for r in rows_a]
        and [r.get(key) for r in rows_b] == [r.get(key) for r in rows_a],
        "summary differences (straight, killed)": {
            k: (summary_a.get(k), summary_b.get(k)) for k in sorted(set(summary_a) | set(summary_b))
            if k not in skip and summary_a.get(k) != summary_b.get(k)},
        "orphans": _orphans(out / "killed", out / "straight"),
    }
    hits: dict[str, int] = {}
    for entry in log:
        hits[entry["hit"]] = hits.get(entry["hit"], 0) + 1
    print(json.dumps({"recipe": recipe, "straight_s": round(t_straight, 1), "killed_total_s": round(t_killed, 1),
                      "hits": hits, **checks}, indent=2, default=str))
    ok = (checks["weights bitwise equal"] and checks["each step's row once, same values"]
          and not checks["summary differences (straight, killed)"] and not checks["orphans"])
    print(f"{recipe}: {'PASS' if ok else 'FAIL'}", flush=True)
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/killloop"))
    parser.add_argument("--recipes", default=",".join(RECIPES), help=f"comma-separated, of {', '.join(RECIPES)}")
    parser.add_argument("--kills", type=int, default=20, help="kills per recipe")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    recipes = args.recipes.split(",")
    unknown = [r for r in recipes if r not in RECIPES]
    if unknown:
        parser.error(f"--recipes: unknown {unknown}; choose from {', '.join(RECIPES)}")
    shutil.rmtree(args.out, ignore_errors=True)
    rng = random.Random(args.seed)
    results = {recipe: soak(recipe, args.out / recipe, args.kills, rng) for recipe in recipes}
    print("ALL PASS" if all(results.values()) else f"FAIL: {[r for r, ok in results.items() if not ok]}")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
