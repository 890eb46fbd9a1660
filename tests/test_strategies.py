"""Data-parallel training on CPU (2 gloo processes): SFT and RM steps under DDP, FSDP1 and FSDP2 match one process
with the same global batch; PPO under FSDP2 (generation included) trains, resumes bitwise and matches DDP; each
rank samples its own stream."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lrlhf.strategies import DecoderLayerWrapPolicy, decoder_layer_classes, fully_shard_model
from lrlhf.utils.distributed import rank_seed

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import ppo_ranks  # noqa: E402
import sft_ranks  # noqa: E402

STEP_RUNS = ["sft:ddp", "sft:fsdp", "sft:fsdp2", "rm:ddp", "rm:fsdp", "rm:fsdp2", "sft_tied_lora:fsdp2"]


def _torchrun(script: str, *args, timeout: int = 240) -> None:
    """``torchrun --nproc_per_node=2 tests/<script> args`` on a free port; a hang fails after ``timeout`` s."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    with socket.socket() as probe:  # torchrun's --master_port=0 hung here: pick a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
           str(HERE / script), *map(str, args)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Every (task, strategy) of :data:`STEP_RUNS`, one after the other in one 2-process launch."""
    out = tmp_path_factory.mktemp("steps") / "weights.pt"
    _torchrun("sft_ranks.py", out, *STEP_RUNS)
    return torch.load(out, weights_only=True)


@pytest.fixture(scope="module")
def single():
    return {}


@pytest.mark.parametrize("run", STEP_RUNS)
def test_two_ranks_train_like_one_process_with_the_same_global_batch(run, two_ranks, single):
    task, _ = run.split(":")
    if task not in single:
        single[task] = sft_ranks.train("single", task)
    expected, got = single[task], two_ranks[run]
    assert got.keys() == expected.keys()
    if task == "sft_tied_lora":  # the zero-initialised LoRA B matrices moved; the base did not
        moved = max(w.abs().max() for n, w in expected.items() if "lora_B" in n)
    else:
        init = sft_ranks.tiny_llama().state_dict()
        moved = max((w - init[n.removeprefix("backbone.")]).abs().max() for n, w in expected.items()
                    if n.removeprefix("backbone.") in init)
    assert moved > 1e-4  # two AdamW steps moved the weights (else equality proves nothing)
    for name, weight in expected.items():
        # fp32; the gradient all-reduce / reduce-scatter sums in another order than one process does, which
        # rounds a gradient component differently by d ~ u sqrt(n) |g| (u = 2^-24, n = 48 terms, |g| < 3: <= ~1e-6).
        # AdamW with eps = lr (sft_ranks.train) passes d on to the weight at most as lr / eps * d = d per step:
        # 1e-5 bounds two steps of it, whatever the gradient's size or sign
        torch.testing.assert_close(got[name], weight, atol=1e-5, rtol=0, msg=name)


def test_the_wrap_policy_finds_the_decoder_layer_class():
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    assert decoder_layer_classes(sft_ranks.tiny_llama()) == {LlamaDecoderLayer}
    with pytest.raises(ValueError, match="pass layer_names"):
        decoder_layer_classes(torch.nn.Linear(2, 2))
    assert DecoderLayerWrapPolicy(["LlamaDecoderLayer"]).layer_names == ["LlamaDecoderLayer"]


@pytest.mark.parametrize("name, cls", [("auto", None), ("ddp", "DDPStrategy"), ("fsdp", "FSDPStrategy"),
                                       ("fsdp_cpu", "CPUFSDPStrategy"), ("fsdp2", "FSDP2Strategy")])
def test_every_strategy_config_composes_into_the_trainer_and_instantiates(name, cls):
    from hydra.utils import instantiate
    from test_cli import _compose

    cfg = _compose([f"strategy={name}", "recipe=sft"])
    strategy = instantiate(cfg.trainer.strategy) if cls else cfg.trainer.strategy
    if cls is None:
        assert strategy == "auto"
        return
    assert type(strategy).__name__ == cls
    if name == "fsdp2":  # Lightning's ModelParallelStrategy, data parallel only, sharding applied by the strategy
        from lightning.pytorch.strategies import ModelParallelStrategy

        assert isinstance(strategy, ModelParallelStrategy) and strategy.layer_names is None
        assert strategy.reshard_after_forward is True and strategy._save_distributed_checkpoint is True
        return
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


# ------------------------------------------------------------------------------------------- PPO, 2 ranks
N, M = 1, 1  # rollouts before the stop, after the resume


@pytest.fixture(scope="module")
def toy_world(tmp_path_factory):
    from lrlhf.data.toy import WorldSizes, build_world

    sizes = WorldSizes(sft_train=4, sft_val=4, pref_train=2, pref_val=2, pref_test=2, rl=12, eval=6)
    return build_world(tmp_path_factory.mktemp("toy"), seed=0, sizes=sizes)


@pytest.fixture(scope="module")
def ppo_runs(toy_world, tmp_path_factory):
    """``{strategy: [rank 0's results, rank 1's]}`` of tests/ppo_ranks.py (straight N + M, first N, resumed M)."""
    out = {}
    for strategy in ("fsdp2", "ddp"):
        folder = tmp_path_factory.mktemp(strategy)
        _torchrun("ppo_ranks.py", strategy, toy_world.root, folder, N, M)
        out[strategy] = [torch.load(folder / f"rank{r}.pt", weights_only=True) for r in range(2)]
        for runs in out[strategy]:
            runs["folder"] = folder
    return out


def test_ppo_trains_under_fsdp2_with_generation_on_two_ranks(ppo_runs):
    for rank, runs in enumerate(ppo_runs["fsdp2"]):
        run = runs["straight"]
        assert run["strategy"] == "FSDP2Strategy" and all(run["sharded"])  # every parameter is a DTensor shard
        assert run["rollouts_done"] == N + M and len(run["sampled"]) == N + M  # rollouts, each generated
        assert all(ids.shape[0] == 2 and (ids != 0).any() for ids in run["sampled"])
        lora_b = [w for n, w in run["weights"].items() if "lora_B" in n]  # zero-initialised: moved by training
        assert lora_b and min(w.abs().max() for w in lora_b) > 1e-4, rank
        assert run["beta"] != 0.1  # the adaptive KL controller moved (it sees the global KL)
    a, b = (r["straight"] for r in ppo_runs["fsdp2"])
    assert a["beta"] == b["beta"] and all(torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"])


def test_ppo_under_fsdp2_matches_ddp(ppo_runs):
    """The same ranks, seeds and prompts: FSDP2's per-unit gather / reduce-scatter (policy and value forward
    through the same blocks, one backward) give DDP's samples and weights (fp32; 2 ranks, so the sums agree
    up to ordering)."""
    for fsdp2, ddp in zip(ppo_runs["fsdp2"], ppo_runs["ddp"], strict=True):
        for a, b in zip(fsdp2["straight"]["sampled"], ddp["straight"]["sampled"], strict=True):
            assert torch.equal(a, b)
        assert fsdp2["straight"]["weights"].keys() == ddp["straight"]["weights"].keys()
        for name, weight in ddp["straight"]["weights"].items():
            torch.testing.assert_close(fsdp2["straight"]["weights"][name], weight, atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize("strategy", ["fsdp2", "ddp"])
def test_ppo_resume_equals_uninterrupted_on_two_ranks(ppo_runs, strategy):
    """N rollouts, stop (ResumableCheckpoint: a sharded folder under FSDP2), resume M == N + M straight, bitwise:
    samples of every rank, trained weights, the adaptive KL controller's beta, the step count."""
    for runs in ppo_runs[strategy]:
        straight, first, resumed = runs["straight"], runs["first"], runs["resumed"]
        assert resumed["rollouts_done"] == N + M and resumed["global_step"] == straight["global_step"]
        for a, b in zip(straight["sampled"], first["sampled"] + resumed["sampled"], strict=True):
            assert torch.equal(a, b)
        assert resumed["beta"] == straight["beta"]
        assert all(torch.equal(straight["weights"][k], resumed["weights"][k]) for k in straight["weights"])
        # resuming with another ppo.lr is refused, naming the key and both values
        assert "cannot resume from" in runs["refused"] and "hparams.ppo.lr: checkpoint 0.05, this run 0.001" in runs[
            "refused"], runs["refused"]


