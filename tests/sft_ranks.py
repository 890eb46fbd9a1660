"""Train a tiny Llama with SFTModule for 2 steps of a global batch of 4 and save its final weights.

``python -m torch.distributed.run --nproc_per_node=2 tests/sft_ranks.py {ddp,fsdp} OUT.pt`` (2 ranks x 2 rows),
or :func:`train` in-process (``single``: 1 process x 4 rows). Used by ``tests/test_strategies.py``.
"""

import os
import sys

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, DistributedSampler

ROWS, LENGTH, VOCAB = 8, 12, 32


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config)


def rows() -> list[dict]:
    """Rows of equal length and equal target counts (the last 6 tokens), so a mean of per-rank token means is
    the global token mean."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (ROWS, LENGTH), generator=g)
    loss_mask = torch.arange(LENGTH) >= LENGTH - 6
    return [{"input_ids": ids[i], "attention_mask": torch.ones(LENGTH, dtype=torch.long), "loss_mask": loss_mask}
            for i in range(ROWS)]


def train(strategy: str) -> dict[str, torch.Tensor]:
    from lrlhf.modules import SFTConfig, SFTModule
    from lrlhf.strategies import CPUFSDPStrategy

    torch.set_num_threads(1)
    module = SFTModule(tiny_llama(), config=SFTConfig(lr=1e-3, scheduler="constant"))
    devices, kw = 1, {}
    if strategy == "ddp":
        devices, kw = 2, {"strategy": "ddp"}
    elif strategy == "fsdp":
        devices, kw = 2, {"strategy": CPUFSDPStrategy()}
    # rank r reads rows r, r + 2, ... in order, so each step's global batch is the single process's 4 rows
    # (Lightning's own DistributedSampler shuffles)
    sampler = None
    if devices > 1:
        sampler = DistributedSampler(rows(), num_replicas=devices, rank=int(os.environ["RANK"]), shuffle=False)
    loader = DataLoader(rows(), batch_size=4 // devices, sampler=sampler)
    trainer = pl.Trainer(accelerator="cpu", devices=devices, max_steps=2, logger=False, enable_checkpointing=False,
                         use_distributed_sampler=False,
                         enable_progress_bar=False, enable_model_summary=False, **kw)
    trainer.fit(module, train_dataloaders=loader)
    if strategy == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel

        assert isinstance(module.model.model.layers[0], FullyShardedDataParallel)  # one unit per decoder layer
        with FullyShardedDataParallel.summon_full_params(trainer.strategy.model, writeback=False):
            return {n.replace("_fsdp_wrapped_module.", ""): p.detach().clone()
                    for n, p in module.model.named_parameters()}
    return {n: p.detach().clone() for n, p in module.model.named_parameters()}


if __name__ == "__main__":
    weights = train(sys.argv[1])
    if torch.distributed.get_rank() == 0:
        torch.save(weights, sys.argv[2])
