"""TRL's PPOTrainer (trl 1.12.0, ``trl.experimental.ppo``) on the toy world, as a peer point on the gold-vs-KL plane
(issue #31): the same SFT policy, the same frozen reward model (calibrated as ours), the same prompts and episodes.

    /work/venv-trl/bin/python bench/trl_ppo_toy.py --run OUR_PPO_RUN --out OUT [--kl-coef 0.05] [--lr 3e-3] \
        [--reward gold]

``OUR_PPO_RUN`` is a finished ``python train.py recipe=ppo_lora`` run folder (the README command): its resolved config
names the SFT model, the reward model and its calibration, the world's RL prompts and the seed, and its settings give
the budget. TRL then runs its own loop on them and the merged policy is written to ``OUT/export/merged``, the layout
``bench/paired_gold.py`` and ``recipe=eval`` (``+eval.policies.trl_ppo=OUT/export/merged``) read.

Matched with ours: prompts per rollout (``per_device_train_batch_size`` = 128, no gradient accumulation: TRL steps
its optimiser once per ``gradient_accumulation_steps`` micro batches), minibatches (``num_mini_batches``: 2 of 64),
PPO epochs (2), episodes (rollouts x 128 = 10,240), response length (32), temperature 1, the LoRA policy (r 8,
alpha 16, every projection of every layer; reference = adapter disabled), the learning rate and its linear decay to
0, the reward (the RM's score at the EOS, ``(r - mean) / std`` with the RM stage's calibration), the prompt ids (our
``encode_prompt``: chat template, generation prompt, left truncation to 64 tokens). TRL's own: a fixed KL
coefficient (``--kl-coef``, its default 0.05; ours is adaptive from 0.2), the k1 estimator in the reward, a separate
full value model initialised from the reward model (ours: a LoRA value adapter on the policy), value loss weight
0.1, whitened advantages, no early stopping (ours keeps the best of 8 held-out evaluations). 1 torch thread.

``--reward gold``: the exact reward instead of the RM (our ``reward=gold``, the toy verifier read from the decoded
prompt and response), calibrated as ours is (mean and std of one SFT sample for each of the first 256 RL prompts):
the two optimisers compared alone. TRL's reward call is replaced for that one model; everything else is TRL's.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from omegaconf import OmegaConf
from torch import nn

from lrlhf.data.formats import load_records
from lrlhf.data.tokenize import encode_prompt
from lrlhf.models import ModelConfig, load_causal_lm, load_tokenizer
from lrlhf.models.heads import ScalarModel, decoder
from lrlhf.models.reward import load_calibration, load_reward_model


class _Body(nn.Module):
    """What TRL calls ``getattr(model, model.base_model_prefix)``: the scalar model's transformer body, returning
    its last hidden states as ``hidden_states[-1]``."""

    def __init__(self, scalar: ScalarModel):
        super().__init__()
        self.backbone = scalar.backbone

    def forward(self, input_ids, attention_mask, position_ids=None, **_):
        hidden = ScalarModel.hidden_states(self, input_ids, attention_mask, position_ids=position_ids)
        return SimpleNamespace(hidden_states=(hidden,))


class _Score(nn.Module):
    """The scalar head, then the frozen calibration ``(r - mean) / std`` (identity for the value model)."""

    def __init__(self, head: nn.Module, mean: float = 0.0, std: float = 1.0):
        super().__init__()
        self.head, self.mean, self.std = head, mean, std

    def forward(self, hidden):
        return (self.head(hidden) - self.mean) / self.std


class TRLScalar(nn.Module):
    """Our :class:`ScalarModel` in the shape TRL's ``get_reward`` reads (``base_model_prefix`` and ``score``)."""

    base_model_prefix = "body"

    def __init__(self, scalar: ScalarModel, mean: float = 0.0, std: float = 1.0):
        super().__init__()
        self.body = _Body(scalar)
        self.score = _Score(scalar.head, mean, std)


def gold_reward(policy, tokenizer, prompts, seed: int) -> nn.Module:
    """A stand-in reward model whose score TRL's ``get_reward`` is made to take from the toy verifier on the decoded
    texts, ``(gold - mean) / std`` with the mean and std of one SFT sample for each of the first 256 prompts."""
    import trl.experimental.ppo.ppo_trainer as trainer_module

    from lrlhf.data.toy import verifiable_reward
    from lrlhf.eval.utility import sample_gold_utility

    golds = sample_gold_utility(policy.eval(), tokenizer, prompts[:256], n_samples=1, temperature=1.0,
                                max_new_tokens=32, seed=seed).per_prompt
    mean = sum(golds) / len(golds)
    std = (sum((g - mean) ** 2 for g in golds) / (len(golds) - 1)) ** 0.5
    print(f"gold reward: calibration on {len(golds)} SFT samples: mean {mean:.4f}, std {std:.4f}", flush=True)
    marker = nn.Module()
    trl_get_reward = trainer_module.get_reward
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id

    def get_reward(model, query_responses, pad_token_id, context_length):
        if model is not marker:
            return trl_get_reward(model, query_responses, pad_token_id, context_length)
        texts = []
        for row in query_responses.tolist():
            query, response = row[:context_length], row[context_length:]
            response = response[:response.index(eos)] if eos in response else response
            texts.append((tokenizer.decode([t for t in query if t != pad], skip_special_tokens=True),
                          tokenizer.decode([t for t in response if t != pad], skip_special_tokens=True).strip()))
        gold = torch.tensor([verifiable_reward(p, r) for p, r in texts], dtype=torch.float32)
        return None, ((gold - mean) / std).to(query_responses.device), None

    trainer_module.get_reward = get_reward
    return marker


