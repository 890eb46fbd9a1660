"""The toy world's exact solve rate (gold utility 1) before and after RL, paired over prompts (issue #32: a verifiable
reward's figure): each run's SFT and its exported policy answer the world's 200 evaluation prompts with 4 samples at
temperature 1, the same seed; SFT's and the policy's solve rates and the gain with its 95 % prompt-bootstrap interval.

    python bench/solve_rate.py RUN [RUN ...]      # run folders of PPO / RLOO / GRPO (their config.yaml names both)

1 torch thread. A run trained with this version reports the same figures itself (summary.json: gold/<name>_solved).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from omegaconf import OmegaConf

from lrlhf.eval.utility import compare_with_sft
from lrlhf.models import ModelConfig, load_causal_lm, load_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| run | SFT solved | policy solved | gain [95 %] | gold SFT -> policy |\n|---|---|---|---|---|")
    for run in args.runs:
        cfg = OmegaConf.load(Path(run) / "config.yaml")
        sft = ModelConfig(f"{cfg.deps.sft}/merged")
        policy = ModelConfig(str(Path(run) / "export" / "merged"))
        out = compare_with_sft(load_causal_lm(policy).eval(), load_causal_lm(sft).eval(), load_tokenizer(sft),
                               f"{cfg.world.dir}/eval_prompts.jsonl", "rl", n_samples=4, temperature=1.0,
                               max_new_tokens=32, seed=args.seed)
        lo, hi = out["gold/rl_solved_gain_interval"]
        print(f"| {run} | {out['gold/sft_solved']:.3f} | {out['gold/rl_solved']:.3f} | "
              f"{out['gold/rl_solved_gain']:+.3f} [{lo:+.3f}, {hi:+.3f}] | "
              f"{out['gold/sft']:.3f} -> {out['gold/rl']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
