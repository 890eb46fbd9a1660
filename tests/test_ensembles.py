"""``recipe=rm_ensemble`` and ``reward=ensemble`` end to end: the members train with their own seeds into one
artefact, PPO optimises the conservative combination and logs the members' disagreement per rollout and on the
held-out samples, and the high-reward audit is written."""

import csv
import json

import pytest
import torch
import yaml
from omegaconf import open_dict
from test_cli import ROOT, _compose, _dep_composer, _tiny, _train

from lrlhf.models import load_reward_model
from lrlhf.models.ensemble import ENSEMBLE_FILE, member_folders
from lrlhf.run import planning


@pytest.mark.slow
def test_an_ensemble_trains_once_and_ppo_optimises_it_conservatively(tmp_path):
    run = tmp_path / "run"
    tiny = [o for o in _tiny("ppo_weak_kl") if not o.startswith("stage_overrides.rm=")]
    _train(tmp_path, "recipe=ppo_weak_kl", "reward=ensemble", "logger=csv", f"hydra.run.dir={run}", *tiny,
           'stage_overrides.rm=["trainer.max_steps=3","ensemble.members=2"]', "module.reward_model.combine.coef=0.5",
           "callbacks.early_stopping.every_n_rollouts=1", "callbacks.audit.every_n_rollouts=1")
    (stage,) = (tmp_path / "cache" / "stages").glob("rm_ensemble-*")
    summary = json.loads((stage / "summary.json").read_text())
    assert summary["members"] == 2 and len(summary["member_test_accuracy"]) == 2
    assert all(0 <= a <= 1 for a in [*summary["member_test_accuracy"], summary["ensemble_test_accuracy_mean"]])
    assert summary["test_disagreement_mean"] > 0 and summary["test_pairs"] > 0
    members = member_folders(stage / "model")
    assert members == [(stage / "members" / f"member_{i}" / "model").resolve() for i in range(2)]
    configs = [yaml.safe_load((m.parent / "config.yaml").read_text()) for m in members]
    assert [(c["seed"], c["data"]["seed"]) for c in configs] == [(0, 0), (1, 1)]  # member i: seed + i, data order too
    assert all(c["logger"] is None and "ensemble" not in c for c in configs)
    heads = [load_reward_model(m).head.linear.weight for m in members]
    assert not torch.equal(heads[0], heads[1])
    assert json.loads((stage / "model" / ENSEMBLE_FILE).read_text())["combine"]["_target_"].endswith("EnsembleMean")

    ppo = json.loads((run / "summary.json").read_text())
    assert ppo["rollouts"] >= 2 and "gold/ppo_minus_sft" in ppo
    config = (run / "config.yaml").read_text()
    assert "_target_: lrlhf.modules.RewardEnsemble" in config and f"path: {stage}/model" in config
    (metrics,) = run.rglob("metrics.csv")
    spread = [float(r["reward/ensemble_std"]) for r in csv.DictReader(metrics.open()) if r.get("reward/ensemble_std")]
    assert len(spread) == ppo["rollouts"] and all(s > 0 for s in spread)
    (history,) = run.rglob("heldout_history.json")
    evaluations = json.loads(history.read_text())["history"]
    assert len(evaluations) >= 2 and all(h["disagreement"] > 0 for h in evaluations)
    audit = (run / "audit.md").read_text()
    assert "## rollout 1 (step" in audit and "| rank | reward | disagreement | length | judge |" in audit


@pytest.mark.parametrize(("override", "message"), [
    ("ensemble.members=1", "ensemble.members must be >= 2"),
    ("ensemble.combine._target_=lrlhf.functional.NoSuchRule", "ensemble"),
    ("ensemble.combine._target_=lrlhf.functional.MeanMinusStd +ensemble.combine.coef=-1", "coef must be >= 0"),
])
def test_bad_ensemble_settings_fail_before_any_stage_is_built(override, message, tmp_path):
    cfg = _compose(["recipe=rm_ensemble", f"paths.cache_dir={tmp_path}", "paths.run_dir=.", *override.split()])

    compose_dep = _dep_composer(tmp_path)
    with pytest.raises(ValueError, match=message):
        planning.plan(cfg, [], compose_dep)
    assert not (tmp_path / "worlds").exists() and not (tmp_path / "stages").exists()


