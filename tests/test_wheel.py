"""The installed package is whole: a wheel built from the checkout, installed outside it, runs a recipe from an
empty folder through the ``lrlhf`` command (configs and recipes are package data), and a user's own config folder
composes over the shipped ones."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from test_cli import TINY, _compose

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_wheel_installed_outside_the_checkout_trains_from_an_empty_folder(tmp_path):
    """Built by setuptools' PEP 517 hook and unpacked into a folder of its own, as an installer does (no pip:
    CI's lowest-versions venv has none); the ``lrlhf`` console script it declares runs from an empty folder."""
    source, target, empty = tmp_path / "checkout", tmp_path / "site", tmp_path / "empty"
    # a copy of what the wheel is built from: setuptools builds in the source tree (build/, stale files kept there)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    build = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    name = subprocess.run([sys.executable, "-c", build, str(tmp_path / "dist")], cwd=source, check=True,
                          capture_output=True, text=True, timeout=300).stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(tmp_path / "dist" / name) as wheel:
        wheel.extractall(target)
    assert (target / "lrlhf" / "conf" / "recipes" / "ppo_lora.yaml").is_file()  # the configuration is package data
    empty.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target), "LRLHF_CACHE_DIR": str(tmp_path / "cache"),
           "WANDB_MODE": "offline"}
    # the console script as an installer writes it: the wheel's own entry point, loaded and called
    script = ("import sys; from importlib.metadata import distribution; import lrlhf; print(lrlhf.__file__); "
              "dist = distribution('lrlhf'); print(dist._path); "
              "(ep,) = [e for e in dist.entry_points if e.group == 'console_scripts' and e.name == 'lrlhf']; "
              "sys.argv[0] = 'lrlhf'; sys.exit(ep.load()())")
    out = subprocess.run([sys.executable, "-c", script, "train", "recipe=ppo_lora", *TINY, "hydra.run.dir=run"],
                         cwd=empty, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    package, dist_info = out.stdout.splitlines()[:2]
    # the unpacked wheel, not the checkout, is what ran (PYTHONPATH comes before an editable install's path)
    assert Path(package).is_relative_to(target) and Path(dist_info).is_relative_to(target), (package, dist_info)
    assert "== lrlhf ppo: done ==" in out.stdout
    summary = json.loads((empty / "run" / "summary.json").read_text())
    assert summary["stage"] == "ppo" and (empty / "run" / "export" / "merged" / "config.json").is_file()
    assert sorted(p.name for p in empty.iterdir()) == ["run"]  # nothing else written into the user's folder


def test_a_users_config_folder_composes_over_the_shipped_ones(tmp_path):
    """Hydra's search path: a recipe and a config group option of the user's, beside the shipped ones."""
    (tmp_path / "recipe").mkdir()
    (tmp_path / "recipe" / "users_own_sft.yaml").write_text(
        "# @package _global_\n# python train.py recipe=users_own_sft\ndefaults:\n  - /recipe/sft\n  - _self_\n"
        "trainer:\n  max_steps: 7\n")
    (tmp_path / "world").mkdir()
    (tmp_path / "world" / "my_toy.yaml").write_text("defaults:\n  - toy\n  - _self_\nsizes:\n  eval: 5\n")
    cfg = _compose(["recipe=users_own_sft", "world=my_toy", "paths.run_dir=.", f"hydra.searchpath=[file://{tmp_path}]"])
    assert cfg.trainer.max_steps == 7 and cfg.world.sizes.eval == 5
    assert cfg.module._target_ == _compose(["recipe=sft", "paths.run_dir=."]).module._target_


def test_the_command_s_verbs(capsys, monkeypatch):
    from lrlhf.run import cli, verbs

    assert verbs.main([]) == 0
    shown = capsys.readouterr().out
    assert all(f"  {verb} " in shown and how in shown for verb, (_, how) in verbs.VERBS.items())
    assert verbs.main(["frob"]) == 2 and "unknown verb 'frob'" in capsys.readouterr().err
    calls = []
    monkeypatch.setattr(cli, "main", lambda args, prog: calls.append((args, prog)))
    assert verbs.main(["eval", "eval.n_samples=2"]) == 0
    assert verbs.main(["train", "recipe=sft"]) == 0
    assert calls == [(["recipe=eval", "eval.n_samples=2"], "lrlhf eval"), (["recipe=sft"], "lrlhf train")]
    assert verbs.main(["eval", "recipe=ppo_lora"]) == 2 and "lrlhf train recipe=NAME" in capsys.readouterr().err
    from lrlhf.labelling import command as labelling

    monkeypatch.setattr(labelling, "main", lambda argv: calls.append(argv) or 0)
    assert verbs.main(["label", "pairs.jsonl", "--budget", "3"]) == 0
    assert calls[-1] == ["label", "pairs.jsonl", "--budget", "3"]
