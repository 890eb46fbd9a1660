"""The CLI with 2 processes on CPU (gloo): torchrun and Lightning's own launcher run the real ``train.py``; every
rank trains every stage in one folder, only rank 0 exports, evaluates and writes, and a stage lands in the cache
once, with nothing left behind."""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra.types import RunMode

from lrlhf.run import planning
from lrlhf.utils import distributed

ROOT = Path(__file__).resolve().parents[1]
WORLD = ["world=toy_tiny"]
TIMEOUT = 240  # s per launch (each takes ~15-20 s here): a hang fails instead of blocking


def _launch(cmd: list[str], cache: Path) -> str:
    """Run ``cmd`` from the repository root; the whole process group is killed after :data:`TIMEOUT`."""
    env = {**os.environ, "LRLHF_CACHE_DIR": str(cache), "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1",
           # tests/abort_at_exit: a rank that reaches the interpreter's teardown aborts, as one did in CI
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "abort_at_exit"), str(ROOT / "src"),
                                          str(ROOT / "tests")])}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd[:8])}... hung for {TIMEOUT} s:\n{out[-4000:]}")
    assert proc.returncode == 0, out[-6000:]
    return out


def _torchrun(tmp: Path, *args: str) -> str:
    with socket.socket() as probe:  # a free port (torchrun's --master_port=0 hung here)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return _launch([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
                    "train.py", "trainer.devices=2", "logger=none", *args, *WORLD], tmp / "cache")


def _leftovers(folder: Path) -> list[Path]:
    """Temporary, building or half-swapped folders / files under ``folder``."""
    return [p for p in folder.rglob("*") if p.name.endswith((".tmp", ".building", ".old"))]


def test_sft_under_ddp_with_torchrun(tmp_path):
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    out = _torchrun(tmp_path, "recipe=sft", "strategy=ddp", f"hydra.run.dir={run}", "trainer.max_steps=3",
                    "data.batch_size=8")
    assert out.count("== lrlhf sft: done ==") == 1 and out.count("building the toy world") == 1  # rank 0 prints
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stage"] == "sft" and Path(summary["export"]) == run / "merged" and summary["run_dir"] == str(run)
    config = (run / "config.yaml").read_text()
    assert "DDPStrategy" in config and "devices: 2" in config
    # the export is the trained model: the weights of the last checkpoint (a file under DDP), exactly
    trained = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    exported = AutoModelForCausalLM.from_pretrained(run / "merged").state_dict()
    init = AutoModelForCausalLM.from_pretrained(next((tmp_path / "cache" / "worlds").iterdir()) / "model").state_dict()
    assert exported.keys() == {k.removeprefix("model.") for k in trained}
    assert max((exported[k] - init[k]).abs().max() for k in exported) > 1e-4  # it trained
    for name, weight in exported.items():
        assert torch.equal(weight, trained[f"model.{name}"]), name
    assert not _leftovers(tmp_path)


