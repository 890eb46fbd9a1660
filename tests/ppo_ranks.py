"""PPO on the toy world with 2 processes: straight for N + M rollouts, then N, stop, resume for M.

``python -m torch.distributed.run --nproc_per_node=2 tests/ppo_ranks.py {fsdp2,ddp} WORLD_DIR OUT_DIR N M``
writes ``OUT_DIR/rank<r>.pt`` per rank: for each run (``straight``, ``first``, ``resumed``) the sampled ids of
every rollout, the trained weights (gathered to full tensors), the KL controller's beta, the rollouts done, and
the torch RNG state at the start of training (per-rank sampling streams); the straight run also keeps the best
held-out checkpoint (the first: rollout 0, the starting policy) and restores it with the callback's
``stage_summary`` (what the CLI calls)
(``restored``: the weights after that; ``start``: the trained weights when training started). Used by
``tests/test_strategies.py``.
"""

import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

BATCH = 2  # prompts per rank and rollout


class RecordSamples:
    """Mixin: keeps the sampled ids of every rollout and the RNG state training started from."""

    def on_train_start(self):
        super().on_train_start()
        self.start_rng = torch.get_rng_state()
        self.start_weights = trained(self)  # a collective under FSDP2: every rank runs this hook

    def make_rollout(self, batch):
        rollout = super().make_rollout(batch)
        self.sampled.append(rollout.response_ids.clone())  # (the held-out evaluation generates too: not kept)
        return rollout


def module(world, tokenizer, lr=5e-2):
    from lrlhf.functional import AdaptiveKLController
    from lrlhf.models import LoraSpec, ModelConfig, ScalarModel, load_causal_lm
    from lrlhf.modules import PPOConfig, PPOModule
    from lrlhf.modules.critic import ValueAdapter

    cls = type("Recorded", (RecordSamples, PPOModule), {})
    torch.manual_seed(0)
    reward = ScalarModel(load_causal_lm(ModelConfig(str(world.model))))
    config = PPOConfig(max_new_tokens=6, ppo_epochs=2, minibatch_size=1, forward_batch_size=2, lr=lr,
                       policy_lora=LoraSpec(r=2),
                       # The clip's global norm runs under both strategies but never scales: sharded, the norm
                       # is summed in another order (measured: equal to 1e-7 relative), and AdamW at lr 0.05
                       # amplifies that ulp over a few steps past any fp32 tolerance; unscaled, FSDP2 == DDP
                       # bitwise (measured 0.0).
                       max_grad_norm=1e4)
    out = cls(ModelConfig(str(world.model)), reward, tokenizer, config, critic=ValueAdapter(LoraSpec(r=2)),
              kl_controller=AdaptiveKLController(0.1, target=0.5, horizon=20.0))
    out.sampled = []
    return out


def trained(module) -> dict[str, torch.Tensor]:
    """The trained weights as full tensors (a collective under FSDP2: every rank calls it)."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in module.named_parameters():
        if "lora_" in name or name.startswith("critic."):
            out[name] = (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
    return out


def run(strategy: str, world, out: Path, rollouts: int, ckpt_path=None, restore_best=False, lr=5e-2) -> dict:
    from transformers import AutoTokenizer

    from lrlhf.callbacks import HeldOutUtilityEarlyStopping, ResumableCheckpoint
    from lrlhf.data.datamodules import PromptDataModule
    from lrlhf.strategies import FSDP2Strategy

    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    tokenizer = AutoTokenizer.from_pretrained(world.tokenizer)
    ppo = module(world, tokenizer, lr)
    callbacks = [ResumableCheckpoint(dirpath=out / "ckpt", keep_last_k=2)]
    if restore_best:  # held-out utility at rollout 0 and after each rollout; min_delta keeps rollout 0 best
        callbacks.append(HeldOutUtilityEarlyStopping(world.eval_prompts, every_n_rollouts=1, patience=None,
                                                     min_delta=1e9, batch_size=8, plot=False,
                                                     dirpath=out / "best"))
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=FSDP2Strategy() if strategy == "fsdp2" else strategy,
                         max_epochs=-1, max_steps=rollouts * ppo.updates_per_rollout(BATCH), logger=False,
                         callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_val_batches=0, default_root_dir=out)
    data = PromptDataModule(tokenizer, train=str(world.rl_prompts), batch_size=BATCH, max_length=64, seed=3)
    trainer.fit(ppo, datamodule=data, ckpt_path=ckpt_path)
    from torch.distributed.tensor import DTensor

    extra, weights = {}, trained(ppo)
    if restore_best:  # the CLI's restore of the best checkpoint (a sharded folder under FSDP2)
        from lrlhf.callbacks import HeldOutUtilityEarlyStopping

        stopper = next(c for c in trainer.callbacks if isinstance(c, HeldOutUtilityEarlyStopping))
        chosen = stopper.stage_summary(trainer, ppo)
        extra = {"restored": trained(ppo), "chosen_rollout": chosen["chosen/rollout"], "start": ppo.start_weights,
                 "chosen_is_folder": Path(chosen["chosen/checkpoint"]).is_dir()}
    return {**extra,"sampled": ppo.sampled, "weights": weights, "beta": float(ppo.kl_controller.value),
            "sharded": [isinstance(p, DTensor) for p in ppo.parameters()],
            "rollouts_done": ppo.rollouts_done, "global_step": trainer.global_step,
            "start_rng": ppo.start_rng, "strategy": type(trainer.strategy).__name__}


if __name__ == "__main__":
    import faulthandler
    import os

    # a hang (a collective one rank never joins) prints every thread's stack and fails instead of blocking
    faulthandler.dump_traceback_later(int(os.environ.get("LRLHF_HANG_TIMEOUT", "200")), exit=True)
    from lrlhf.data.toy import ToyWorldPaths

    strategy, world_dir, out_dir, n, m = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    world = ToyWorldPaths.under(world_dir)
    results = {"straight": run(strategy, world, out_dir / "straight", n + m, restore_best=True)}
    results["first"] = run(strategy, world, out_dir / "split", n)
    results["resumed"] = run(strategy, world, out_dir / "split", n + m, ckpt_path="last")
    try:  # another learning rate: the checkpoint's config check refuses it (sharded: after the weights loaded)
        run(strategy, world, out_dir / "split", n + m + 1, ckpt_path="last", lr=1e-3)
        results["refused"] = ""
    except ValueError as error:
        results["refused"] = str(error)
    torch.save(results, out_dir / f"rank{torch.distributed.get_rank()}.pt")
