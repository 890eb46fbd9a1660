"""Held-out constraint satisfaction by kind (issue #32, ``recipe=grpo_constraints``): the starting model and a run's
exported policy answer the constraints world's evaluation prompts greedily (as the run's own final comparison does),
and each kind's satisfaction is printed before and after, with the overall paired gain and its 95 % prompt-bootstrap
interval.

    python bench/constraint_kinds.py RUN [--threads 1]      # a grpo_constraints run folder (its config.yaml names all)
"""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict
from pathlib import Path

import torch
from omegaconf import OmegaConf

from lrlhf.data.constraints import satisfied
from lrlhf.data.formats import load_records
from lrlhf.models import ModelConfig, load_causal_lm, load_tokenizer
from lrlhf.models.generation import SamplingConfig, generate_responses


def answers(folder: ModelConfig, tokenizer, prompts, max_new_tokens: int) -> list[str]:
    model = load_causal_lm(folder).eval()
    return generate_responses(model, tokenizer, prompts, SamplingConfig(max_new_tokens, 0.0, 0), batch_size=16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    run = Path(args.run)
    cfg = OmegaConf.load(run / "config.yaml")
    prompts, _ = load_records(str(Path(cfg.world.dir) / "eval_prompts.jsonl"), "prompt", verbose=False)
    start = ModelConfig(**{k: v for k, v in OmegaConf.to_container(cfg.module.policy).items() if k != "_target_"})
    tokenizer = load_tokenizer(start)
    new = int(cfg.module.config.max_new_tokens)
    before = answers(start, tokenizer, prompts, new)
    after = answers(ModelConfig(str(run / "export" / "merged")), tokenizer, prompts, new)
    met = {name: [satisfied(p.meta["constraint"], t) for p, t in zip(prompts, texts, strict=True)]
           for name, texts in (("start", before), ("policy", after))}
    by_kind = defaultdict(lambda: [0, 0, 0])
    for p, a, b in zip(prompts, met["start"], met["policy"], strict=True):
        row = by_kind[p.meta["constraint"]["kind"]]
        row[0], row[1], row[2] = row[0] + 1, row[1] + a, row[2] + b
    print(f"| kind | prompts | start | policy |  ({args.threads} torch thread(s), greedy, {new} new tokens)")
    print("|---|---|---|---|")
    for kind, (n, a, b) in sorted(by_kind.items()):
        print(f"| {kind} | {n} | {a / n:.2f} | {b / n:.2f} |")
    gains = [float(b) - float(a) for a, b in zip(met["start"], met["policy"], strict=True)]
    rng = random.Random(0)
    boot = sorted(sum(rng.choice(gains) for _ in gains) / len(gains) for _ in range(2000))
    total = {k: sum(v) / len(v) for k, v in met.items()}
    gain = sum(gains) / len(gains)
    print(f"| all | {len(prompts)} | {total['start']:.3f} | {total['policy']:.3f} | gain {gain:+.3f} "
          f"[{boot[49]:+.3f}, {boot[1949]:+.3f}] |")
    (run / "constraint_kinds.json").write_text(json.dumps({"by_kind": by_kind, "total": total}, indent=2) + "\n")


if __name__ == "__main__":
    main()