def test_ppo_lora_under_fsdp2_with_torchrun_builds_its_stages_in_the_same_launch(tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoModelForCausalLM

    run, stages = tmp_path / "run", tmp_path / "cache" / "stages"
    out = _torchrun(tmp_path, "recipe=ppo_lora", "strategy=fsdp2", f"hydra.run.dir={run}", "trainer.max_steps=4",
                    "data.batch_size=8", "eval.n_samples=1", "callbacks.checkpoint.every_n_rollouts=1",
                    'stage_overrides.sft=["trainer.max_steps=3","data.batch_size=8"]',
                    'stage_overrides.rm=["trainer.max_steps=3","data.batch_size=8"]')
    for need in ("sft", "rm"):
        assert out.count(f"building the `{need}` stage") == 1, out[-3000:]
    # one folder per stage, nothing else (no building, temporary or .old folder left)
    names = sorted(p.name for p in stages.iterdir())
    assert [n.split("-")[0] for n in names] == ["rm", "sft"] and not _leftovers(tmp_path)
    for name in names:  # built by both ranks under FSDP2, then swapped in by rank 0
        folder = stages / name
        assert json.loads((folder / "summary.json").read_text())["run_dir"] == str(folder)
        config = (folder / "config.yaml").read_text()
        assert "FSDP2Strategy" in config and "devices: 2" in config and f"run_dir: {folder}\n" in config
        assert (folder / "checkpoints" / "last.ckpt" / ".metadata").is_file()  # a sharded checkpoint folder
    rm = stages / names[0]
    assert (rm / "model" / "reward_calibration.json").is_file() and (rm / "model" / "reward_head.safetensors").is_file()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stage"] == "ppo" and summary["rollouts"] == 2 and "gold/ppo_minus_sft" in summary
    # the adapter export holds the trained policy adapter: the last sharded checkpoint's (rollout 2, the end)
    last = run / "checkpoints" / "last.ckpt"
    dcp_to_torch_save(last, tmp_path / "full.pt")
    state = torch.load(tmp_path / "full.pt", weights_only=True)["state_dict"]
    adapter = load_file(run / "export" / "adapter" / "adapter_model.safetensors")
    policy = {k.removeprefix("model.").replace(".policy", ""): v for k, v in state.items() if ".policy." in k}
    assert adapter.keys() == policy.keys() and any("lora_B" in k for k in adapter)
    assert min(v.abs().max() for k, v in adapter.items() if "lora_B" in k) > 0  # zero-initialised: trained
    for name, weight in policy.items():
        assert torch.equal(adapter[name], weight), name
    # both exports reload with plain transformers / peft and agree: base + adapter == merged
    sft = stages / names[1] / "merged"
    with_adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(sft), run / "export" / "adapter")
    merged = AutoModelForCausalLM.from_pretrained(run / "export" / "merged")
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, with_adapter(ids).logits, atol=1e-5, rtol=0)