def resolved(run: Path) -> dict:
    """The run's settings as it ran them (``config.yaml``, written resolved at the stage's start)."""
    if not (run / "config.yaml").is_file():
        raise SystemExit(f"{run}: no config.yaml; is it a recipe=ppo_lora run folder?")
    return OmegaConf.to_container(OmegaConf.load(run / "config.yaml"), resolve=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, required=True, help="our recipe=ppo_lora run folder (same world)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--kl-coef", type=float, default=0.05, help="TRL's fixed KL coefficient (its default)")
    parser.add_argument("--lr", type=float, default=None, help="default: our run's (3e-3, linear decay to 0)")
    parser.add_argument("--rollouts", type=int, default=None, help="default: our run's (max_steps / 4 = 80)")
    parser.add_argument("--reward", choices=("rm", "gold"), default="rm", help="gold: the toy verifier (reward=gold)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from datasets import Dataset
    from peft import LoraConfig
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    from lrlhf.models.lora import lora_target_modules

    cfg = resolved(args.run)
    module, ppo = cfg["module"], cfg["module"]["config"]
    seed, batch, minibatch = cfg["seed"], cfg["data"]["batch_size"], ppo["minibatch_size"]
    steps_per_rollout = ppo["ppo_epochs"] * batch // minibatch
    rollouts = args.rollouts or cfg["trainer"]["max_steps"] // steps_per_rollout
    lr = args.lr if args.lr is not None else ppo["lr"]
    policy_dir = module["policy"]["name_or_path"]
    tokenizer = load_tokenizer(ModelConfig(policy_dir))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
        raise SystemExit("TRL's PPO truncates at the EOS and pads after it: it needs a pad token other than the EOS")
    policy = load_causal_lm(ModelConfig(policy_dir))
    calibration = load_calibration(module["calibration"])
    reward = TRLScalar(load_reward_model(module["reward_model"]), calibration.mean, calibration.std)
    critic = load_reward_model(module["reward_model"]).train()
    decoder(critic.backbone).requires_grad_(True)  # the body and the head train; the LM head is never run
    critic.head.requires_grad_(True)
    value = TRLScalar(critic)
    prompts = load_records(cfg["data"]["train"], "prompt", verbose=False)[0]
    if args.reward == "gold":
        reward = gold_reward(policy, tokenizer, prompts, seed)
    ids = [e.encoded.input_ids for p in prompts
           if (e := encode_prompt(tokenizer, p, max_length=cfg["data"]["max_length"], truncation="left",
                                  special_text="keep")) is not None]
    spec = ppo["policy_lora"]
    peft_config = LoraConfig(r=spec.get("r", 8), lora_alpha=spec.get("alpha", 16.0),
                             lora_dropout=spec.get("dropout", 0.0), bias="none", task_type="CAUSAL_LM",
                             target_modules=lora_target_modules(policy))
    config = PPOConfig(
        output_dir=str(args.out / "trl"), per_device_train_batch_size=batch, gradient_accumulation_steps=1,
        num_mini_batches=batch // minibatch, num_ppo_epochs=ppo["ppo_epochs"], total_episodes=rollouts * batch,
        local_rollout_forward_batch_size=batch, response_length=ppo["max_new_tokens"], temperature=ppo["temperature"],
        stop_token="eos", learning_rate=lr, lr_scheduler_type="linear", warmup_steps=0, kl_coef=args.kl_coef,
        num_sample_generations=0, bf16=False, fp16=False, gradient_checkpointing=False, use_cpu=True,
        report_to="none", save_strategy="no", logging_steps=steps_per_rollout * 10, dataloader_num_workers=0,
        disable_tqdm=True, seed=seed,
    )
    trainer = PPOTrainer(args=config, processing_class=tokenizer, model=policy, ref_model=None, reward_model=reward,
                         train_dataset=Dataset.from_dict({"input_ids": ids}), value_model=value,
                         peft_config=peft_config)
    start = time.time()
    trainer.train()
    wall = time.time() - start
    merged = trainer.accelerator.unwrap_model(trainer.model).policy.merge_and_unload()
    out = args.out / "export" / "merged"
    merged.save_pretrained(out)
    tokenizer.padding_side = "right"
    tokenizer.save_pretrained(out)
    for entry in trainer.state.log_history:
        keys = ("episode", "objective/kl", "objective/scores", "objective/entropy", "policy/clipfrac_avg",
                "val/ratio")
        print({k: round(entry[k], 4) for k in keys if k in entry}, flush=True)
    print(f"TRL PPO ({args.reward}): {rollouts} rollouts x {batch} prompts, kl_coef {args.kl_coef}, lr {lr}: "
          f"{wall:.0f} s -> {out}")


if __name__ == "__main__":
    main()
