"""What a user sees and does at the terminal: --help, a quiet console, a clean stop on SIGTERM that resumes."""

import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file
from test_cli import RECIPES, ROOT, _tiny

from lrlhf.utils.console import recipe_description

#: Lines of the issue's noise list (and transformers' per-file bars): none may reach the console.
NOISE = ("Tip:", "litlogger", "litmodels", "LeafSpec", "is_gradient_checkpointing", "val_dataloader",
         "in eval mode at the start of training", "`Trainer.fit` stopped", "Epoch", "/-2", "GPU available: False",
         "Loading weights", "Writing model shards", "gemm_4bit_forward")
#: Runs train.py with DeprecationWarning / FutureWarning raised from our own modules made errors.
STRICT = ("import runpy, sys, warnings\n"
          "for category in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):\n"
          "    warnings.filterwarnings('error', category=category, module=r'lrlhf(\\.|$)')\n"
          "sys.argv[0] = 'train.py'\n"
          "runpy.run_path('train.py', run_name='__main__')\n")


def _env(cache):
    return {**os.environ, "LRLHF_CACHE_DIR": str(cache), "WANDB_MODE": "offline",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}


def _run(cache, *args, check=True):
    out = subprocess.run([sys.executable, "-c", STRICT, *args], cwd=ROOT, env=_env(cache), capture_output=True,
                         text=True, timeout=600)
    if check:
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One cache for the module: the tiny world, SFT and RM stages are built once."""
    return tmp_path_factory.mktemp("cache")


def test_help_lists_each_recipe_with_its_description_and_the_groups():
    out = subprocess.run([sys.executable, "train.py", "--help"], cwd=ROOT, env=_env(ROOT / "unused"),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for recipe in RECIPES:
        description = recipe_description(ROOT / "recipes" / f"{recipe}.yaml")
        assert description and "\n" not in description
        assert re.search(rf"^  {recipe} +{re.escape(description)}$", out.stdout, flags=re.M), recipe
    assert recipe_description(ROOT / "recipes" / "sft_lora.yaml") == (
        "Supervised fine-tuning with a LoRA adapter, merged into the model at export")
    for recipe in RECIPES:  # #36: written for users, one line, brackets closed (rm_ensemble's was not)
        description = recipe_description(ROOT / "recipes" / f"{recipe}.yaml")
        assert len(description) <= 100 and description.count("(") == description.count(")"), recipe
    assert "Your own data: world=files world.preferences=<file>" in out.stdout and "docs/real_data.md" in out.stdout
    assert "model.name_or_path=<hub id or local folder>" in out.stdout and "hparams.ppo.max_steps" in out.stdout
    assert "logger: csv, none, wandb" in out.stdout and "--verbose" in out.stdout


PROBE = """
import logging, sys, warnings
from lrlhf.utils import console
console.setup_console(verbose=sys.argv[1] == "1", wandb_offline=True)
logging.basicConfig(stream=sys.stdout, format="%(message)s", level=logging.INFO)
for message, category, module in [
    ("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning, "lightning.pytorch.utilities._pytree"),
    ("`is_gradient_checkpointing` is deprecated, use ...", FutureWarning, "transformers.modeling_utils"),
    ("You passed in a `val_dataloader` but have no `validation_step`.", UserWarning,
     "lightning.pytorch.trainer.configuration_validator"),
    ("Found 36 module(s) in eval mode at the start of training.", UserWarning, "lightning.pytorch.loops.fit_loop"),
    ("KEEP1 `is_gradient_checkpointing` is deprecated", FutureWarning, "transformers.modeling_utils"),
    ("`isinstance(treespec, LeafSpec)` is deprecated KEEP2", FutureWarning, "mypackage.pytree"),
]:
    warnings.warn_explicit(message, category, "x.py", 1, module=module, registry={})
warnings.warn_explicit("KEEP3 ours", UserWarning, console.__file__, 1, module="lrlhf.utils.console", registry={})
rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
for line in ("💡 Tip: try installing litlogger", "`Trainer.fit` stopped: `max_steps=3` reached.",
             "GPU available: False, used: False", "TPU available: False, using: 0 TPU cores",
             "KEEP4 held-out eval 0", "GPU available: True (cuda), used: True KEEP5"):
    rank_zero.info(line)
logging.getLogger("bitsandbytes.backends.cpu.ops").warning("Failed to load CPU gemm_4bit_forward from ...")
print("HF bars off:", __import__("os").environ.get("HF_HUB_DISABLE_PROGRESS_BARS"))
"""


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
def test_noise_is_dropped_by_message_and_module_unless_verbose(verbose):
    env = {k: v for k, v in _env(ROOT / "unused").items() if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "LRLHF_VERBOSE")}
    out = subprocess.run([sys.executable, "-c", PROBE, str(int(verbose))], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    assert all(f"KEEP{i}" in text for i in range(1, 6)), text  # another message, module or value stays
    rest = "\n".join(line for line in text.splitlines() if "KEEP" not in line)
    seen = [n for n in NOISE[:-3] + ("TPU available: False", "gemm_4bit_forward") if n in rest]
    if verbose:
        assert len(seen) == 10 and "HF bars off: None" in out.stdout and "console.py:1: UserWarning: KEEP3" in text
    else:
        assert seen == [] and "HF bars off: 1" in out.stdout
        assert "warning: KEEP3 ours" in text  # ours: the message alone


@pytest.mark.slow
def test_the_main_command_console_has_no_noise_and_no_warning_of_ours(cache, tmp_path):
    """recipe=ppo_lora as the README runs it (W&B logger, offline without a key), tiny."""
    out = _run(cache, "recipe=ppo_lora", f"hydra.run.dir={tmp_path / 'run'}", *_tiny("ppo_lora"),
               "callbacks.early_stopping.every_n_rollouts=1")  # tiny: 2 rollouts; the full run measures every 10
    text = out.stdout + out.stderr
    assert [n for n in NOISE if n in text] == [], text
    # issue #50: Lightning's validation bars printed a line per redraw into a pipe (the SFT and RM stages)
    assert "Validation DataLoader" not in text and "Validation:" not in text, text
    assert not re.search(r"^warning: |src/lrlhf/\S+\.py:\d+: \w*Warning", text, flags=re.M), text
    for stage, unit, n in (("sft", "step", 3), ("rm", "step", 3), ("ppo", "rollout", 2)):
        assert f"{stage} {unit} {n}/{n} |" in out.stdout, out.stdout
    assert "held-out gold utility: SFT" in out.stdout
    story = re.findall(r"^\[(\d+)/(\d+)\] (.*)$", out.stdout, flags=re.M)  # our numbered story, in order
    assert [int(i) for i, _, _ in story] == list(range(1, len(story) + 1)) and story[-1][0] == story[-1][1]
    assert story[-1][2].startswith("the `ppo` stage") and "the `sft` stage" in story[-3][2], story


@pytest.mark.slow
def test_sigterm_stops_a_running_ppo_run_which_resumes_to_the_uninterrupted_result(cache, tmp_path):
    common = ["recipe=ppo_lora", "logger=none", "eval=null", "~callbacks.early_stopping",
              "callbacks.checkpoint.every_n_rollouts=1000",  # the only checkpoint is the stop's
              *[o for o in _tiny("ppo_lora") if not o.startswith(("eval.", "trainer.max_steps"))],
              "trainer.max_steps=24"]  # 12 rollouts of 8 prompts, 2 optimiser steps each; 3 epochs
    _run(cache, *common, f"hydra.run.dir={tmp_path / 'straight'}")

    run = tmp_path / "stopped"
    args = [*common, f"hydra.run.dir={run}"]
    log = (tmp_path / "stdout").open("w+")
    proc = subprocess.Popen([sys.executable, "-c", STRICT, *args], cwd=ROOT, env=_env(cache), stdout=log,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while "ppo rollout 0/12" not in (tmp_path / "stdout").read_text():  # the bar is drawn: training
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
            time.sleep(0.05)
        time.sleep(0.5)  # a rollout or two in
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        _, stderr = proc.communicate(timeout=60)  # a loaded 2-core CI machine took > 10 s for the rollout's end
        took = time.monotonic() - sent
    finally:
        proc.kill()
    stdout = (tmp_path / "stdout").read_text()
    # stopped, not run to its end: a rollout before the 12th, nothing exported (below); the time is a loose guard
    assert proc.returncode == 128 + signal.SIGTERM and took < 60, (proc.returncode, took, stderr[-3000:])
    found = re.search(r"stopped on SIGTERM after rollout (\d+) of the `ppo` stage; checkpoint: (\S+)", stdout)
    assert found, stdout[-3000:] + stderr[-3000:]
    done = int(found.group(1))
    assert 0 < done < 12 and found.group(2) == str(run / "checkpoints" / f"rollout={done:06d}.ckpt")
    assert (run / "checkpoints" / "last.ckpt").resolve().name == f"rollout={done:06d}.ckpt"
    assert not (run / "summary.json").exists()  # stopped: nothing exported
    resume = stdout.splitlines()[-1].strip()
    assert resume == " ".join(["python train.py", *map(shlex.quote, args), "ckpt_path=last"]), resume

    _run(cache, *shlex.split(resume)[2:])  # the printed command, as the user would paste it
    straight = load_file(tmp_path / "straight" / "export" / "adapter" / "adapter_model.safetensors")
    resumed = load_file(run / "export" / "adapter" / "adapter_model.safetensors")
    assert straight.keys() == resumed.keys() and all((straight[k] == resumed[k]).all() for k in straight)


def test_a_ppo_kind_stage_is_named_by_its_method():
    """Issue #49: recipe=grpo_lora said "the `ppo` stage" (its stage kind) in its story and its stop message."""
    from omegaconf import OmegaConf

    from lrlhf.run.training import stage_label

    def cfg(stage, target=None):
        return OmegaConf.create({"stage": stage, "module": {"advantage": {"_target_": target} if target else None}})

    assert [stage_label(cfg("ppo", f"lrlhf.modules.advantages.{name}")) for name in ("GAE", "RLOO", "GRPO")] == [
        "ppo", "rloo", "grpo"]
    assert stage_label(cfg("ppo", "my_pkg.MyEstimator")) == "MyEstimator"
    assert stage_label(cfg("sft")) == "sft" and stage_label(cfg("ppo")) == "ppo"
