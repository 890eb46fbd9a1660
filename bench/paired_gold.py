"""Held-out gold of two exported policies of the same toy world, paired over prompts (a change of defaults, a lever).

    python bench/paired_gold.py --world WORLD_DIR --runs RUN_A:RUN_B [RUN_A:RUN_B ...] [--seed 0]

Each run is a PPO / RLOO / GRPO / DPO run folder (its ``export/merged``). Both policies answer the world's evaluation
prompts with 4 samples each at temperature 1 and the same sampling seed; the table gives each one's gold and the
difference B - A with its 95 % prompt-bootstrap interval, per pair and pooled over all pairs' prompts. 1 torch thread.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from lrlhf.data.formats import load_records
from lrlhf.eval.utility import sample_gold_utility
from lrlhf.functional.stats import bootstrap_interval
from lrlhf.models import ModelConfig, load_causal_lm, load_tokenizer


def gold_per_prompt(run: str, prompts: list, seed: int) -> list[float]:
    config = ModelConfig(str(Path(run) / "export" / "merged"))
    return list(sample_gold_utility(load_causal_lm(config).eval(), load_tokenizer(config), prompts, n_samples=4,
                                    temperature=1.0, max_new_tokens=32, seed=seed).per_prompt)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", action="append", required=True, help="the world folder of each pair, in order")
    parser.add_argument("--runs", nargs="+", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if len(args.world) != len(args.runs):
        raise SystemExit(f"one --world per pair: {len(args.world)} worlds for {len(args.runs)} pairs")
    pooled: list[float] = []
    print("| A | B | gold A | gold B | B - A [95 %] |\n|---|---|---|---|---|")
    for world, pair in zip(args.world, args.runs, strict=True):
        a, b = pair.split(":")
        prompts = load_records(Path(world) / "eval_prompts.jsonl", "prompt", verbose=False)[0]
        ga, gb = gold_per_prompt(a, prompts, args.seed), gold_per_prompt(b, prompts, args.seed)
        diff = [y - x for x, y in zip(ga, gb, strict=True)]
        pooled += diff
        lo, hi = bootstrap_interval(diff)
        print(f"| {a} | {b} | {sum(ga) / len(ga):.3f} | {sum(gb) / len(gb):.3f} | "
              f"{sum(diff) / len(diff):+.3f} [{lo:+.3f}, {hi:+.3f}] |", flush=True)
    if len(args.runs) > 1:
        lo, hi = bootstrap_interval(pooled)
        print(f"| pooled ({len(pooled)} prompts) | | | | {sum(pooled) / len(pooled):+.3f} [{lo:+.3f}, {hi:+.3f}] |")


if __name__ == "__main__":
    main()
