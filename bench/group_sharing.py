"""Prefix sharing in the group estimators' rollouts (issue #18): an RLOO rollout's scoring and update forwards with
each prompt encoded once for its k samples (``module.config.prefix_sharing=true``) against the unshared rows
(``false``), alternating in one process.

    PYTHONPATH=src python bench/group_sharing.py [--k 4] [--prompts 8] [--prompt-tokens 64,128] [--new 32]
        [--iters 5] [--warmup 1] [--threads 1]

Model: the reference Llama of bench/compare_trl.py (hidden 256, 4 layers, vocab 8000, random init, fp32, sdpa), as
policy (LoRA r=8) and as a separate frozen reward model. Prompts: chat-templated, ``--prompt-tokens`` long
(uniform, left-padded to the longest: RL prompts cut at 128 tokens, as ``hparams=smollm2`` cuts HH's). Both sides
score the same sampled responses (``--new`` random ids each, drawn once: the sampler is not what sharing changes):

- score: the rollout's no-grad forwards (``make_rollout``: the old policy log-probs, which a subclass returning
  ``Sampled(ids)`` has a forward compute, the reference's, the reward model's; the last is unshared on both sides);
- update: 2 epochs of minibatches of 16 rows, each the policy forward, the clipped loss and its backward (no
  optimiser step, so both sides see the same weights every iteration).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from shapes import REFERENCE, build_model, make_prompts  # bench/ is the script's folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=4, help="samples per prompt")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per rollout")
    parser.add_argument("--prompt-tokens", default="64,128", help="min,max prompt tokens")
    parser.add_argument("--new", type=int, default=32, help="response tokens")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoTokenizer

    from lrlhf.data.datamodules import PromptDataModule
    from lrlhf.data.records import PromptExample
    from lrlhf.functional import FixedKLController
    from lrlhf.models import LoraSpec, ModelConfig, ScalarModel, load_causal_lm
    from lrlhf.modules import PPOConfig, PPOModule
    from lrlhf.modules.advantages import RLOO
    from lrlhf.modules.group_sharing import group_prompt_share
    from lrlhf.modules.rollout import Sampled

    class FixedSamples(PPOModule):
        responses: torch.Tensor

        def sample(self, query_ids, query_mask, max_new_tokens=None):
            return Sampled(self.responses)

    low, high = (int(x) for x in args.prompt_tokens.split(","))
    rows = args.prompts * args.k
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        build_model(model_dir, REFERENCE, args.seed)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        data = PromptDataModule(tokenizer, train=[PromptExample(p) for p in make_prompts(
            args.prompts, REFERENCE["vocab_size"], args.seed, (low, high))], batch_size=args.prompts, max_length=256)
        data.setup("fit")
        batch = next(iter(data.train_dataloader()))
        g = torch.Generator().manual_seed(args.seed + 2)
        responses = torch.randint(4, REFERENCE["vocab_size"], (rows, args.new), generator=g)
        cfg = ModelConfig(str(model_dir))
        modules = {}
        for sharing in (False, True):
            config = PPOConfig(max_new_tokens=args.new, ppo_epochs=2, minibatch_size=16, forward_batch_size=rows,
                               policy_lora=LoraSpec(r=8), prefix_sharing=sharing)
            torch.manual_seed(args.seed + 1)
            module = FixedSamples(load_causal_lm(cfg), ScalarModel(load_causal_lm(cfg)), tokenizer, config,
                                  advantage=RLOO(samples_per_prompt=args.k), kl_controller=FixedKLController(0.05))
            module.configure_model()
            module.model.eval()
            module.responses = responses
            modules[sharing] = module

        times = {(s, phase): [] for s in modules for phase in ("score", "update")}
        for i in range(args.warmup + args.iters):
            for sharing in ((False, True) if i % 2 == 0 else (True, False)):  # alternate who goes first
                module = modules[sharing]
                t = time.perf_counter()
                rollout = module.make_rollout(batch)
                times[sharing, "score"].append(time.perf_counter() - t)
                t = time.perf_counter()
                groups = module.sharing.groups(module.model, rollout.query_ids.shape[1], rollout.response_ids.shape[1])
                for _ in range(module.config.ppo_epochs):
                    order = module.sharing.minibatch_order(len(rollout), groups, "cpu")
                    for start in range(0, len(rollout), module.config.minibatch_size):
                        mb = rollout.select(order[start:start + module.config.minibatch_size])
                        logprobs, _ = module.policy_forward(mb.query_ids, mb.query_mask, mb.response_ids)
                        loss, _ = module.policy_loss(logprobs, mb.logprobs, mb.advantages, mb.action_mask)
                        module.model.zero_grad(set_to_none=True)
                        loss.backward()
                times[sharing, "update"].append(time.perf_counter() - t)
        prompt_len = batch["input_ids"].shape[1]

    share = group_prompt_share(prompt_len, args.new, args.k)
    print(f"reference Llama (hidden 256, 4 layers, vocab 8000), fp32, sdpa, threads {torch.get_num_threads()}; "
          f"RLOO k = {args.k}, {args.prompts} prompts ({low}-{high} tokens, padded to {prompt_len}) x {args.new} "
          f"response tokens = {rows} rows; 2 epochs x minibatches of 16; prompt share of the columns {share:.3f}")
    print(f"{args.warmup} warm-up + {args.iters} timed iterations per side, alternating\n")
    print("| phase | unshared median s (q1-q3) | shared median s (q1-q3) | shared / unshared |")
    print("|---|---|---|---|")
    total = {s: [sum(x) for x in zip(times[s, "score"], times[s, "update"], strict=True)] for s in modules}
    for phase in ("score", "update", "total"):
        rows_ = {s: (total[s] if phase == "total" else times[s, phase])[args.warmup:] for s in modules}
        med = {s: statistics.median(v) for s, v in rows_.items()}
        q = {s: statistics.quantiles(v, n=4) if len(v) > 1 else [v[0], v[0], v[0]] for s, v in rows_.items()}
        print(f"| {phase} | {med[False]:.3f} ({q[False][0]:.3f}-{q[False][2]:.3f}) | {med[True]:.3f} "
              f"({q[True][0]:.3f}-{q[True][2]:.3f}) | {med[True] / med[False]:.3f} |")


if __name__ == "__main__":
    main()
