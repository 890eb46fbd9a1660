"""One PPO iteration at the scale a GPU user brings (issue #46 item 5): does it fit on one GPU, its peak memory and
its time per phase.

    python bench/ppo_at_scale.py --device cuda --shape llama8b [--quant 4bit] [--batch 16] [--new 64] [--json F]
    python bench/ppo_at_scale.py --device cpu --shape tiny --batch 4 --new 8          # the same path, a dry run

The body is Llama-3.1-8B's (``--shape llama8b``: hidden 4096, 32 layers, 32/8 heads, intermediate 14336, vocab
128256, untied; bench/shapes.py), random weights built on the device in bf16 (nothing downloaded, nothing written
unless ``--quant 4bit``, which saves the bf16 weights once to a temporary folder and loads them 4-bit through
bitsandbytes: QLoRA). The policy is ``PPOModule`` as the recipes build it: LoRA policy and value adapters (r 8) on
the frozen base, the reference = adapters off; the reward is a program (the response's length, scaled): a second
8B reward model would measure the reward model, not PPO. Lightning ``precision="bf16-true"`` over bf16 weights.
One untimed warm-up iteration, then ``--iters`` timed; the phases are the sampler (``generate``), the rollout's
no-grad forwards (``score``) and the update epochs, from bench/compare_trl.py's timers. ``torch.cuda``'s peak
allocated memory is printed after the build and after the iterations; a CUDA out-of-memory error is reported as
"does not fit", with the phase it happened in.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from compare_trl import report_header, summary, sync_fn, timed  # bench/ is the script's folder
from shapes import SHAPES, build_tokenizer, llama_config, make_prompts


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def build(args, folder: Path):
    """The bf16 random model on the device (or 4-bit, loaded from a bf16 copy written to ``folder``)."""
    from transformers import LlamaForCausalLM

    from lrlhf.models import ModelConfig, load_causal_lm

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    with default_dtype(torch.bfloat16), device:
        model = LlamaForCausalLM(llama_config(SHAPES[args.shape], max_positions=2048))
    if args.quant == "4bit":
        model.save_pretrained(folder)
        del model
        return load_causal_lm(ModelConfig(str(folder), dtype="bfloat16", quantization="4bit"))
    return model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    parser.add_argument("--quant", default="none", choices=["none", "4bit"])
    parser.add_argument("--batch", type=int, default=16, help="prompts per iteration")
    parser.add_argument("--new", type=int, default=64, help="response tokens")
    parser.add_argument("--iters", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from lightning.pytorch import Trainer

    from lrlhf.data.datamodules import PromptDataModule
    from lrlhf.data.records import PromptExample
    from lrlhf.functional import FixedKLController
    from lrlhf.models import LoraSpec
    from lrlhf.modules import PPOConfig, PPOModule
    from lrlhf.modules.critic import ValueAdapter
    from lrlhf.rewards import FunctionReward

    report_header(args)
    cuda = args.device == "cuda"
    peak = (lambda: torch.cuda.max_memory_allocated() / 2**30) if cuda else (lambda: None)
    out = {"shape": args.shape, "quant": args.quant, "batch": args.batch, "new": args.new, "device":
           torch.cuda.get_device_name() if cuda else "cpu"}
    phases: dict[str, list[float]] = {"generate": [], "score": [], "update": []}
    phase = "build"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            start = time.perf_counter()
            build_tokenizer(Path(tmp) / "tokenizer", SHAPES[args.shape]["vocab_size"])
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(Path(tmp) / "tokenizer")
            model = build(args, Path(tmp) / "weights")
            out.update(build_s=time.perf_counter() - start, peak_gib_after_build=peak())
            config = PPOConfig(max_new_tokens=args.new, temperature=1.0, ppo_epochs=1, minibatch_size=args.batch // 2,
                               forward_batch_size=args.batch, lr=1e-5, policy_lora=LoraSpec(r=8))
            reward = FunctionReward(lambda prompt, response: len(response.split()) / args.new, name="length")
            module = timed(PPOModule(model, reward, tokenizer, config, critic=ValueAdapter(LoraSpec(r=8)),
                                     kl_controller=FixedKLController(0.05)), phases, sync_fn(args.device))
            prompts = [PromptExample(p) for p in make_prompts(args.batch * (args.iters + 1),
                                                              SHAPES[args.shape]["vocab_size"], args.seed)]
            data = PromptDataModule(tokenizer, train=prompts, batch_size=args.batch, max_length=128)
            trainer = Trainer(accelerator="gpu" if cuda else "cpu", devices=1, precision="bf16-true", logger=False,
                              enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                              max_steps=(args.iters + 1) * module.updates_per_rollout(args.batch),
                              num_sanity_val_steps=0, limit_val_batches=0)
            phase = "the PPO iterations"
            trainer.fit(module, datamodule=data)
        except torch.OutOfMemoryError as err:
            out.update(fits=False, failed_in=phase, error=str(err).splitlines()[0], peak_gib=peak())
            print(f"does not fit: CUDA out of memory in {phase} (peak {out['peak_gib']:.1f} GiB): {out['error']}")
        else:
            timed_phases = {k: summary(v[1:])[0] for k, v in phases.items() if len(v) > 1}  # the warm-up dropped
            out.update(fits=True, peak_gib=peak(), phases_s=timed_phases, iteration_s=sum(timed_phases.values()))
            memory = f", peak CUDA memory {out['peak_gib']:.1f} GiB" if cuda else ""
            print(f"{args.shape} ({args.quant}): one PPO iteration {out['iteration_s']:.2f} s = "
                  + ", ".join(f"{k} {v:.2f} s" for k, v in timed_phases.items()) + memory)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0 if out["fits"] else 1


if __name__ == "__main__":
    sys.exit(main())
