"""Reward model on the toy world: held-out pairwise accuracy against the annotators' accuracy ceiling.

    PYTHONPATH=src python bench/rm_toy.py [--world DIR] [--budget 115] [--lr 3e-3] [--lora] [--no-rankings]

Starts from the toy world's tiny Llama at its random init (no SFT model exists yet), trains on
``pref_train`` pairs plus ``rank_train`` rankings (one batch of each per step; ``--no-rankings`` for pairs
only) for at most ``--budget`` seconds or ``--max-steps`` with 1 torch thread, then scores ``pref_test``.
Prints threads, wall time, steps, accuracy on non-tie test pairs, the ceiling from world.json (on
pref_train pairs) and the same ceiling recomputed on pref_test, the Bayes predictor's accuracy on the
realised test labels, ECE and AUROC.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch


def test_set_yardsticks(world: Path, annotators: dict) -> dict:
    """The annotators' ceiling on pref_test and the Bayes predictor's accuracy on its realised labels."""
    from lrlhf.data.toy import AnnotatorConfig, accuracy_ceiling, gold_utility, label_probabilities
    from lrlhf.data.toy.utility import response_tokens

    cfg = AnnotatorConfig(**annotators)
    ga, gb, la, lb, bayes = [], [], [], [], []
    for line in (world / "pref_test.jsonl").read_text().splitlines():
        r = json.loads(line)
        a, b = r["chosen"][0]["content"], r["rejected"][0]["content"]
        ga.append(gold_utility(r, a))
        gb.append(gold_utility(r, b))
        la.append(len(response_tokens(a)))
        lb.append(len(response_tokens(b)))
        if r["target"] != 0.5:
            p_a, p_b, _ = label_probabilities(ga[-1], gb[-1], la[-1], lb[-1], cfg)
            bayes.append(1.0 if p_a > p_b else 0.5 if p_a == p_b else 0.0)
    return {"ceiling": accuracy_ceiling(ga, gb, la, lb, cfg), "bayes": sum(bayes) / len(bayes), "n": len(bayes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", help="a built toy world (default: build seed 0 in a temp dir)")
    parser.add_argument("--start", help="the model to start from, e.g. the SFT export of bench/sft_toy.py "
                        "(default: the toy world's tiny Llama at its random init)")
    parser.add_argument("--budget", type=float, default=115.0, help="training seconds (Trainer max_time)")
    parser.add_argument("--max-steps", type=int, default=1100)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--scheduler", default="cosine")
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--center", type=float, default=0.0)
    parser.add_argument("--lora", action="store_true", help="LoRA r=8 instead of full fine-tuning")
    parser.add_argument("--no-rankings", dest="rankings", action="store_false", help="train on pref_train only")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from lightning.pytorch import Trainer, seed_everything
    from lightning.pytorch.utilities import CombinedLoader

    from lrlhf.data.datamodules import PreferenceDataModule
    from lrlhf.data.formats import load_records
    from lrlhf.data.toy import build_world
    from lrlhf.models import LoraSpec, ModelConfig
    from lrlhf.modules import RewardConfig, RewardModule

    seed_everything(args.seed, verbose=False)
    tmp = None
    if args.world:
        world = Path(args.world)
    else:
        tmp = tempfile.TemporaryDirectory()
        world = build_world(Path(tmp.name) / "world", seed=0).root
    summary = json.loads((world / "world.json").read_text())
    ceiling = summary["yardsticks"]["annotator_accuracy_ceiling"]
    test_marks = test_set_yardsticks(world, summary["config"]["annotators"])

    config = RewardConfig(lr=args.lr, warmup_steps=args.warmup, scheduler=args.scheduler,
                          weight_decay=args.weight_decay, center_coef=args.center,
                          lora=LoraSpec() if args.lora else None)
    start_model = args.start or str(world / "model")
    module = RewardModule(ModelConfig(start_model), config, tokenizer=world / "tokenizer")
    pairs = PreferenceDataModule(str(world / "tokenizer"), train=str(world / "pref_train.jsonl"),
                                 val=str(world / "pref_val.jsonl"), test=str(world / "pref_test.jsonl"),
                                 batch_size=args.batch_size,
                                 eval_batch_size=200, max_length=128, seed=args.seed)
    train_loaders = pairs
    if args.rankings:
        rankings, _ = load_records(str(world / "rank_train.jsonl"), "ranking", verbose=False)
        ranks = PreferenceDataModule(str(world / "tokenizer"), train=rankings, batch_size=max(1, args.batch_size // 4),
                                     max_length=128, seed=args.seed)
        pairs.setup("fit")
        ranks.setup("fit")
        train_loaders = CombinedLoader([pairs.train_dataloader(), ranks.train_dataloader()], "max_size_cycle")

    trainer = Trainer(max_steps=args.max_steps, max_time={"seconds": args.budget}, accelerator="cpu",
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
    if args.rankings:
        module = _alternating(module)
    start = time.perf_counter()
    if args.rankings:
        trainer.fit(module, train_dataloaders=train_loaders)
    else:
        trainer.fit(module, datamodule=pairs)
    wall = time.perf_counter() - start
    evaluator = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    # settings are chosen on pref_val; pref_test is the reported figure
    val_accuracy = evaluator.validate(module, dataloaders=pairs.val_dataloader(), verbose=False)[0]["val/accuracy"]
    metrics = evaluator.validate(module, dataloaders=pairs.test_dataloader(), verbose=False)[0]

    print(f"torch threads: {torch.get_num_threads()}")
    origin = args.start or "toy world tiny Llama, random init"
    print(f"start model: {origin}; {'LoRA r=8' if args.lora else 'full FT'}")
    print(f"data: pref_train pairs{' + rank_train rankings' if args.rankings else ''}; "
          f"batch {args.batch_size}, lr {args.lr}, warmup {args.warmup}, {args.scheduler}")
    print(f"train wall time: {wall:.1f} s, steps: {trainer.global_step}, epochs started: {trainer.current_epoch + 1}")
    print(f"pref_val accuracy (non-tie, for choosing settings): {val_accuracy:.3f}")
    print(f"pref_test non-tie pairs: {test_marks['n']}")
    print(f"held-out pairwise accuracy (non-tie): {metrics['val/accuracy']:.3f}")
    print(f"annotator accuracy ceiling (world.json, pref_train): {ceiling:.3f}  gap: "
          f"{100 * (ceiling - metrics['val/accuracy']):+.1f} points")
    print(f"ceiling recomputed on pref_test: {test_marks['ceiling']:.3f}; "
          f"Bayes predictor on the realised test labels: {test_marks['bayes']:.3f}")
    print(f"NLL: {metrics['val/nll']:.3f}  ECE: {metrics['val/ece']:.3f}  AUROC: {metrics['val/auroc']:.3f}")
    print("accuracy by length difference: " + ", ".join(
        f"{k}={metrics[f'val/accuracy_{k}']:.3f}" for k in ("chosen_longer", "similar", "chosen_shorter")))
    print("accuracy by task: " + ", ".join(
        f"{k.rsplit('/', 1)[1]}={v:.3f}" for k, v in sorted(metrics.items()) if k.startswith("val/accuracy_source/")))
    print(f"reward-length correlation: {metrics['val/reward_length_corr']:.3f}; margin mean "
          f"{metrics['val/margin_mean']:.2f} std {metrics['val/margin_std']:.2f}")
    if tmp is not None:
        tmp.cleanup()


def _alternating(module):
    """Train on a pair batch and a ranking batch each step (CombinedLoader yields both): the mean loss."""
    cls = type(module)

    class Alternating(cls):
        def training_step(self, batch, batch_idx):
            batches = batch[0] if isinstance(batch, tuple) else batch
            losses = [cls.training_step(self, b, batch_idx) for b in batches]
            return sum(losses) / len(losses)

    module.__class__ = Alternating
    return module


if __name__ == "__main__":
    main()
