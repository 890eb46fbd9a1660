"""Sampling on an FSDP2-sharded model when the ranks' rows stop at different steps (a hang before the fix).

``python -m torch.distributed.run --nproc_per_node=2 tests/sampler_ranks.py OUT_DIR`` writes ``OUT_DIR/rank<r>.pt``:
rank 0 treats every id as EOS (its rows stop after one token), rank 1 only an id it almost never draws. Each
forward of the sharded model is a collective, so both ranks must take the same number of steps: lrlhf's sampler
(``synced`` from :func:`forward_is_collective`) and transformers' ``generate`` (``synced_gpus`` from the marker
:func:`fully_shard_model` sets). Used by ``tests/test_strategies.py``.
"""

import datetime
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main(out: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import LlamaConfig, LlamaForCausalLM

    from lrlhf.models.generation import sample_with_logprobs
    from lrlhf.strategies import fully_shard_model
    from lrlhf.utils.distributed import forward_is_collective

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=2)).eval()
    root = torch.nn.ModuleDict({"model": model})
    collective_before = forward_is_collective(model)
    fully_shard_model(root, init_device_mesh("cpu", (2,)), layer_names=["LlamaDecoderLayer"])
    ids = torch.randint(3, 32, (2, 4))
    mask = torch.ones_like(ids)
    eos = list(range(32)) if rank == 0 else [2]
    torch.manual_seed(1 + rank)
    with torch.no_grad():
        sampled, logprobs = sample_with_logprobs(model, ids, mask, max_new_tokens=8, temperature=1.0,
                                                 eos_token_ids=eos, pad_token_id=0,
                                                 synced=forward_is_collective(model))
        generated = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=8,
                                   eos_token_id=eos, pad_token_id=0)
    torch.save({"collective_before": collective_before, "collective": forward_is_collective(model),
                "sampled": sampled, "logprobs": logprobs, "generated": generated}, out / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    # Everything is saved and the group is closed; leave without the interpreter's teardown, in which a rank once
    # aborted ("terminate called without an active exception", SIGABRT, CI of 2026-11-30 on a fresh clone: a C++
    # thread torch or gloo still held at exit), failing a test whose checks had all run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