def test_sft_lora_under_cpu_fsdp1_with_torchrun(tmp_path):
    """FSDP1 (``fsdp_cpu``: the ``fsdp`` wrapping on CPU): the parameters are unsharded for the export; the adapter
    export equals the last sharded checkpoint's trained adapter."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    run = tmp_path / "run"
    _torchrun(tmp_path, "recipe=sft_lora", "strategy=fsdp_cpu", f"hydra.run.dir={run}", "trainer.max_steps=3",
              "data.batch_size=8")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["adapter"] == str(run / "adapter")
    # 3 steps, no validation: not run after fit on a sharded module, and the summary says why val/loss is null
    assert summary["val/loss"] is None and summary["validation"].startswith("none ran: the run (3 steps)")
    dcp_to_torch_save(run / "checkpoints" / "last.ckpt", tmp_path / "full.pt")
    state = torch.load(tmp_path / "full.pt", weights_only=True)["model"]
    adapter = load_file(run / "adapter" / "adapter_model.safetensors")
    policy = {k.removeprefix("model.").replace(".policy", ""): v for k, v in state.items() if ".policy." in k}
    assert adapter.keys() == policy.keys() and any("lora_B" in k for k in adapter)
    assert min(v.abs().max() for k, v in adapter.items() if "lora_B" in k) > 0  # zero-initialised: trained
    for name, weight in policy.items():
        assert torch.equal(adapter[name], weight), name
    assert not _leftovers(tmp_path)


def test_rm_under_ddp_with_lightnings_launcher(tmp_path):
    """``python train.py trainer.devices=2``: Lightning starts rank 1 at the first fit (the needed sft stage),
    re-running train.py with the same run folder."""
    run = tmp_path / "run"
    out = _launch([sys.executable, "train.py", "recipe=rm", "strategy=ddp", "trainer.devices=2", "logger=none",
                   f"hydra.run.dir={run}", "trainer.max_steps=3", "data.batch_size=8",
                   'stage_overrides.sft=["trainer.max_steps=3","data.batch_size=8"]', *WORLD], tmp_path / "cache")
    assert out.count("building the `sft` stage") == 1 and out.count("== lrlhf rm: done ==") == 1
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stage"] == "rm" and 0.0 <= summary["test/accuracy"] <= 1.0
    assert (run / "model" / "reward_calibration.json").is_file()
    assert [p.name.split("-")[0] for p in (tmp_path / "cache" / "stages").iterdir()] == ["sft"]
    assert not _leftovers(tmp_path)


# --------------------------------------------------------------------------------------- in one process
@pytest.mark.parametrize(("env", "zero"), [
    ({}, True), ({"RANK": "0", "LOCAL_RANK": "0"}, True), ({"RANK": "1", "LOCAL_RANK": "1"}, False),
    ({"LOCAL_RANK": "1"}, False), ({"NODE_RANK": "1"}, False), ({"NODE_RANK": "0", "LOCAL_RANK": "0"}, True),
    ({"SLURM_PROCID": "0"}, True), ({"SLURM_PROCID": "3"}, False),
    ({"SLURM_PROCID": "0", "LOCAL_RANK": "1"}, False),  # Lightning's child inside a one-task SLURM job
])
def test_global_rank_zero_before_a_process_group_exists(env, zero, monkeypatch):
    for key in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID", "WORLD_SIZE", "SLURM_NTASKS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert distributed.is_global_zero() is zero


def test_several_launched_processes_need_one_run_folder(monkeypatch):
    hydra_cfg = SimpleNamespace(overrides=SimpleNamespace(hydra=[]), mode=RunMode.RUN)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="2 processes were launched .* hydra.run.dir="):
        planning.check_shared_run_dir(hydra_cfg)
    hydra_cfg.overrides.hydra = ["hydra.run.dir=/somewhere"]
    planning.check_shared_run_dir(hydra_cfg)
    monkeypatch.setenv("WORLD_SIZE", "1")
    planning.check_shared_run_dir(SimpleNamespace(overrides=SimpleNamespace(hydra=[]), mode=RunMode.RUN))


def test_needed_stages_share_the_devices_and_strategy_but_not_the_length():
    overrides = ["strategy=fsdp2", "trainer=gpu", "trainer.devices=8", "trainer.num_nodes=2", "trainer.max_steps=3",
                 "trainer.strategy.reshard_after_forward=false", "data.batch_size=8", "seed=3"]
    assert planning._shared_overrides(overrides) == [
        "strategy=fsdp2", "trainer=gpu", "trainer.devices=8", "trainer.num_nodes=2",
        "trainer.strategy.reshard_after_forward=false", "seed=3"]


def test_the_building_folder_is_named_alike_by_every_rank_and_apart_by_launches(tmp_path):
    target = tmp_path / "stages" / "sft-123"
    a = planning._building_folder(target, tmp_path / "run")
    assert a == planning._building_folder(target, tmp_path / "run" / ".." / "run") and a.parent == target.parent
    assert a != planning._building_folder(target, tmp_path / "other") and a.name.startswith(".sft-123.")


def test_a_build_whose_process_is_gone_is_removed_and_a_live_or_unknown_one_kept(tmp_path):
    """#20 item 8: a launch killed while building a stage left ``.<stage>.<key>.building`` in the cache forever."""
    target = tmp_path / "stages" / "sft-123"
    dead, live, unknown = (planning._building_folder(target, tmp_path / name) for name in ("a", "b", "c"))
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a pid that existed and is gone
    for folder, pid in ((dead, child.pid), (live, os.getpid())):
        planning.start_build(folder)
        (folder / planning.OWNER_FILE).write_text(f"{socket.gethostname()}:{pid}\n")
        (folder / "checkpoints").mkdir()
    unknown.mkdir()  # no owner recorded: never removed on a guess
    assert planning.remove_dead_builds([target]) == [dead]
    assert not dead.exists() and live.is_dir() and unknown.is_dir()


def test_other_ranks_plan_without_writing_as_rank_0_would_after_its_repair(tmp_path):
    """A swap interrupted between its renames leaves only ``.<stage>.old``: rank 0 moves it back (recover), the
    other ranks only read and must reach the same plan (the stage is done)."""
    target = tmp_path / "stages" / "sft-1"
    old = target.with_name(".sft-1.old")
    old.mkdir(parents=True)
    assert not planning._stage_done(target)  # no summary: not finished
    (old / "summary.json").write_text("{}")
    assert planning._stage_done(target) and not target.exists()  # read-only
    planning.recover_folder(target)
    assert planning._stage_done(target) and (target / "summary.json").is_file() and not old.exists()