def test_each_rank_samples_its_own_stream(ppo_runs):
    """Same seed on both ranks: training starts from rank_seed(seed, rank), so the two ranks' generators (and
    samples) differ; the stream is deterministic in (seed, rank)."""
    for strategy, ranks in ppo_runs.items():
        states = [r["straight"]["start_rng"] for r in ranks]
        assert not torch.equal(*states), strategy
        for rank, state in enumerate(states):
            torch.manual_seed(rank_seed(0, rank))  # ppo_ranks.py seeds everything with 0
            assert torch.equal(torch.get_rng_state(), state), (strategy, rank)
        assert not torch.equal(ranks[0]["straight"]["sampled"][0], ranks[1]["straight"]["sampled"][0])


def test_rank_seed_is_deterministic_and_distinct():
    seeds = {(s, r): rank_seed(s, r) for s in range(4) for r in range(8)}
    assert len(set(seeds.values())) == len(seeds)  # distinct over seeds and ranks
    assert all(rank_seed(s, r) == v for (s, r), v in seeds.items())  # deterministic
    assert all(0 <= v < 2 ** 63 for v in seeds.values())


def test_fsdp2_refuses_a_trainable_tied_embedding():
    with pytest.raises(ValueError, match="tied to its LM head and trainable"):
        fully_shard_model(sft_ranks.tiny_llama(tied=True), mesh=None)


