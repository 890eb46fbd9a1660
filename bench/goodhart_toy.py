"""Reward over-optimisation on the toy world: PPO with a deliberately weak KL, held-out gold vs proxy (issue 6).

SFT -> reward model (from the SFT model; ``bench/ppo_toy.py``'s recipe) -> PPO (LoRA) with a weak fixed beta and
a long response budget (the annotators' length bias pays only with >= ~24 filler words, docs/toy_world.md).
:class:`HeldOutUtilityEarlyStopping` evaluates gold utility (held-out eval prompts), proxy reward and KL every
``--every`` rollouts, keeps the best checkpoint by gold, and writes the Goodhart plot. At the end the kept
checkpoint is re-evaluated with another seed and more samples.

    PYTHONPATH=src python bench/goodhart_toy.py --out /tmp/goodhart [--kl 0.005] [--rollouts 200] [--lr 3e-3]

SFT and RM are cached in ``--out`` (rerun PPO only by pointing at the same folder). ``--kl 0 --rollouts 400``
shows the length bias being exploited (responses of ~28 tokens); ``--patience 4`` lets early stopping stop the
run (see docs/callbacks.md for the figures).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import lightning.pytorch as pl
import torch
from transformers import AutoTokenizer

from lrlhf.callbacks import HeldOutUtilityEarlyStopping, ResumableCheckpoint
from lrlhf.data.datamodules import PreferenceDataModule, PromptDataModule, SFTDataModule
from lrlhf.data.toy import build_world
from lrlhf.functional import FixedKLController
from lrlhf.models import LoraSpec, ModelConfig, load_calibration, load_reward_model
from lrlhf.modules import PPOConfig, PPOModule, RewardConfig, RewardModule, SFTConfig, SFTModule, compute_calibration
from lrlhf.modules.critic import ValueAdapter


def _trainer(out, **kw):
    return pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                      default_root_dir=out, **kw)


def sft_and_rm(out: Path, world, tokenizer, seed: int, sft_steps: int, rm_steps: int) -> tuple[Path, Path]:
    sft_dir, rm_dir = out / "sft" / "merged", out / "rm"
    if not sft_dir.exists():
        pl.seed_everything(seed, verbose=False)
        sft = SFTModule(ModelConfig(str(world.model)), tokenizer,
                        SFTConfig(lr=3e-3, warmup_steps=30, scheduler="cosine"))
        data = SFTDataModule(tokenizer, train=str(world.sft_train), val=str(world.sft_val), batch_size=64,
                             max_length=64, seed=seed)
        _trainer(out, max_steps=sft_steps).fit(sft, datamodule=data)
        sft.export(out / "sft")
    if not (rm_dir / "reward_calibration.json").exists():
        pl.seed_everything(seed, verbose=False)
        rm = RewardModule(ModelConfig(str(sft_dir)), RewardConfig(lr=3e-3, warmup_steps=20, scheduler="cosine",
                                                                  weight_decay=0.01), tokenizer=world.tokenizer)
        pairs = PreferenceDataModule(str(world.tokenizer), train=str(world.pref_train), val=str(world.pref_test),
                                     batch_size=32, eval_batch_size=200, max_length=128, seed=seed)
        _trainer(out, max_steps=rm_steps).fit(rm, datamodule=pairs)
        calibration = compute_calibration(rm, pairs, reference="pref_test completions")
        tmp = out / "rm.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        rm.export(tmp)
        calibration.save(tmp)
        os.replace(tmp, rm_dir)
    return sft_dir, rm_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--sft-steps", type=int, default=600)
    parser.add_argument("--rm-steps", type=int, default=1100)
    parser.add_argument("--kl", type=float, default=0.005, help="fixed beta (deliberately weak)")
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--budget", type=float, default=600.0, help="PPO seconds at most (max_time)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--minibatch", type=int, default=16)
    parser.add_argument("--every", type=int, default=5, help="held-out evaluation every n rollouts")
    parser.add_argument("--eval-prompts", type=int, default=100)
    parser.add_argument("--eval-samples", type=int, default=2)
    parser.add_argument("--patience", type=int, default=0, help="0 = never stop (full curve)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--run-name", default="ppo")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print("command:", " ".join(sys.argv), flush=True)
    out = Path(args.out)
    world = build_world(out / "world", seed=args.seed)
    tokenizer = AutoTokenizer.from_pretrained(world.tokenizer)
    start = time.perf_counter()
    sft_dir, rm_dir = sft_and_rm(out, world, tokenizer, args.seed, args.sft_steps, args.rm_steps)
    print(f"SFT + RM ready in {time.perf_counter() - start:.1f} s", flush=True)

    from lrlhf.data.formats import load_records

    evals, _ = load_records(str(world.eval_prompts), "prompt", verbose=False)
    evals = evals[:args.eval_prompts]
    run = out / args.run_name
    pl.seed_everything(args.seed, verbose=False)
    config = PPOConfig(max_new_tokens=args.max_new_tokens, temperature=1.0, ppo_epochs=args.epochs,
                       minibatch_size=args.minibatch, forward_batch_size=64, lr=args.lr, policy_lora=LoraSpec(r=8))
    ppo = PPOModule(ModelConfig(str(sft_dir)), load_reward_model(rm_dir), tokenizer, config,
                    calibration=load_calibration(rm_dir), critic=ValueAdapter(LoraSpec(r=8), vf_coef=0.1),
                    kl_controller=FixedKLController(args.kl))
    es = WithStartPoint(evals, "toy_gold", every_n_rollouts=args.every,
                                     patience=args.patience or None, n_samples=args.eval_samples, seed=4321,
                                     batch_size=128)
    callbacks = [es,
                 ResumableCheckpoint(dirpath=run / "checkpoints", every_n_rollouts=args.every, keep_last_k=2,
                                     config=vars(args))]
    prompts = PromptDataModule(tokenizer, train=str(world.rl_prompts), batch_size=args.batch, max_length=64,
                               seed=args.seed)
    trainer = pl.Trainer(accelerator="cpu", logger=False, callbacks=callbacks, enable_progress_bar=False,
                         enable_model_summary=False, max_epochs=-1,
                         max_steps=args.rollouts * ppo.updates_per_rollout(args.batch),
                         max_time={"seconds": args.budget}, default_root_dir=run)
    start = time.perf_counter()
    trainer.fit(ppo, datamodule=prompts)
    ppo_s = time.perf_counter() - start

    history = es.history
    print(f"PPO: {ppo_s:.1f} s, {ppo.rollouts_done} rollouts x {args.batch} prompts (beta {args.kl} fixed, lr "
          f"{args.lr}, {args.max_new_tokens} new tokens)")
    print(f"{'rollout':>7} {'gold':>6} {'proxy':>7} {'KL':>7} {'sqrtKL':>6} {'length':>6}")
    for h in history:
        print(f"{h['rollout']:>7} {h['utility']:6.3f} {h['proxy']:7.3f} {h['kl']:7.2f} "
              f"{max(h['kl'], 0) ** 0.5:6.2f} {h['length']:6.1f}")
    best = es.best
    peak = max(range(len(history)), key=lambda i: history[i]["utility"])
    after = history[peak:]
    print(f"best evaluated gold {best['utility']:.3f} at rollout {best['rollout']} (proxy {best['proxy']:.3f}, KL "
          f"{best['kl']:.2f}); last: gold {history[-1]['utility']:.3f}, proxy {history[-1]['proxy']:.3f}, KL "
          f"{history[-1]['kl']:.2f}")
    print(f"after the gold peak: proxy {after[0]['proxy']:.3f} -> max {max(h['proxy'] for h in after):.3f}, gold "
          f"{after[0]['utility']:.3f} -> min {min(h['utility'] for h in after):.3f}")

    # re-evaluate the kept checkpoint with another seed and more samples
    kept = torch.load(es.best_model_path, weights_only=True)
    ppo.load_state_dict(kept["state_dict"], strict=False)
    check = HeldOutUtilityEarlyStopping(evals, "toy_gold", n_samples=4, seed=999, batch_size=128, plot=False)
    again = check.evaluate(None, ppo)
    ratio = again["utility"] / best["utility"]
    print(f"kept checkpoint (rollout {kept['lrlhf']['rollouts_done']}) re-evaluated (seed 999, 4 samples): gold "
          f"{again['utility']:.3f} = {ratio:.3f} x best evaluated ({'within' if ratio >= 0.95 else 'NOT within'} 5 %)")
    (run / "summary.json").write_text(json.dumps({"args": vars(args), "history": history, "best": best,
                                                  "kept_reevaluated": again, "ppo_seconds": ppo_s}, indent=2))
    print(f"plot: {run / 'goodhart.png'}")


class WithStartPoint(HeldOutUtilityEarlyStopping):
    """Also evaluates the SFT policy (zero-init adapters) as rollout 0, so the curve starts at KL 0; that point
    is plotted but not eligible as the kept checkpoint (there is no PPO checkpoint of it)."""

    def on_train_start(self, trainer, pl_module):
        if not self.history:
            result = self.evaluate(trainer, pl_module)
            self.history.append({"rollout": 0, "global_step": 0, **result})
            print(f"rollout 0 (SFT): gold {result['utility']:.3f}, proxy {result['proxy']:.3f}", flush=True)


if __name__ == "__main__":
    main()
