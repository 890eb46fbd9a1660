"""SFT on the toy world: full fine-tuning of the tiny Llama, then sampled held-out gold utility.

Target (issue 4): the SFT policy's mean gold utility on the evaluation prompts, sampled at temperature 1,
lands within 0.05 of the demonstrator's mean (``world.json`` yardsticks), in <= 2 minutes on 1 torch thread.

    python bench/sft_toy.py [--steps 600] [--lr 3e-3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import lightning.pytorch as pl
import torch
from transformers import AutoTokenizer

from lrlhf.data.datamodules import SFTDataModule
from lrlhf.data.formats import load_records
from lrlhf.data.toy import build_world
from lrlhf.eval import sample_gold_utility
from lrlhf.models import ModelConfig
from lrlhf.modules import SFTConfig, SFTModule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0, help="world and training seed")
    parser.add_argument("--n-samples", type=int, default=4, help="samples per evaluation prompt")
    parser.add_argument("--out", default=None, help="world and logs folder (default: a temporary one)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    out = args.out or tempfile.mkdtemp(prefix="sft_toy_")
    world = build_world(os.path.join(out, "world"), seed=args.seed)
    yardsticks = json.loads(world.world_json.read_text())["yardsticks"]
    tokenizer = AutoTokenizer.from_pretrained(world.tokenizer)
    data = SFTDataModule(tokenizer, train=str(world.sft_train), val=str(world.sft_val),
                         batch_size=args.batch_size, max_length=64, seed=args.seed)
    config = SFTConfig(lr=args.lr, warmup_steps=args.warmup, scheduler="cosine", weight_decay=0.0)
    pl.seed_everything(args.seed, verbose=False)
    module = SFTModule(ModelConfig(str(world.model)), tokenizer, config)
    trainer = pl.Trainer(accelerator="cpu", max_steps=args.steps, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         val_check_interval=None, check_val_every_n_epoch=None, limit_val_batches=0,
                         default_root_dir=out)
    start = time.perf_counter()
    trainer.fit(module, datamodule=data)
    train_s = time.perf_counter() - start
    # validation once, after training (the fit's Trainer skips it to keep the timed loop pure training)
    evaluator = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                           default_root_dir=out)
    val = evaluator.validate(module, datamodule=data, verbose=False)[0]

    prompts, _ = load_records(str(world.eval_prompts), "prompt", verbose=False)
    start = time.perf_counter()
    result = sample_gold_utility(module.model, tokenizer, prompts, n_samples=args.n_samples, temperature=1.0,
                                 max_new_tokens=32, seed=args.seed)
    eval_s = time.perf_counter() - start
    demo = yardsticks["demonstrator_mean_gold"]
    demo_kind = yardsticks["demonstrator_mean_gold_by_kind"]
    print(f"threads: {torch.get_num_threads()}")
    print(f"steps: {args.steps} (batch {args.batch_size}, lr {args.lr}, warmup {args.warmup}, cosine)")
    print(f"train wall time: {train_s:.1f} s ({args.steps / train_s:.1f} steps/s); eval wall time: {eval_s:.1f} s")
    print(f"final train/loss: {trainer.callback_metrics['train/loss'].item():.4f}; "
          f"val/loss: {val['val/loss']:.4f} (ppl {val['val/ppl']:.3f})")
    by_kind = ", ".join(f"{k} {v:.3f}" for k, v in result.by_kind.items())
    print(f"SFT sampled gold utility (T=1, {args.n_samples} x {len(prompts)} prompts): "
          f"{result.mean:.3f} ± {result.stderr:.3f} ({by_kind})")
    demo_by_kind = ", ".join(f"{k} {v:.3f}" for k, v in demo_kind.items())
    print(f"demonstrator mean gold: {demo:.3f} ({demo_by_kind})")
    gap = result.mean - demo
    print(f"gap: {gap:+.3f} (target |gap| <= 0.05: {'met' if abs(gap) <= 0.05 else 'NOT met'})")
    exported = module.export(os.path.join(out, "sft"))
    print(f"SFT model (merged, with tokenizer): {exported.merged}")


if __name__ == "__main__":
    main()
