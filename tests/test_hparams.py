"""The scale files (configs/hparams/): what a choice on the command line reaches, in the needed stages too."""

import pytest
from test_cli import _compose, _dep_composer

from lrlhf.run import planning

# the overrides the measured world=sentiment runs were launched with (bench/RESULTS.md, "The policy moves")
MEASURED_RM = ["hparams.rm.lr=1e-3", "hparams.rm.max_steps=192", "hparams.rm.val_check_interval=64",
               "hparams.rm.lora.layers=null"]


def _planned(tmp_path, recipe, overrides):
    """The launch's config and the stages it would build first, by recipe name: ``{recipe: (cfg, folder)}``."""
    cfg = _compose([f"recipe={recipe}", f"paths.cache_dir={tmp_path}", "paths.run_dir=.", *overrides])
    todo = planning.plan(cfg, overrides, _dep_composer(tmp_path))
    return cfg, {name: (dep, folder) for name, dep, folder in todo}


def test_smollm2_full_reaches_every_stage_a_ppo_launch_builds(tmp_path):
    base = ["world=toy_tiny", "model=smollm2"]
    ppo, stages = _planned(tmp_path, "ppo_lora", [*base, "hparams=smollm2_full"])
    assert ppo.module.config.policy_lora.layers is None  # every layer
    assert ppo.module.config.lr == pytest.approx(1e-3) and ppo.trainer.max_steps == 160
    # PPO's measured shape: 8 prompts x 4 answers a rollout (bench/RESULTS.md), the lr schedule as long as the run
    assert ppo.data.batch_size == 8 and ppo.module.advantage.samples_per_prompt == 4
    assert ppo.module.config.total_steps == 160
    rm = stages["rm"][0]
    assert rm.module.config.lora.layers is None and rm.module.config.lr == pytest.approx(1e-3)
    assert rm.trainer.max_steps == 192 and rm.trainer.val_check_interval == 64
    assert stages["sft_lora"][0].module.config.lora.layers == 8  # SFT keeps smollm2's last 8 layers

    plain, plain_stages = _planned(tmp_path, "ppo_lora", base)
    assert plain.module.config.policy_lora.layers == 8 and plain.module.config.lr == pytest.approx(5e-5)
    assert plain.data.batch_size == 16 and plain.module.advantage.samples_per_prompt == 1  # one answer a prompt
    assert plain_stages["rm"][0].module.config.lora.layers == 8
    # the same SFT stage, so a cache built with hparams=smollm2 keeps it
    assert plain_stages["sft_lora"][1] == stages["sft_lora"][1]
    assert plain_stages["rm"][1] != stages["rm"][1]
    # and the same RM stage as the measured runs' command-line overrides built
    _, measured = _planned(tmp_path, "ppo_lora", [*base, *MEASURED_RM])
    assert measured["rm"][1] == stages["rm"][1]


def test_a_scale_s_ppo_shape_reaches_every_ppo_stage_and_the_command_line_wins(tmp_path):
    base = ["world=toy_tiny", "model=smollm2", "hparams=smollm2_full"]
    weak, _ = _planned(tmp_path, "ppo_weak_kl", base)
    assert weak.data.batch_size == 8 and weak.module.advantage.samples_per_prompt == 4
    toy, _ = _planned(tmp_path, "ppo_lora", ["world=toy_tiny"])
    assert toy.module.advantage.samples_per_prompt == 1  # a scale without the key: one answer a prompt
    mine, _ = _planned(tmp_path, "ppo_lora", [*base, "module.advantage.samples_per_prompt=2"])
    assert mine.module.advantage.samples_per_prompt == 2
    for group in ("rloo_lora", "grpo_lora"):  # their own groups, and their own 20 rollouts (4 steps each)
        cfg, _ = _planned(tmp_path, group, base)
        assert cfg.module.advantage.samples_per_prompt == 4 and cfg.data.batch_size == 4, group
        assert cfg.trainer.max_steps == 80 and cfg.module.config.total_steps == 80, group
    plain, _ = _planned(tmp_path, "rloo_lora", ["world=toy_tiny", "model=smollm2"])
    assert plain.trainer.max_steps == plain.module.config.total_steps == 40  # a scale without the key: PPO's
    constraints, _ = _planned(tmp_path, "grpo_constraints", ["hparams=smollm2_full"])
    assert constraints.trainer.max_steps == -1  # bounded by its rollouts, not by a scale's step count


def test_smollm2_full_reaches_dpo(tmp_path):
    dpo, _ = _planned(tmp_path, "dpo_lora", ["world=toy_tiny", "model=smollm2", "hparams=smollm2_full"])
    assert dpo.module.config.lora.layers is None and dpo.module.config.lr == pytest.approx(5e-4)
    assert dpo.trainer.max_steps == 88 and dpo.trainer.val_check_interval == 44


def test_an_sft_lora_layers_choice_falls_back_to_the_scale_s_lora_layers():
    for hparams, layers in (("toy", None), ("smollm2", 8), ("hf", None)):
        cfg = _compose(["recipe=sft_lora", f"hparams={hparams}"])
        assert cfg.module.config.lora.layers == layers, hparams
    cfg = _compose(["recipe=sft_lora", "hparams=smollm2", "+hparams.sft_lora.layers=4"])
    assert cfg.module.config.lora.layers == 4
