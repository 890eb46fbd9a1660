"""Time one PPO step by phase (generate, score, update) and report the peak RSS.

    PYTHONPATH=src python bench/ppo_step.py [--model DIR [--gguf FILE]] [--batch 32] [--new 32] [--steps 3]
        [--ensemble N]

Without ``--model`` the toy world's tiny Llama is built in a temporary folder (policy and reward model alike);
with it, the same model also serves as a random-head reward model (timings only: the rewards mean nothing).
``--ensemble N``: the reward is an ensemble of N such models (full copies, mean - std; issue #19's cost per PPO
iteration with N members).
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder (default: the toy world's)")
    parser.add_argument("--gguf", help="GGUF file name inside --model")
    parser.add_argument("--batch", type=int, default=32, help="prompts per rollout")
    parser.add_argument("--new", type=int, default=32, help="max new tokens")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--minibatch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3, help="rollouts timed (the first is reported apart)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ensemble", type=int, default=0, help="N > 0: an ensemble of N reward models")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from lightning.pytorch import Trainer, seed_everything

    from lrlhf.data.datamodules import PromptDataModule
    from lrlhf.data.records import PromptExample
    from lrlhf.models import LoraSpec, ModelConfig, ScalarModel, load_causal_lm, load_tokenizer
    from lrlhf.modules import PPOConfig, PPOModule
    from lrlhf.modules.critic import ValueAdapter

    seed_everything(0, verbose=False)
    if args.model:
        cfg = ModelConfig(args.model, gguf_file=args.gguf)
        prompts = [PromptExample([{"role": "user", "content": f"List {n} fruits."}]) for n in range(1, 65)]
    else:
        from lrlhf.data.formats import load_records
        from lrlhf.data.toy import build_world

        world = build_world(Path(tempfile.mkdtemp(prefix="ppo_step_")) / "world", seed=0)
        cfg = ModelConfig(str(world.model))
        prompts, _ = load_records(str(world.rl_prompts), "prompt", verbose=False)
    if args.model:
        tokenizer = load_tokenizer(cfg)
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(world.tokenizer)  # the toy model folder holds none
    config = PPOConfig(max_new_tokens=args.new, ppo_epochs=args.epochs, minibatch_size=args.minibatch,
                       forward_batch_size=args.batch, policy_lora=LoraSpec(r=8))

    times: dict[str, list[float]] = defaultdict(list)

    class Timed(PPOModule):
        def sample(self, query_ids, query_mask, max_new_tokens=None):
            if max_new_tokens is not None:  # the sampler self-check's short samples: not a rollout
                return super().sample(query_ids, query_mask, max_new_tokens)
            t = time.perf_counter()
            out = super().sample(query_ids, query_mask)
            times["generate"].append(time.perf_counter() - t)
            return out

        def make_rollout(self, batch):
            t = time.perf_counter()
            n = len(times["generate"])
            out = super().make_rollout(batch)
            # score = the rollout's no-grad forwards (policy, reference, value, reward) = rollout - generate
            times["score"].append(time.perf_counter() - t - sum(times["generate"][n:]))
            return out

        def update(self, rollout):
            t = time.perf_counter()
            out = super().update(rollout)
            times["update"].append(time.perf_counter() - t)
            return out

    if args.ensemble:
        from lrlhf.functional import MeanMinusStd
        from lrlhf.models.ensemble import RewardEnsembleModel
        from lrlhf.models.reward import RewardCalibration

        reward = RewardEnsembleModel([ScalarModel(load_causal_lm(cfg)) for _ in range(args.ensemble)],
                                     [RewardCalibration(0.0, 1.0, 0)] * args.ensemble, MeanMinusStd(1.0))
    else:
        reward = ScalarModel(load_causal_lm(cfg))
    module = Timed(load_causal_lm(cfg), reward, tokenizer, config,
                   critic=ValueAdapter(LoraSpec(r=8)))
    module.configure_model()
    data = PromptDataModule(tokenizer, train=prompts, batch_size=args.batch, max_length=128)
    trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, max_epochs=-1,
                      max_steps=args.steps * module.updates_per_rollout(args.batch))
    trainer.fit(module, datamodule=data)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"model: {cfg.name_or_path}{' / ' + cfg.gguf_file if cfg.gguf_file else ''}; reward: "
          f"{f'ensemble of {args.ensemble}' if args.ensemble else 'one model'}; threads "
          f"{torch.get_num_threads()}; batch {args.batch} prompts, {args.new} new tokens, {args.epochs} epochs x "
          f"minibatch {args.minibatch} ({module.updates_per_rollout(args.batch)} optimiser steps per rollout)")
    for phase in ("generate", "score", "update"):
        t = times[phase]
        rest = t[1:] or t
        print(f"{phase:>8}: first {t[0]:.2f} s, then mean {sum(rest) / len(rest):.2f} s over {len(rest)}")
    print(f"mean response length (last rollout): {trainer.callback_metrics['rollout/length_mean'].item():.1f}")
    print(f"peak RSS: {peak_mib:.0f} MiB")


if __name__ == "__main__":
    main()
