"""Data-parallel SFT on CPU (2 gloo processes) matches one process with the same global batch."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lrlhf.strategies import DecoderLayerWrapPolicy, decoder_layer_classes

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import sft_ranks  # noqa: E402


@pytest.fixture(scope="module")
def single():
    return sft_ranks.train("single")


def _two_ranks(strategy: str, tmp_path) -> dict:
    out = tmp_path / f"{strategy}.pt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    with socket.socket() as probe:  # torchrun's --master_port=0 hung here: pick a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
           str(HERE / "sft_ranks.py"), strategy, str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(out, weights_only=True)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_train_like_one_process_with_the_same_global_batch(strategy, single, tmp_path):
    got = _two_ranks(strategy, tmp_path)
    assert got.keys() == single.keys()
    moved = max((single[n] - sft_ranks.tiny_llama().state_dict()[n]).abs().max() for n in single)
    assert moved > 1e-4  # two AdamW steps at lr 1e-3 moved the weights (else equality proves nothing)
    for name, weight in single.items():
        # fp32; the gradient all-reduce sums in another order than one process does
        torch.testing.assert_close(got[name], weight, atol=1e-5, rtol=0, msg=name)


def test_the_wrap_policy_finds_the_decoder_layer_class():
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    assert decoder_layer_classes(sft_ranks.tiny_llama()) == {LlamaDecoderLayer}
    with pytest.raises(ValueError, match="pass layer_names"):
        decoder_layer_classes(torch.nn.Linear(2, 2))
    assert DecoderLayerWrapPolicy(["LlamaDecoderLayer"]).layer_names == ["LlamaDecoderLayer"]


@pytest.mark.parametrize("name, cls", [("auto", None), ("ddp", "DDPStrategy"), ("fsdp", "FSDPStrategy"),
                                       ("fsdp_cpu", "CPUFSDPStrategy")])
def test_every_strategy_config_composes_into_the_trainer_and_instantiates(name, cls):
    from hydra.utils import instantiate
    from test_cli import _compose

    cfg = _compose([f"strategy={name}", "recipe=sft"])
    strategy = instantiate(cfg.trainer.strategy) if cls else cfg.trainer.strategy
    if cls is None:
        assert strategy == "auto"
        return
    assert type(strategy).__name__ == cls
    if name.startswith("fsdp"):  # the GPU path is Lightning's own class; both wrap per decoder layer
        assert type(strategy).__module__.startswith("lightning" if name == "fsdp" else "lrlhf")
        assert isinstance(strategy.kwargs["auto_wrap_policy"], DecoderLayerWrapPolicy)
        assert strategy.kwargs["use_orig_params"] is True


def _generate_worker(rank, init_file, out_dir):
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel

    from lrlhf.strategies import full_params_for_generation

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        model = sft_ranks.tiny_llama().eval()
        prompt = torch.tensor([[5, 6, 7, 8]])
        kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
        expected = model.generate(prompt, **kw)
        wrapped = FullyShardedDataParallel(model, auto_wrap_policy=DecoderLayerWrapPolicy(), use_orig_params=True,
                                           device_id=torch.device("cpu"))
        try:  # FSDP1: the root unit's weights are flat shards outside its forward
            model.generate(prompt, **kw)
            failed = False
        except RuntimeError:
            failed = True
        with full_params_for_generation(wrapped):
            got = model.generate(prompt, **kw)
        torch.save({"failed": failed, "got": got, "expected": expected}, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_generation_under_fsdp1_inside_full_params_for_generation(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_generate_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        out = torch.load(tmp_path / f"{rank}.pt", weights_only=True)
        assert out["failed"]  # the known FSDP1 failure ("'weight' must be 2-D"), so the helper is needed
        assert torch.equal(out["got"], out["expected"])  # greedy: the unsharded model's exact tokens
