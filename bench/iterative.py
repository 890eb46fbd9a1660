"""Iterative RLHF against single-round PPO at equal labels and optimiser steps (issue #17).

    python bench/iterative.py --runs SINGLE_RUN:ITERATIVE_RUN [SINGLE_RUN:ITERATIVE_RUN ...] [--threads 1]

Each pair: a ``recipe=ppo_lora`` run folder and a ``recipe=iterative_ppo`` one of the same world and seed. For each,
both final policies' held-out gold (4 samples per prompt at temperature 1, the same sampling seed for both), the
paired difference iterative - single with its 95 % prompt-bootstrap interval, and each final reward model's
pairwise accuracy against gold on its own final policy's held-out samples (where the RM stands when PPO stops
optimising it). With several pairs (seeds), the difference pooled over all their prompts too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

N_SAMPLES = 4


def _gold_per_prompt(folder: str, prompts: list, seed: int) -> list[float]:
    from lrlhf.eval.utility import sample_gold_utility
    from lrlhf.models import ModelConfig, load_causal_lm, load_tokenizer

    config = ModelConfig(folder)
    return list(sample_gold_utility(load_causal_lm(config).eval(), load_tokenizer(config), prompts,
                                    n_samples=N_SAMPLES, temperature=1.0, max_new_tokens=32, seed=seed).per_prompt)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", required=True, help="SINGLE_RUN:ITERATIVE_RUN, one per seed")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0, help="the sampling seed of the comparison")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from omegaconf import OmegaConf

    from lrlhf.data.formats import load_records
    from lrlhf.eval.round_figures import held_out_prompts, held_out_samples, pair_accuracy, rm_scorer
    from lrlhf.functional.stats import bootstrap_interval
    from lrlhf.run.rounds import held_out_settings

    print(f"threads {args.threads}; {N_SAMPLES} samples per held-out prompt, sampling seed {args.seed}")
    pooled = []
    for pair in args.runs:
        single_run, iterative_run = (Path(p) for p in pair.split(":"))
        cfg = OmegaConf.load(single_run / "config.yaml")
        summary = json.loads((iterative_run / "summary.json").read_text())
        prompts = load_records(cfg.eval.prompts, "prompt", verbose=False)[0]
        single, iterative = str(single_run / "export" / "merged"), str(Path(summary["export"]) / "merged")
        g_single, g_iter = (_gold_per_prompt(p, prompts, args.seed) for p in (single, iterative))
        diff = [b - a for a, b in zip(g_single, g_iter, strict=True)]
        pooled += diff
        lo, hi = bootstrap_interval(diff)
        print(f"\nworld seed {cfg.seed} ({len(prompts)} held-out prompts): single-round PPO gold "
              f"{sum(g_single) / len(g_single):.3f}, iterative {sum(g_iter) / len(g_iter):.3f}; iterative - single "
              f"{sum(diff) / len(diff):+.3f} (95% paired bootstrap [{lo:+.3f}, {hi:+.3f}]); labels "
              f"{summary['labels_total']}, PPO steps {summary['ppo_steps_total']}")
        last_rm = iterative_run / f"round_{len(summary['rounds'])}" / "rm" / "model"
        held_out = held_out_settings(cfg)
        records = held_out_prompts(held_out)
        for name, policy, rm in (("single", single, cfg.module.reward_model), ("iterative", iterative, last_rm)):
            s = held_out_samples(policy, held_out, seed=args.seed + 7919)
            score = rm_scorer(rm)
            acc = pair_accuracy(score(records, s["a"]), score(records, s["b"]), s["u_a"], s["u_b"])
            lo, hi = acc["interval"]
            print(f"  {name}: final RM's accuracy on its final policy's samples {acc['accuracy']:.3f} "
                  f"[{lo:.3f}, {hi:.3f}] ({acc['pairs']} pairs the gold does not tie)")
    if len(args.runs) > 1:
        lo, hi = bootstrap_interval(pooled)
        print(f"\npooled over {len(args.runs)} seeds ({len(pooled)} prompts): iterative - single "
              f"{sum(pooled) / len(pooled):+.3f} (95% paired bootstrap [{lo:+.3f}, {hi:+.3f}])")


if __name__ == "__main__":
    sys.exit(main())
