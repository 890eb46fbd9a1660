"""Iterative RLHF against single-round PPO at equal labels and optimiser steps (issue #17).

    python bench/iterative.py --baseline RUN --iterative RUN [--threads 1]

RUN folders: a ``recipe=ppo_lora`` run and a ``recipe=iterative_ppo`` run of the same world and seed. Prints both
policies' held-out gold (4 samples per prompt, the same seed for both) and the paired difference iterative - single
with its 95 % prompt-bootstrap interval, and each final reward model's pairwise accuracy (against gold) on its own
final policy's samples: where the RM stands when PPO stops optimising it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, type=Path)
    parser.add_argument("--iterative", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from omegaconf import OmegaConf

    from lrlhf.eval import compare_with_sft
    from lrlhf.models import ModelConfig, load_causal_lm, load_tokenizer
    from lrlhf.rounds import held_out_samples, pair_accuracy, rm_scores

    base_cfg = OmegaConf.load(args.baseline / "config.yaml")
    it_summary = json.loads((args.iterative / "summary.json").read_text())
    prompts = base_cfg.eval.prompts
    single = str(args.baseline / "export" / "merged")
    iterative = str(Path(it_summary["export"]) / "merged")
    tokenizer = load_tokenizer(ModelConfig(single))
    model, baseline = (load_causal_lm(ModelConfig(p)).eval() for p in (iterative, single))
    figures = compare_with_sft(model, baseline, tokenizer, prompts, "iterative", n_samples=4, temperature=1.0,
                               max_new_tokens=32, seed=args.seed)
    lo, hi = figures["gold/iterative_minus_sft_interval"]
    print(f"threads {args.threads}; held-out prompts {prompts}")
    print(f"single-round PPO gold {figures['gold/sft']:.3f}, iterative {figures['gold/iterative']:.3f}; "
          f"iterative - single {figures['gold/iterative_minus_sft']:+.3f} "
          f"(95% paired bootstrap [{lo:+.3f}, {hi:+.3f}])")
    from lrlhf.data.formats import load_records

    records = load_records(prompts, "prompt", verbose=False)[0]
    last_rm = args.iterative / f"round_{len(it_summary['rounds'])}" / "rm" / "model"
    for name, policy, rm in (("single", single, base_cfg.module.reward_model), ("iterative", iterative, last_rm)):
        s = held_out_samples(policy, base_cfg, seed=args.seed + 7919)
        acc = pair_accuracy(rm_scores(rm, records, s["a"]), rm_scores(rm, records, s["b"]), s["u_a"], s["u_b"])
        lo, hi = acc["interval"]
        print(f"{name}: final RM's accuracy on its final policy's samples {acc['accuracy']:.3f} [{lo:.3f}, {hi:.3f}] "
              f"({acc['pairs']} pairs the gold does not tie)")
    print(json.dumps(figures, default=str))


if __name__ == "__main__":
    sys.exit(main())
