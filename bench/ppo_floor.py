"""The floor of one PPO iteration: the passes our design cannot avoid, each timed alone with plain calls.

    PYTHONPATH=src python bench/ppo_floor.py [--iters 6] [--warmup 1] [--threads 1] [--value-from-policy]

Same model, prompts and config as ``bench/compare_trl.py`` (issue #10's reference config: random Llama hidden
256, 4 layers, vocab 8000; 16 chat-templated prompts of 10-40 tokens, 64 new tokens at T = 1, 1 epoch of
2 minibatches of 8; LoRA r=8 ``policy`` and ``value`` adapters on one frozen base, reference = adapters off,
a separate reward model of the same size).

The passes, and why each is needed (one base serving policy, reference and value; a separate reward model):

1. **sample**: ``model.generate`` with the policy adapter (64 cached decode steps on 16 rows). The responses
   have to be drawn; the sampled tokens' log-probs come with them, so no separate policy forward is needed
   for the old logprobs (``generate``'s own scores give them).
2. **reference**: one no-grad forward of prompt + response with the adapters disabled, LM head on the
   response columns only: the KL penalty needs the reference's log-probs of the sampled tokens, and the
   reference differs from the policy in every layer (LoRA on every block linear), so nothing is shared.
3. **value**: one no-grad forward of the trunk with the value adapter, value head at every response column,
   no LM head: GAE needs the old values before any update.
4. **reward**: one no-grad forward of the reward model's trunk, its head at the last token, no LM head.
5. **update**, per minibatch (2): the policy forward (LM head on the response columns) and the value forward
   with grad, one backward through both, AdamW on the adapters and the value head. The policy and value
   adapters differ, so the two trunk passes cannot be merged.

With ``--value-from-policy`` (``ppo.value_from_policy``: the value head on the policy's own trunk) passes
3 disappears (the old values are read by the head on the sampling passes' hidden states: a ``(B, H)`` product
per step, counted in 1) and 5 has the policy pass only (its hidden states feed the value head).

Everything else our iteration does (masks, rewards, GAE, whitening, statistics, logging, Lightning's loop) is
overhead over this floor. The floor passes and one iteration of ``PPOModule`` (driven by Lightning's
``Trainer.fit``, as in ``bench/compare_trl.py``) alternate: before each of our iterations the floor passes run
once; medians over ``--iters`` after ``--warmup``. Target (issue #10): ours within 15 % of the floor.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_trl as bench
import shapes


def floor_passes(model, reward_model, value_head, optimizer, prompts_batch, args) -> dict[str, float]:
    """Run the floor passes once on ``prompts_batch``; seconds per pass."""
    from lrlhf.models.heads import capture_trunk_output, decoder, last_token_index

    q, qm = prompts_batch["input_ids"], prompts_batch["attention_mask"]
    times = {}
    model.set_adapter("policy")
    t = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=q, attention_mask=qm, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=args.new, pad_token_id=shapes.PAD, eos_token_id=[shapes.EOS],
                             output_scores=True, return_dict_in_generate=True)
        response = out.sequences[:, q.shape[1]:]
        old_logprobs = torch.stack(out.scores, 1).log_softmax(-1).gather(-1, response[..., None]).squeeze(-1)
    times["sample"] = time.perf_counter() - t
    r = response.shape[1]
    ids = torch.cat([q, response], 1)
    mask = torch.cat([qm, torch.ones_like(response)], 1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cols = slice(q.shape[1] - 1, q.shape[1] + r - 1)

    t = time.perf_counter()
    with torch.no_grad(), model.disable_adapter():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=r + 1).logits[:, :r]
        ref_logprobs = logits.log_softmax(-1).gather(-1, response[..., None]).squeeze(-1)
    times["reference"] = time.perf_counter() - t

    if args.value_from_policy:
        old_values = torch.zeros_like(ref_logprobs)  # read while sampling (counted in "sample")
    else:
        t = time.perf_counter()
        model.set_adapter("value")
        with torch.no_grad():
            hidden = decoder(model)(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
            old_values = value_head(hidden[:, cols])
        times["value"] = time.perf_counter() - t

    t = time.perf_counter()
    with torch.no_grad():
        hidden = decoder(reward_model.backbone)(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
        scores = reward_model.head(hidden[torch.arange(len(ids)), last_token_index(mask)])
    times["reward"] = time.perf_counter() - t

    advantages = (scores[:, None] - old_values + 0.0 * ref_logprobs).detach()
    t = time.perf_counter()
    params = [p for n, p in model.named_parameters() if "lora_" in n]
    for rows in torch.randperm(len(ids)).split(len(ids) // 2):
        model.set_adapter("policy")
        for p in params:
            p.requires_grad_(True)
        with capture_trunk_output(model) as trunk:  # a forward hook on the trunk: its last hidden states
            logits = model(input_ids=ids[rows], attention_mask=mask[rows], position_ids=pos[rows],
                           logits_to_keep=r + 1).logits[:, :r]
        logprobs = logits.log_softmax(-1).gather(-1, response[rows, :, None]).squeeze(-1)
        if args.value_from_policy:  # the same pass's last hidden states
            values = value_head(trunk["hidden"][:, cols])
        else:
            model.set_adapter("value")
            for p in params:
                p.requires_grad_(True)
            hidden = decoder(model)(input_ids=ids[rows], attention_mask=mask[rows],
                                    position_ids=pos[rows]).last_hidden_state
            values = value_head(hidden[:, cols])
        ratio = (logprobs - old_logprobs[rows]).exp()
        loss = -(ratio * advantages[rows]).mean() + 0.1 * (values - scores[rows, None]).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    times["update"] = time.perf_counter() - t
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--value-from-policy", action="store_true", help="the critic on the policy's trunk")
    args = parser.parse_args()
    args.batch, args.new = 16, 64
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")

    from lightning.pytorch import Callback, Trainer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lrlhf.data.collate import collate_prompts
    from lrlhf.data.records import PromptExample
    from lrlhf.data.tokenize import encode_prompt
    from lrlhf.models import LoraSpec, ScalarHead, ScalarModel, add_adapters

    floor: dict[str, list[float]] = {}
    ours: list[float] = []
    phases: dict[str, list[float]] = {"generate": [], "score": [], "update": []}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        shapes.build_model(model_dir, shapes.REFERENCE, args.seed)
        prompts = shapes.make_prompts(256, shapes.REFERENCE["vocab_size"], args.seed)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)

        # the floor's own models: one base with two adapters, a value head, a separate reward model
        roles = {"policy": LoraSpec(r=8)}
        if not args.value_from_policy:
            roles["value"] = LoraSpec(r=8)
        model = add_adapters(AutoModelForCausalLM.from_pretrained(model_dir).eval(), roles)
        value_head = ScalarHead(shapes.REFERENCE["hidden_size"], zero_init=True)
        reward_model = ScalarModel(AutoModelForCausalLM.from_pretrained(model_dir)).eval().requires_grad_(False)
        params = [p for n, p in model.named_parameters() if "lora_" in n] + list(value_head.parameters())
        optimizer = torch.optim.AdamW(params, lr=1e-5)
        encoded = [encode_prompt(tokenizer, PromptExample(p), max_length=128) for p in prompts]
        g = torch.Generator().manual_seed(args.seed)

        module, data = bench.ours_parts(model_dir, prompts, args)
        module = bench.timed(module, phases)

        class Alternate(Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                rows = torch.randperm(len(encoded), generator=g)[:args.batch].tolist()
                batch_ = collate_prompts([encoded[i] for i in rows], shapes.PAD)
                for name, secs in floor_passes(model, reward_model, value_head, optimizer, batch_, args).items():
                    floor.setdefault(name, []).append(secs)
                self.start = time.perf_counter()

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                ours.append(time.perf_counter() - self.start)

        total = args.warmup + args.iters
        trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False, max_epochs=-1, num_sanity_val_steps=0, limit_val_batches=0,
                          max_steps=total * module.updates_per_rollout(args.batch), callbacks=[Alternate()])
        trainer.fit(module, datamodule=data)

    bench.report_header(args)
    print(f"critic: {'value head on the policy trunk' if args.value_from_policy else 'value adapter'}")
    print(f"iterations: {args.warmup} warm-up + {args.iters} timed, floor passes and ours alternating\n")
    print("| floor pass | median s |")
    print("|---|---|")
    medians = {name: statistics.median(xs[args.warmup:]) for name, xs in floor.items()}
    for name, m in medians.items():
        print(f"| {name} | {m:.3f} |")
    sums = [sum(floor[name][i] for name in floor) for i in range(args.warmup, total)]
    floor_s, ours_s = statistics.median(sums), statistics.median(ours[args.warmup:])
    print(f"| **sum (median of per-iteration sums)** | **{floor_s:.3f}** |\n")
    print("our phases (median s):", ", ".join(f"{k} {statistics.median(v[args.warmup:]):.3f}"
                                              for k, v in phases.items()))
    print(f"our iteration (median s): {ours_s:.3f}")
    print(f"ours / floor: {ours_s / floor_s:.3f}  (target <= 1.15)")
    print("per iteration (s): floor", [round(x, 3) for x in sums], "ours", [round(x, 3) for x in ours[args.warmup:]])


if __name__ == "__main__":
    main()