def test_a_stopped_ensemble_resumes_keeping_its_trained_members(tmp_path, monkeypatch):
    """The member loop alone (``fit_stage`` faked): a stop inside member 1 names the ensemble's folder; the resume
    keeps member 0 (same config), continues member 1 from its checkpoint, and retrains a member whose config
    changed."""
    from omegaconf import OmegaConf

    from lrlhf.run import rm_ensemble as ensembles

    monkeypatch.setattr(ensembles, "write_ensemble", lambda *a, **k: None)
    monkeypatch.setattr(ensembles, "ensemble_figures", lambda *a, **k: {})
    monkeypatch.setattr(ensembles, "begin_stage", lambda *a, **k: "")
    cfg = _compose(["recipe=rm_ensemble", f"paths.cache_dir={tmp_path}", "paths.run_dir=.", "ensemble.members=3"])
    with open_dict(cfg):
        cfg.world.dir, cfg.deps = str(tmp_path / "world"), {"sft": str(tmp_path / "sft")}
    out = tmp_path / "ens"
    calls = []

    class Stopped(SystemExit):
        run_dir, resume_key = "member folder", "last"

    def fake_stage(sub, folder, final, stop_at=None):
        calls.append((folder.name, sub.ckpt_path, sub.seed))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.yaml").write_text(OmegaConf.to_yaml(ensembles.member_config(
            cfg, int(folder.name[-1]), final, sub.seed), resolve=True))
        if folder.name == stop_at:
            (folder / "checkpoints").mkdir()
            (folder / "checkpoints" / "last.ckpt").write_text("")
            raise Stopped(0)
        (folder / "summary.json").write_text("{}")

    monkeypatch.setattr(ensembles, "fit_stage", lambda s, f, fi: fake_stage(s, f, fi, stop_at="member_1"))
    with pytest.raises(Stopped) as stop:
        ensembles.run_ensemble(cfg, out, out)
    assert stop.value.run_dir == str(out) and stop.value.resume_key == "last"  # resume the ensemble, not a member
    assert calls == [("member_0", None, 0), ("member_1", None, 1)]
    calls.clear()
    with open_dict(cfg):
        cfg.ckpt_path = "last"
    monkeypatch.setattr(ensembles, "fit_stage", fake_stage)
    ensembles.run_ensemble(cfg, out, out)
    assert calls == [("member_1", "last", 1), ("member_2", None, 2)]  # member 0 kept, member 1 continued
    calls.clear()
    with open_dict(cfg):
        cfg.trainer.max_steps = 7  # another config: every member trains again
    ensembles.run_ensemble(cfg, out, out)
    assert [c[0] for c in calls] == ["member_0", "member_1", "member_2"] and all(c[1] is None for c in calls)


@pytest.mark.parametrize("option", sorted(p.stem for p in (ROOT / "configs" / "module" / "reward_model" /
                                                          "combine").glob("*.yaml")))
def test_every_combination_rule_composes_and_builds(option):
    from hydra.utils import get_class, instantiate

    from lrlhf.functional import EnsembleCombine

    cfg = _compose(["recipe=ppo_weak_kl", "reward=ensemble", "paths.run_dir=.", "+deps={sft:.,rm:.}",
                    f"module/reward_model/combine={option}"])
    planning.validate(cfg)
    node = cfg.module.reward_model.combine
    rule = instantiate(node)
    assert type(rule) is get_class(node._target_) and isinstance(rule, EnsembleCombine)
    assert cfg.needs.rm == "rm_ensemble" and cfg.module.calibration is None
    first_line = (ROOT / "configs" / "module" / "reward_model" / "combine" / f"{option}.yaml").read_text()
    assert first_line.startswith(f"# module/reward_model/combine={option}")


def test_members_on_a_fraction_of_the_prompts_get_their_own_pairs(tmp_path):
    from lrlhf.run.rm_ensemble import write_subset

    rows = [{"prompt": [{"role": "user", "content": f"q{i % 10}"}], "chosen": "a", "rejected": f"b{i}"}
            for i in range(40)]  # 10 prompts, 4 pairs each
    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def kept(seed):
        write_subset(source, tmp_path / f"s{seed}.jsonl", 0.5, seed)
        return [json.loads(line) for line in (tmp_path / f"s{seed}.jsonl").read_text().splitlines()]

    a, b = kept(0), kept(1)
    prompts = {r["prompt"][0]["content"] for r in a}
    assert len(prompts) == 5 and len(a) == 20  # half the prompts, every pair of each
    assert a == [r for r in rows if r["prompt"][0]["content"] in prompts]  # in file order
    assert kept(0) == a and {r["prompt"][0]["content"] for r in b} != prompts  # seeded: same seed, same half
    with pytest.raises(ValueError, match="ensemble.data_fraction < 1 needs data.train to be a local JSONL"):
        write_subset(tmp_path / "nope.parquet", tmp_path / "x.jsonl", 0.5, 0)
