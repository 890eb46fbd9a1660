"""One GRPO iteration: lrlhf's ``PPOModule`` with GRPO advantages (``recipe=grpo_lora``'s settings) against TRL's
maintained ``GRPOTrainer`` (trl 1.16.0), in one process, alternating (issue #46 item 6):

    PYTHONPATH=src:bench:<trl 1.16 site> python bench/grpo_vs_trl.py [--iters 5] [--warmup 1] [--threads 1]
        [--shape reference|tiny] [--prompts 8] [--k 4] [--new 64]

The model, prompts and tokenizer are bench/compare_trl.py's (a random Llama of ``--shape``, saved once and loaded
by both sides; a word-level tokenizer with a chat template; chat-templated prompts of 10-40 tokens, the same on both
sides). Per iteration: ``--prompts`` prompts x ``--k`` samples of ``--new`` tokens at T = 1 (top-k 0, top-p 1),
a reward computed by one program from the completion's text on both sides (its word count / ``--new``: the same
cheap work, so the trainers' machinery is what is timed), group-standardised advantages, a KL term against the
reference = the LoRA adapter disabled (beta 0.04), one epoch of 2 minibatches, LoRA r=8 on every block linear,
AdamW lr 1e-5, fp32 on the CPU.

- ours: ``PPOModule(advantage=GRPO(k), critic=None, reward_model=FunctionReward)`` in Lightning's
  ``Trainer.fit``; the KL is in the reward (grpo_lora's default), a fixed coefficient.
- TRL: ``GRPOTrainer`` with ``num_generations=k``, ``per_device_train_batch_size = prompts x k / 2`` and
  ``steps_per_generation = 2`` (one generation round = 2 optimiser steps, as our 2 minibatches), ``beta=0.04``
  (its reference forward: the adapter disabled), ``loss_type="grpo"``, ``num_iterations=1``; its dropout and
  gradient checkpointing off, no vLLM.
- An iteration = one generation round and its update. Ours is timed from ``on_train_batch_start`` to
  ``on_train_batch_end``; TRL's between every 2nd ``on_step_end`` (so it holds its dataloader fetch too). Each
  loop runs in its own thread, a baton handed over after every iteration (exactly one side runs at a time).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
from compare_trl import report_header, summary, timed
from rm_vs_trl import Baton, step_timers
from shapes import SHAPES, build_model, make_prompts

BETA = 0.04


def words_reward(text: str, new: int) -> float:
    return len(text.split()) / new


def ours(model_dir: Path, prompts, args):
    from transformers import AutoTokenizer

    from lrlhf.data.datamodules import PromptDataModule
    from lrlhf.data.records import PromptExample
    from lrlhf.functional import FixedKLController
    from lrlhf.models import LoraSpec, ModelConfig, load_causal_lm
    from lrlhf.modules import PPOConfig, PPOModule
    from lrlhf.modules.advantages import GRPO
    from lrlhf.rewards.protocol import FunctionReward

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = args.prompts * args.k
    config = PPOConfig(max_new_tokens=args.new, temperature=1.0, ppo_epochs=1, minibatch_size=rows // 2,
                       forward_batch_size=rows, lr=1e-5, policy_lora=LoraSpec(r=8))
    module = PPOModule(load_causal_lm(ModelConfig(str(model_dir))),
                       FunctionReward(fn=lambda prompt, response: words_reward(response, args.new)), tokenizer,
                       config, advantage=GRPO(samples_per_prompt=args.k), critic=None,
                       kl_controller=FixedKLController(BETA))
    data = PromptDataModule(tokenizer, train=[PromptExample(p) for p in prompts], batch_size=args.prompts,
                            max_length=128)
    return module, data


def theirs(model_dir: Path, prompts, args, callbacks):
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from lrlhf.models.lora import lora_target_modules

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]

    def reward(completions, **kwargs):
        return [words_reward(c, args.new) for c in completions]

    rows = args.prompts * args.k
    config = GRPOConfig(
        output_dir=str(model_dir.parent / "trl-out"), per_device_train_batch_size=rows // 2,
        gradient_accumulation_steps=1, steps_per_generation=2, num_generations=args.k, num_iterations=1,
        max_completion_length=args.new, temperature=1.0, top_k=0, top_p=1.0, beta=BETA, loss_type="grpo",
        learning_rate=1e-5, max_steps=2 * (args.warmup + args.iters), use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=False, disable_dropout=True, report_to="none", save_strategy="no",
        logging_steps=1000, dataloader_num_workers=0, disable_tqdm=True, seed=args.seed, shuffle_dataset=False,
    )
    peft_config = LoraConfig(r=8, lora_alpha=16.0, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                             target_modules=lora_target_modules(policy))
    return GRPOTrainer(model=policy, reward_funcs=reward, args=config, train_dataset=Dataset.from_dict(
        {"prompt": texts}), processing_class=tokenizer, peft_config=peft_config, callbacks=callbacks)


def run(args) -> dict:
    from lightning.pytorch import Trainer
    from transformers import TrainerCallback

    total = args.warmup + args.iters
    baton = Baton(["ours", "trl"], timeout=1800.0)
    times: dict[str, list[float]] = {"ours": [], "trl": []}
    phases: dict[str, list[float]] = {"generate": [], "score": [], "update": []}

    our_timer = step_timers(baton, times, total)[0]  # rm_vs_trl's: ours timed per batch, the baton handed over

    class TrlTimer(TrainerCallback):
        steps = 0

        def on_train_begin(self, args_, state, control, **kwargs):
            baton.wait("trl")
            self.start = time.perf_counter()

        def on_step_end(self, args_, state, control, **kwargs):
            self.steps += 1
            if self.steps % 2:  # one generation round = 2 optimiser steps
                return
            times["trl"].append(time.perf_counter() - self.start)
            baton.hand_over("ours")
            if len(times["trl"]) < total:
                baton.wait("trl")
            self.start = time.perf_counter()

    shape = SHAPES[args.shape]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        build_model(model_dir, shape, args.seed)
        prompts = make_prompts(max(64, total * args.prompts), shape["vocab_size"], args.seed)
        module, data = ours(model_dir, prompts, args)
        module = timed(module, phases)  # generate, score (the rest of the rollout), update
        trl = theirs(model_dir, prompts, args, [TrlTimer()])
        steps = total * module.updates_per_rollout(args.prompts)
        trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False, max_epochs=-1,
                          num_sanity_val_steps=0, limit_val_batches=0, max_steps=steps, callbacks=[our_timer])
        baton.side_by_side(lambda: trainer.fit(module, datamodule=data), trl.train)
        length = float(trainer.callback_metrics["rollout/length_mean"])

    report_header(args)
    print(f"shape {args.shape} {shape}; {args.prompts} prompts x k={args.k} samples x {args.new} new tokens per "
          f"iteration, 1 epoch of 2 minibatches, LoRA r=8, beta {BETA}, fp32, CPU")
    print(f"our last rollout: mean response length {length:.1f}")
    print(f"iterations: {args.warmup} warm-up + {args.iters} timed per side, alternating\n")
    ours_s, trl_s = summary(times["ours"][args.warmup:]), summary(times["trl"][args.warmup:])
    print("| side | median s/iteration | q1-q3 |")
    print("|---|---|---|")
    print(f"| lrlhf PPOModule + GRPO (Lightning), LoRA | {ours_s[0]:.3f} | {ours_s[1]:.3f}-{ours_s[2]:.3f} |")
    print(f"| TRL 1.16 GRPOTrainer, LoRA | {trl_s[0]:.3f} | {trl_s[1]:.3f}-{trl_s[2]:.3f} |")
    print("our phases (median s):", ", ".join(
        f"{k} {statistics.median(v[args.warmup:]):.3f}" for k, v in phases.items() if v[args.warmup:]))
    print(f"\nratio ours / TRL (medians): {ours_s[0] / trl_s[0]:.3f}  (target <= 0.5)")
    print("all iterations (s): ours", [round(x, 3) for x in times["ours"]], "TRL", [round(x, 3) for x in times["trl"]])
    return {"ours_s": ours_s, "trl_s": trl_s, "ratio": ours_s[0] / trl_s[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per iteration")
    parser.add_argument("--k", type=int, default=4, help="samples per prompt (the group)")
    parser.add_argument("--new", type=int, default=64, help="new tokens per sample")
    parser.add_argument("--shape", default="reference", choices=sorted(SHAPES))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.prompts * args.k % 2:
        parser.error("--prompts x --k must be even (two minibatches)")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    run(args)


if __name__ == "__main__":
    main()
