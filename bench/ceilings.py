"""The toy world's ceilings (issue #31, item 1): what selection reaches, and what the model class can hold.

    python bench/ceilings.py --out /tmp/ceilings [--seed 0] [--rounds 3] [--lora]

1. **Selection**: best-of-N *under gold* from the SFT policy, N = 1..64, on the 200 held-out evaluation prompts: the
   expected gold of the pick from one pool of 64 samples per prompt (:func:`lrlhf.eval.best_of_n.bon_expected`, no
   resampling noise) against its analytic KL ``log N - (N - 1) / N``; 95 % bootstrap over prompts.
2. **Representability** (expert iteration): each round samples 16 responses per training prompt (the SFT and RL
   prompts, 2,500) from the current policy, keeps the best under gold, and fine-tunes the current policy on the picks
   (`train.py recipe=sft`, or `recipe=sft_lora` with ``--lora``: LoRA r=16 merged at export); after each round the
   held-out gold (4 samples per evaluation prompt) and the KL to the SFT model (per sequence, k1 on the policy's own
   samples). If this cannot reach far above PPO's gold, the toy model has no headroom for PPO to find.

The SFT stage is the README command's (`train.py recipe=sft`, from the cache). 1 torch thread.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from lrlhf.data.formats import load_records  # noqa: E402
from lrlhf.data.toy import gold_utility  # noqa: E402
from lrlhf.eval.best_of_n import bon_expected, bon_kl  # noqa: E402
from lrlhf.eval.heldout import ModelPolicy, sample_held_out  # noqa: E402
from lrlhf.functional.stats import bootstrap_interval  # noqa: E402
from lrlhf.models import ModelConfig, load_causal_lm, load_tokenizer  # noqa: E402
from lrlhf.models.generation import SamplingConfig  # noqa: E402
from lrlhf.utils.io import atomic_write_text  # noqa: E402


def probe(seed: int) -> tuple[Path, Path]:
    """``(world folder, SFT stage folder)`` of the README command at ``seed``: a one-step PPO run under the gold reward
    (no reward model) builds or finds them in the cache, and its config names them."""
    run = Path(f"/tmp/lrlhf_ceilings_probe_s{seed}")
    subprocess.run([sys.executable, str(ROOT / "train.py"), "recipe=ppo_lora", "reward=gold", f"seed={seed}",
                    "logger=none", "trainer.max_steps=1", "callbacks=none", f"hydra.run.dir={run}"], check=True,
                   cwd=ROOT, capture_output=True)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    return Path(cfg["world"]["dir"]), Path(cfg["deps"]["sft"])


def held_out(model_dir: Path, ref, tokenizer, prompts, seed: int, n: int = 4) -> dict:
    model = load_causal_lm(ModelConfig(str(model_dir))).eval()
    policy = ModelPolicy(model, tokenizer, None, SamplingConfig(32, 1.0, seed), reference=ref)
    s = sample_held_out(policy, prompts, n, seed, batch_size=200)
    gold = [gold_utility(r.meta["task"], t) for r, t in zip(s.records, s.texts, strict=True)]
    per_prompt = [sum(gold[i:i + n]) / n for i in range(0, len(gold), n)]
    lo, hi = bootstrap_interval(per_prompt, seed=seed)
    return {"gold": sum(gold) / len(gold), "gold_interval": [lo, hi], "kl": s.kl.mean().item(),
            "length": s.lengths.float().mean().item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--k", type=int, default=16, help="samples per training prompt in expert iteration")
    parser.add_argument("--pool", type=int, default=64, help="samples per evaluation prompt for the BoN curve")
    parser.add_argument("--lora", action="store_true", help="expert iteration with LoRA (sft_lora) instead of full")
    parser.add_argument("--steps", type=int, default=300, help="SFT steps per expert-iteration round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    world, sft = probe(args.seed)
    sft = sft / "merged"
    tokenizer = load_tokenizer(ModelConfig(str(sft)))
    ref = load_causal_lm(ModelConfig(str(sft))).eval()
    eval_prompts = load_records(world / "eval_prompts.jsonl", "prompt", verbose=False)[0]
    results: dict = {"seed": args.seed, "sft": str(sft), "world": str(world)}

    # 1. best-of-N under gold, from one pool per prompt
    policy = ModelPolicy(ref, tokenizer, None, SamplingConfig(32, 1.0, args.seed))
    pool = sample_held_out(policy, eval_prompts, args.pool, args.seed, batch_size=256)
    gold = [gold_utility(r.meta["task"], t) for r, t in zip(pool.records, pool.texts, strict=True)]
    groups = [gold[i:i + args.pool] for i in range(0, len(gold), args.pool)]
    curve = []
    n = 1
    while n <= args.pool:
        per_prompt = [bon_expected(g, g, n) for g in groups]
        lo, hi = bootstrap_interval(per_prompt, seed=args.seed)
        curve.append({"n": n, "kl": bon_kl(n), "gold": sum(per_prompt) / len(per_prompt), "interval": [lo, hi]})
        print(f"BoN-{n} under gold: {curve[-1]['gold']:.3f} [{lo:.3f}, {hi:.3f}] at KL {bon_kl(n):.2f}", flush=True)
        n *= 2
    results["bon_gold"] = curve

    # 2. expert iteration: SFT on gold-selected best-of-k picks, from the current policy
    train_prompts = (load_records(world / "sft_train.jsonl", "prompt", verbose=False)[0]
                     + load_records(world / "rl_prompts.jsonl", "prompt", verbose=False)[0])
    current, rounds = sft, []
    for r in range(1, args.rounds + 1):
        model = load_causal_lm(ModelConfig(str(current))).eval()
        s = sample_held_out(ModelPolicy(model, tokenizer, None, SamplingConfig(32, 1.0, args.seed + r)),
                            train_prompts, args.k, args.seed + 100 * r, batch_size=256)
        picks = []
        for p in range(len(train_prompts)):
            group = range(p * args.k, (p + 1) * args.k)
            best = max(group, key=lambda i: (gold_utility(s.records[i].meta["task"], s.texts[i]), -i))
            record = s.records[best]
            picks.append({"messages": [*record.prompt, {"role": "assistant", "content": s.texts[best]}],
                          "task": record.meta["task"]})
        pick_gold = sum(gold_utility(p["task"], p["messages"][-1]["content"]) for p in picks) / len(picks)
        data = args.out / f"round_{r}.jsonl"
        atomic_write_text(data, "".join(json.dumps(p, sort_keys=True) + "\n" for p in picks))
        run = args.out / f"round_{r}{'_lora' if args.lora else ''}"
        recipe = "sft_lora" if args.lora else "sft"
        subprocess.run([sys.executable, str(ROOT / "train.py"), f"recipe={recipe}", f"seed={args.seed}", "logger=none",
                        "callbacks=none", f"model.name_or_path={current}", f"data.train={data}",
                        f"trainer.max_steps={args.steps}", f"trainer.val_check_interval={args.steps}",
                        f"hydra.run.dir={run}"], check=True, cwd=ROOT, capture_output=True)
        current = run / "merged"
        figures = held_out(current, ref, tokenizer, eval_prompts, args.seed)
        rounds.append({"round": r, "picks_gold": pick_gold, **figures})
        print(f"expert iteration round {r} ({'LoRA' if args.lora else 'full'}): picks' gold {pick_gold:.3f}; "
              f"held-out gold {figures['gold']:.3f} [{figures['gold_interval'][0]:.3f}, "
              f"{figures['gold_interval'][1]:.3f}] at KL {figures['kl']:.2f}, length {figures['length']:.1f}",
              flush=True)
    results["expert_iteration"] = rounds
    name = f"ceilings_s{args.seed}{'_lora' if args.lora else ''}.json"
    (args.out / name).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
