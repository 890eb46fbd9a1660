"""PPO on the toy world: SFT -> reward model (from the SFT model) -> PPO (LoRA), then held-out gold utility.

Target (issue 5): the PPO policy's mean sampled gold utility on the evaluation prompts is above the SFT
policy's beyond the noise (a paired bootstrap interval over prompts), with a PPO phase <= 5 minutes on
1 torch thread.

    PYTHONPATH=src python bench/ppo_toy.py [--ppo-budget 240] [--rm-steps 1100] [--lr 3e-3] [--kl 0.2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import lightning.pytorch as pl
import torch
from transformers import AutoTokenizer

from lrlhf.data.datamodules import PreferenceDataModule, PromptDataModule, SFTDataModule
from lrlhf.data.formats import load_records
from lrlhf.data.toy import build_world
from lrlhf.eval import bootstrap_interval, sample_gold_utility
from lrlhf.functional import FixedKLController
from lrlhf.models import LoraSpec, ModelConfig, load_reward_model
from lrlhf.modules import PPOConfig, PPOModule, RewardConfig, RewardModule, SFTConfig, SFTModule, compute_calibration
from lrlhf.modules.critic import ValueAdapter


def _trainer(out, **kw):
    return pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                      default_root_dir=out, **kw)


def per_prompt_utility(model, tokenizer, prompts, n_samples: int, seed: int) -> torch.Tensor:
    """``(P,)`` mean gold utility of ``n_samples`` responses (T = 1, 32 new tokens) per prompt."""
    estimate = sample_gold_utility(model, tokenizer, prompts, n_samples, temperature=1.0, max_new_tokens=32, seed=seed)
    return torch.tensor(estimate.per_prompt)


def bootstrap(x: torch.Tensor) -> tuple[float, float]:
    return bootstrap_interval(x.tolist())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft-steps", type=int, default=600)
    parser.add_argument("--rm-steps", type=int, default=1100, help="RM optimiser steps (fixed: a wall-clock "
                        "budget would make the RM, and so the PPO result, differ from run to run)")
    parser.add_argument("--ppo-budget", type=float, default=240.0, help="PPO training seconds (max_time)")
    parser.add_argument("--rollouts", type=int, default=80, help="at most this many rollouts")
    parser.add_argument("--batch", type=int, default=32, help="prompts per rollout")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--kl", type=float, default=0.2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--minibatch", type=int, default=16)
    parser.add_argument("--n-samples", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print("command:", " ".join(sys.argv))
    out = Path(args.out or tempfile.mkdtemp(prefix="ppo_toy_"))
    world = build_world(out / "world", seed=args.seed)
    tokenizer = AutoTokenizer.from_pretrained(world.tokenizer)

    # 1. SFT (bench/sft_toy.py's recipe), exported merged
    pl.seed_everything(args.seed, verbose=False)
    start = time.perf_counter()
    sft = SFTModule(ModelConfig(str(world.model)), tokenizer,
                    SFTConfig(lr=3e-3, warmup_steps=30, scheduler="cosine"))
    data = SFTDataModule(tokenizer, train=str(world.sft_train), val=str(world.sft_val), batch_size=64,
                         max_length=64, seed=args.seed)
    _trainer(out, max_steps=args.sft_steps).fit(sft, datamodule=data)
    sft_dir = sft.export(out / "sft").merged
    sft_s = time.perf_counter() - start

    # 2. reward model from the SFT model (pairs, full fine-tuning), with a frozen calibration
    start = time.perf_counter()
    rm = RewardModule(ModelConfig(str(sft_dir)), RewardConfig(lr=3e-3, warmup_steps=20, scheduler="cosine",
                                                              weight_decay=0.01), tokenizer=world.tokenizer)
    pairs = PreferenceDataModule(str(world.tokenizer), train=str(world.pref_train), val=str(world.pref_test),
                                 batch_size=32, eval_batch_size=200, max_length=128, seed=args.seed)
    _trainer(out, max_steps=args.rm_steps).fit(rm, datamodule=pairs)
    metrics = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=out).validate(rm, dataloaders=pairs.val_dataloader(), verbose=False)[0]
    calibration = compute_calibration(rm, pairs, reference="pref_test completions")
    rm_dir = rm.export(out / "rm")
    rm_s = time.perf_counter() - start

    # 3. PPO (LoRA policy + value on the merged SFT base)
    pl.seed_everything(args.seed, verbose=False)
    config = PPOConfig(max_new_tokens=32, temperature=1.0, ppo_epochs=args.epochs, minibatch_size=args.minibatch,
                       forward_batch_size=64, lr=args.lr, policy_lora=LoraSpec(r=8))
    ppo = PPOModule(ModelConfig(str(sft_dir)), load_reward_model(rm_dir), tokenizer, config, calibration=calibration,
                    critic=ValueAdapter(LoraSpec(r=8), vf_coef=0.1), kl_controller=FixedKLController(args.kl))
    prompts = PromptDataModule(tokenizer, train=str(world.rl_prompts), batch_size=args.batch, max_length=64,
                               seed=args.seed)
    # Lightning's max_steps counts optimiser steps: rollouts x updates per rollout
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, max_epochs=-1,
                         max_steps=args.rollouts * ppo.updates_per_rollout(args.batch),
                         max_time={"seconds": args.ppo_budget}, default_root_dir=out)
    start = time.perf_counter()
    trainer.fit(ppo, datamodule=prompts)
    ppo_s = time.perf_counter() - start
    m = {k: v.item() for k, v in trainer.callback_metrics.items()}

    # 4. held-out gold utility, SFT vs PPO, same prompts and seed, paired bootstrap over prompts
    evals, _ = load_records(str(world.eval_prompts), "prompt", verbose=False)
    from lrlhf.models import load_causal_lm

    sft_model = load_causal_lm(ModelConfig(str(sft_dir)))
    u_sft = per_prompt_utility(sft_model, tokenizer, evals, args.n_samples, args.seed)
    u_ppo = per_prompt_utility(ppo.model, tokenizer, evals, args.n_samples, args.seed)
    diff = u_ppo - u_sft
    lo, hi = bootstrap(diff)
    print(f"threads: {torch.get_num_threads()}")
    print(f"SFT: {sft_s:.1f} s; RM (from SFT, pairs): {rm_s:.1f} s, held-out accuracy "
          f"{metrics['val/accuracy']:.3f}; calibration mean {calibration.mean:.3f} std {calibration.std:.3f}")
    print(f"PPO: {ppo_s:.1f} s, {ppo.rollouts_done} rollouts x {args.batch} prompts, {trainer.global_step} "
          f"optimiser steps (lr {args.lr}, beta {args.kl}, epochs {args.epochs}, minibatch {args.minibatch})")
    print("last rollout: " + ", ".join(f"{k} {m[k]:.3f}" for k in (
        "rollout/score", "rollout/kl_seq", "rollout/length_mean", "rollout/eos_rate", "ppo/approx_kl",
        "ppo/clipfrac", "ppo/explained_variance") if k in m))
    lo_s, hi_s = bootstrap(u_sft)
    lo_p, hi_p = bootstrap(u_ppo)
    print(f"gold utility (T=1, {args.n_samples} x {len(evals)} eval prompts): SFT {u_sft.mean():.3f} "
          f"[{lo_s:.3f}, {hi_s:.3f}], PPO {u_ppo.mean():.3f} [{lo_p:.3f}, {hi_p:.3f}]")
    verdict = "met" if lo > 0 and ppo_s <= 300 else "NOT met"
    print(f"PPO - SFT: {diff.mean():+.3f}, paired 95% bootstrap [{lo:+.3f}, {hi:+.3f}] (target: above 0 "
          f"in <= 300 s: {verdict})")


if __name__ == "__main__":
    main()
