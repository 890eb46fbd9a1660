"""Reward hacking resisted (issue #19): `recipe=ppo_weak_kl` (a weak fixed KL: proxy up, gold down) optimising one
reward model against a conservative reward-model ensemble, on several seeds, with the held-out gold, proxy and the
members' disagreement every 5 rollouts.

    PYTHONPATH=src python bench/ensemble_goodhart.py --out /tmp/ens --seeds 0 1 \
        [--variants single mean_minus_std worst_case] [--members 3] [--coef 1.0] [--rollouts 200] \
        [--data-fraction 1.0]

Every variant is `python train.py recipe=ppo_weak_kl reward=ensemble` with another combination rule, so all of them
train against the same members (`recipe=rm_ensemble`, seeds seed..seed+members-1; built once per seed in the cache
under --out) and log the same disagreement: `single` optimises member 0 alone (SingleMember: the plain
`recipe=ppo_weak_kl` RM, the members only watch), `mean_minus_std` the mean less `--coef` times the members' std,
`worst_case` the lowest member. Early stopping evaluates every 5 rollouts with patience off, so each run goes the
whole way; the gold-free stopping rules are then applied to the same history:

- disagreement rule: keep the last evaluation before the held-out disagreement first rises above
  (1 + --rise) x its value at rollout 0;
- the lead: rollouts between that rise and gold's fall (the first evaluation after gold's peak below 0.9 x peak).

Prints a table per run (best gold and its rollout, final gold / best, the disagreement rule's pick and its gold /
best, the lead) and writes `ensemble_goodhart.json` and a plot (gold, proxy, disagreement vs rollout) to --out.
1 torch thread (threads=1), as every figure in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RULES = {  # variant -> overrides (configs/module/reward_model/combine/)
    "single": ["module/reward_model/combine=single"],
    "mean_minus_std": ["module.reward_model.combine.coef=COEF"],
    "worst_case": ["module/reward_model/combine=worst_case"],
    "mean": ["module/reward_model/combine=mean"],
}


def run(variant: str, seed: int, args) -> Path:
    out = args.out / f"seed{seed}" / variant
    if (out / "summary.json").is_file():
        return out
    rule = [o.replace("COEF", str(args.coef)) for o in RULES[variant]]
    cmd = [sys.executable, "train.py", "recipe=ppo_weak_kl", "reward=ensemble", *rule,
           f"seed={seed}", "threads=1", "logger=csv", "callbacks.early_stopping.patience=100000",
           f"trainer.max_steps={4 * args.rollouts}",
           'stage_overrides.rm=["ensemble.members=' + str(args.members) + '","ensemble.data_fraction='
           + str(args.data_fraction) + '"]',
           f"hydra.run.dir={out}"]
    env = {**os.environ, "LRLHF_CACHE_DIR": str(args.out / "cache"), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    start = time.time()
    with open(args.out / f"seed{seed}_{variant}.log", "w") as log:
        subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    print(f"seed {seed} {variant}: {time.time() - start:.0f} s", flush=True)
    return out


def history(out: Path) -> list[dict]:
    return json.loads(next(out.rglob("heldout_history.json")).read_text())["history"]


def train_disagreement(out: Path) -> list[tuple[int, float]]:
    """``(rollout, reward/ensemble_std)`` of every training rollout (metrics.csv)."""
    rows = []
    for path in out.rglob("metrics.csv"):
        with path.open() as f:
            for row in csv.DictReader(f):
                if row.get("reward/ensemble_std"):
                    rows.append(float(row["reward/ensemble_std"]))
    return list(enumerate(rows, start=1))


def figures(hist: list[dict], rise: float) -> dict:
    gold = [h["utility"] for h in hist]
    rollouts = [h["rollout"] for h in hist]
    best = max(range(len(gold)), key=gold.__getitem__)
    fall = next((rollouts[i] for i in range(best + 1, len(gold)) if gold[i] < 0.9 * gold[best]), None)
    d0 = hist[0].get("disagreement")
    risen = next((i for i in range(1, len(hist)) if d0 is not None and hist[i]["disagreement"] > (1 + rise) * d0),
                 None)
    pick = (risen - 1) if risen is not None else len(hist) - 1
    return {"best_gold": gold[best], "best_rollout": rollouts[best], "final_gold": gold[-1],
            "final_over_best": gold[-1] / gold[best], "gold_fall_rollout": fall,
            "disagreement_rise_rollout": rollouts[risen] if risen is not None else None,
            "lead_rollouts": (fall - rollouts[risen]) if fall is not None and risen is not None else None,
            "disagreement_pick_rollout": rollouts[pick], "disagreement_pick_gold": gold[pick],
            "disagreement_pick_over_best": gold[pick] / gold[best], "start_gold": gold[0],
            "final_proxy": hist[-1]["proxy"], "final_kl": hist[-1]["kl"]}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted({k.split("/")[0] for k in results})
    fig, axes = plt.subplots(len(seeds), 3, figsize=(14, 3.6 * len(seeds)), squeeze=False)
    for row, seed in enumerate(seeds):
        for key, res in results.items():
            if key.split("/")[0] != seed:
                continue
            hist = res["history"]
            x = [h["rollout"] for h in hist]
            label = key.split("/")[1]
            axes[row][0].plot(x, [h["utility"] for h in hist], label=label)
            axes[row][1].plot(x, [h["proxy"] for h in hist], label=label)
            axes[row][2].plot(x, [h.get("disagreement", float("nan")) for h in hist], label=label)
        for col, name in enumerate(("held-out gold", "held-out proxy (the optimised reward)",
                                    "held-out disagreement (members' std)")):
            axes[row][col].set_title(f"{seed}: {name}")
            axes[row][col].set_xlabel("rollout")
        axes[row][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=70)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--variants", nargs="+", default=["single", "mean_minus_std", "worst_case"],
                        choices=sorted(RULES))
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--coef", type=float, default=1.0)
    parser.add_argument("--data-fraction", type=float, default=1.0, help="each member's fraction of the prompts")
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--rise", type=float, default=0.5, help="the disagreement rule's threshold (fraction)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for seed in args.seeds:
        for variant in args.variants:
            out = run(variant, seed, args)
            hist = history(out)
            results[f"seed{seed}/{variant}"] = {**figures(hist, args.rise), "history": hist,
                                                "train_disagreement": train_disagreement(out)}
    print(f"\n{'run':<24} {'start':>6} {'best (rollout)':>15} {'final/best':>10} {'proxy':>6} {'KL':>6} "
          f"{'rise':>5} {'fall':>5} {'lead':>5} {'pick':>5} {'pick/best':>9}")
    for key, r in results.items():
        print(f"{key:<24} {r['start_gold']:>6.3f} {r['best_gold']:>8.3f} ({r['best_rollout']:>4}) "
              f"{r['final_over_best']:>10.3f} {r['final_proxy']:>6.2f} {r['final_kl']:>6.2f} "
              f"{str(r['disagreement_rise_rollout']):>5} {str(r['gold_fall_rollout']):>5} "
              f"{str(r['lead_rollouts']):>5} {r['disagreement_pick_rollout']:>5} "
              f"{r['disagreement_pick_over_best']:>9.3f}")
    (args.out / "ensemble_goodhart.json").write_text(json.dumps(
        {"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=2) + "\n")
    plot(results, args.out / "ensemble_goodhart.png")
    print(f"wrote {args.out / 'ensemble_goodhart.json'} and {args.out / 'ensemble_goodhart.png'}")


if __name__ == "__main__":
    main()
