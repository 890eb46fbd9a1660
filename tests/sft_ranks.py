"""Train a tiny Llama with SFTModule (or RewardModule) for 2 steps of a global batch of 4; save the final weights.

``python -m torch.distributed.run --nproc_per_node=2 tests/sft_ranks.py OUT.pt TASK:STRATEGY ...`` (2 ranks x 2
rows each; TASK ``sft``, ``sft_tied_lora`` (tied embeddings, LoRA) or ``rm``; STRATEGY ``ddp``, ``fsdp`` (CPU
FSDP1) or ``fsdp2``; several runs one after the other in the same processes), or :func:`train` in-process
(``single``: 1 process x 4 rows). Used by ``tests/test_strategies.py``.
"""

import os
import sys

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, DistributedSampler

ROWS, LENGTH, VOCAB = 8, 12, 32


def tiny_llama(tied: bool = False):
    """A 2-layer Llama; ``tied``: the LM head shares the input embedding (as in SmolLM2)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=tied)
    return LlamaForCausalLM(config)


def rows() -> list[dict]:
    """Rows of equal length and equal target counts (the last 6 tokens), so a mean of per-rank token means is
    the global token mean."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (ROWS, LENGTH), generator=g)
    loss_mask = torch.arange(LENGTH) >= LENGTH - 6
    return [{"input_ids": ids[i], "attention_mask": torch.ones(LENGTH, dtype=torch.long), "loss_mask": loss_mask}
            for i in range(ROWS)]


def pairs() -> list[dict]:
    """Preference pairs of equal lengths (chosen and rejected random tokens after a shared 4-token prompt)."""
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(1, VOCAB, (ROWS, 4), generator=g)
    ids = torch.randint(1, VOCAB, (ROWS, 2, LENGTH - 4), generator=g)
    return [{"chosen": torch.cat([prompt[i], ids[i, 0]]), "rejected": torch.cat([prompt[i], ids[i, 1]])}
            for i in range(ROWS)]


def collate_pairs(items: list[dict]) -> dict:
    """The RewardModule pair layout: chosen rows then rejected rows, every pair labelled (target 1)."""
    b = len(items)
    ids = torch.stack([it["chosen"] for it in items] + [it["rejected"] for it in items])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pair_targets": torch.ones(b),
            "lengths": torch.full((2 * b,), LENGTH), "prompt_lengths": torch.full((2 * b,), 4)}


def _strategy(name: str):
    from lrlhf.strategies import CPUFSDPStrategy, FSDP2Strategy

    return {"ddp": "ddp", "fsdp": CPUFSDPStrategy(), "fsdp2": FSDP2Strategy()}[name]


def train(strategy: str, task: str = "sft") -> dict[str, torch.Tensor]:
    from lrlhf.models import LoraSpec
    from lrlhf.modules import RewardConfig, RewardModule, SFTConfig, SFTModule

    torch.set_num_threads(1)
    # AdamW's eps = lr. Its step lr * m / (sqrt(v) + eps) moves a weight by at most lr / eps times a change of
    # the gradient, and two reduction orders round a gradient differently (by a few u |g|): with eps = lr the
    # runs' weights stay that close. With the default 1e-8, a gradient component near 0 (|g| ~ eps) multiplies
    # its rounding by lr eps / (|g| + eps)^2 ~ 1e4, and one whose sign the rounding flips moves by 2 lr.
    if task.startswith("sft"):  # sft, sft_tied_lora: tied embeddings (frozen) + LoRA
        model = tiny_llama(tied="tied" in task)
        lora = LoraSpec(r=4) if "lora" in task else None
        lr = 1e-2 if lora else 1e-3
        module = SFTModule(model, config=SFTConfig(lr=lr, eps=lr, scheduler="constant", lora=lora))
        items, collate = rows(), None
    else:  # a full fine-tune of the backbone and the head (the LM head is never run by a reward model)
        module, items, collate = RewardModule(tiny_llama(), RewardConfig(lr=1e-3)), pairs(), collate_pairs
        configure = module.configure_optimizers  # RewardConfig has no eps

        def configure_optimizers():
            out = configure()
            for group in out["optimizer"].param_groups:
                group["eps"] = module.config.lr
            return out

        module.configure_optimizers = configure_optimizers
    devices, kw = (1, {}) if strategy == "single" else (2, {"strategy": _strategy(strategy)})
    # rank r reads rows r, r + 2, ... in order, so each step's global batch is the single process's 4 rows
    # (Lightning's own DistributedSampler shuffles)
    sampler = None
    if devices > 1:
        sampler = DistributedSampler(items, num_replicas=devices, rank=int(os.environ["RANK"]), shuffle=False)
    loader = DataLoader(items, batch_size=4 // devices, sampler=sampler, collate_fn=collate)
    trainer = pl.Trainer(accelerator="cpu", devices=devices, max_steps=2, logger=False, enable_checkpointing=False,
                         use_distributed_sampler=False,
                         enable_progress_bar=False, enable_model_summary=False, **kw)
    trainer.fit(module, train_dataloaders=loader)
    if strategy == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel

        assert any(isinstance(m, FullyShardedDataParallel) for m in module.modules())  # wrapped
        with FullyShardedDataParallel.summon_full_params(trainer.strategy.model, writeback=False):
            return {n.replace("_fsdp_wrapped_module.", ""): p.detach().clone()
                    for n, p in module.model.named_parameters()}
    if strategy == "fsdp2":
        from torch.distributed.tensor import DTensor

        params = dict(module.model.named_parameters())
        lm = getattr(module.model, "backbone", module.model)
        emb = lm.get_input_embeddings().weight
        tied = emb if emb is lm.get_output_embeddings().weight else None
        assert (task == "sft_tied_lora") == (tied is not None) and not isinstance(tied, DTensor)  # tie kept, replicated
        assert all(isinstance(p, DTensor) for p in params.values() if p is not tied)  # every other one sharded
        # full tensors: a collective, called in the same order on every rank
        return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone() for n, p in params.items()}
    return {n: p.detach().clone() for n, p in module.model.named_parameters()}


if __name__ == "__main__":
    import faulthandler
    import os

    # a hang (a collective one rank never joins) prints every thread's stack and fails instead of blocking
    faulthandler.dump_traceback_later(int(os.environ.get("LRLHF_HANG_TIMEOUT", "200")), exit=True)
    results = {}
    for run in sys.argv[2:]:
        task, strategy = run.split(":")
        results[run] = train(strategy, task)
    if torch.distributed.get_rank() == 0:
        torch.save(results, sys.argv[1])
