"""PPO levers, each measured as its effect on held-out gold at its KL (issue #31): one `train.py` run per (setting,
seed), the held-out evaluation every 10 rollouts with early stopping's patience off (every run goes its whole
length), one row per run.

    python bench/ppo_sweep.py --out /tmp/sweep --seeds 0 1 --name base -- recipe=ppo_lora reward=gold
    python bench/ppo_sweep.py --out /tmp/sweep --seeds 0 --name lr1e-3 -- reward=gold module.config.lr=1e-3
    python bench/ppo_sweep.py --report /tmp/sweep      # the table of every run in the folder

A row: the best held-out gold of the trajectory (sft_val prompts, 1 sample each) and its KL per sequence, the last
evaluation's gold and KL, the largest fall below the best seen so far (collapse), the final comparison's gold on the
200 evaluation prompts x 4 samples (the checkpoint early stopping kept: the best on sft_val) with its 95 % bootstrap
interval, and the critic's mean explained variance over the run. 1 torch thread (`threads=1`, the default).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXED = ["logger=csv", "callbacks.early_stopping.patience=null", "callbacks.audit=null"]


def run(out: Path, name: str, seed: int, overrides: list[str]) -> Path:
    folder = out / f"{name}__s{seed}"
    if (folder / "summary.json").is_file():
        return folder
    cmd = [sys.executable, str(ROOT / "train.py"), *FIXED, f"seed={seed}", f"hydra.run.dir={folder}", *overrides]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "command.txt").write_text(" ".join(cmd) + "\n")
    start = time.time()
    with open(folder / "console.log", "w") as log:
        code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    (folder / "wall_s.txt").write_text(f"{time.time() - start:.1f}\n")
    if code:
        print(f"{name} seed {seed}: exit {code}, see {folder / 'console.log'}", flush=True)
    return folder


def row(folder: Path) -> dict | None:
    summary_path, history_path = folder / "summary.json", folder / "logs" / "heldout_history.json"
    if not summary_path.is_file() or not history_path.is_file():
        return None
    summary, history = json.loads(summary_path.read_text()), json.loads(history_path.read_text())["history"]
    best, fall = None, 0.0
    for h in history:
        if best is None or h["utility"] > best["utility"]:
            best = h
        fall = max(fall, best["utility"] - h["utility"])
    last = history[-1]
    ev = []
    metrics = folder / "logs" / "metrics.csv"
    if metrics.is_file():
        with open(metrics) as f:
            ev = [float(r["ppo/explained_variance"]) for r in csv.DictReader(f) if r.get("ppo/explained_variance")]
    key = next(k for k in summary if k.startswith("gold/") and k.endswith("_minus_sft"))
    name = key.split("/")[1][:-len("_minus_sft")]
    lo, hi = summary[f"gold/{name}_interval"]
    return {
        "run": folder.name, "best_gold": best["utility"], "best_rollout": best.get("rollout"), "best_kl": best["kl"],
        "last_gold": last["utility"], "last_kl": last["kl"], "max_fall": fall,
        "final_gold": summary[f"gold/{name}"], "final_lo": lo, "final_hi": hi,
        "ev_mean": sum(ev) / len(ev) if ev else math.nan,
        "wall_s": float((folder / "wall_s.txt").read_text()) if (folder / "wall_s.txt").is_file() else math.nan,
    }


def report(out: Path) -> str:
    rows = [r for r in (row(f) for f in sorted(out.iterdir()) if f.is_dir()) if r is not None]
    lines = ["| run | best gold (rollout, KL) | last gold (KL) | max fall | final gold [95 %] | EV mean | wall |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['best_gold']:.3f} ({r['best_rollout']}, {r['best_kl']:.2f}) | "
                     f"{r['last_gold']:.3f} ({r['last_kl']:.2f}) | {r['max_fall']:.3f} | {r['final_gold']:.3f} "
                     f"[{r['final_lo']:.3f}, {r['final_hi']:.3f}] | {r['ev_mean']:.2f} | {r['wall_s']:.0f} s |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--name")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--report", type=Path)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    for seed in args.seeds:
        r = row(run(args.out, args.name, seed, args.overrides))
        if r:
            print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