@pytest.mark.parametrize("strategy", ["fsdp2", "ddp"])
def test_the_cli_restores_the_best_held_out_checkpoint(ppo_runs, strategy):
    """Early stopping's stage_summary (the CLI calls it) loads best.ckpt (a sharded folder under FSDP2, a file under
    DDP) into the trained model:
    the starting policy's weights (rollout 0, evaluated before any update; min_delta keeps it best)."""
    for runs in ppo_runs[strategy]:
        straight, start = runs["straight"], runs["straight"]["start"]
        assert straight["chosen_rollout"] == 0 and straight["chosen_is_folder"] == (strategy == "fsdp2")
        assert any(not torch.equal(straight["weights"][k], start[k]) for k in start)
        assert all(torch.equal(straight["restored"][k], start[k]) for k in start)


def test_restoring_a_sharded_checkpoint_under_a_single_device_strategy_is_refused(tmp_path):
    import lightning.pytorch as pl

    from lrlhf.strategies import restore_sharded_weights

    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
    with pytest.raises(RuntimeError, match="is a sharded checkpoint .* SingleDeviceStrategy .* strategy=fsdp2"):
        restore_sharded_weights(trainer, tmp_path)


def test_a_sharded_checkpoint_loads_into_one_process_for_export(ppo_runs, toy_world, tmp_path):
    """The FSDP2 run's last sharded checkpoint (rollout N + M) loaded into a fresh single-process module gives the
    trained weights; the module then exports a full HF model whose policy adapter holds them."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from lrlhf.strategies import load_sharded_checkpoint

    runs = ppo_runs["fsdp2"][0]
    folder = runs["folder"] / "split" / "ckpt" / "last.ckpt"
    assert folder.is_dir() and (folder / "meta.pt").is_file()
    module = ppo_ranks.module(toy_world, AutoTokenizer.from_pretrained(toy_world.tokenizer))
    module.configure_model()
    meta = load_sharded_checkpoint(module, folder)
    assert meta["rollouts_done"] == N + M and meta["kl_controller"]
    loaded = ppo_ranks.trained(module)
    assert loaded.keys() == runs["resumed"]["weights"].keys()
    assert all(torch.equal(loaded[k], runs["resumed"]["weights"][k]) for k in loaded)
    paths = module.export(tmp_path / "export")
    adapter = load_file(paths["adapter"] / "adapter_model.safetensors")
    name = next(k for k in loaded if "lora_B.policy" in k)  # e.g. model.base_model.model....lora_B.policy.weight
    short = name.removeprefix("model.").replace(".policy", "")
    assert torch.equal(adapter[short], loaded[name])
    with pytest.raises(FileNotFoundError, match="not a sharded checkpoint folder"):
        load_sharded_checkpoint(module, tmp_path)


def test_sampling_on_a_sharded_model_keeps_the_ranks_in_step(tmp_path):
    """Rank 0's rows stop after one token, rank 1's run on: both samplers keep stepping every rank (pads for
    stopped rows) until all have stopped, instead of leaving rank 1 waiting in a collective forward."""
    _torchrun("sampler_ranks.py", tmp_path, timeout=120)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert [r["collective_before"] for r in ranks] == [False, False]  # an unsharded model: no lockstep
    assert [r["collective"] for r in ranks] == [True, True]
    stopped, running = ranks
    assert stopped["sampled"].shape == running["sampled"].shape == (2, 8)  # the same 8 steps on both ranks
    assert (stopped["sampled"][:, 1:] == 0).all()  # after its EOS, rank 0 only pads
    assert (running["sampled"][:, 1:] != 0).any()
    assert torch.isfinite(stopped["logprobs"]).all() and torch.isfinite(running["logprobs"]).all()
    # transformers' generate (synced_gpus from the marker) stepped in lockstep too -- a rank leaving early would
    # hang the other in its next forward -- and returns each rank's own length (prompt 4 + 1 and 4 + 8)
    assert stopped["generated"].shape == (2, 5) and running["generated"].shape == (2, 12)
