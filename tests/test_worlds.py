"""Real-data worlds (#15): ``world=hh_rlhf`` / ``world=files`` built into the file layout every recipe reads, with a
held-out judge; planning refuses the toy model and toy gold for them; the whole pipeline through train.py."""

import csv
import gzip
import json
import os
from pathlib import Path

import pytest
import torch
from test_cli import _train
from test_planning import _error_lines

from lrlhf.data.formats import load_records
from lrlhf.data.splits import normalise_prompt, prompt_of
from lrlhf.data.worlds import LAYOUT, FilesWorld

SHARED_HH = Path(__file__).resolve().parents[2] / "shared" / "data" / "hh-rlhf" / "harmless-base" / "test.jsonl.gz"


def _hh_file(path: Path, n: int = 120) -> Path:
    """An HH-format file (``\\n\\nHuman:`` / ``\\n\\nAssistant:`` transcripts), some multi-turn."""
    rows = []
    for i in range(n):
        head = f"\n\nHuman: question {i} about topic {i % 7}?"
        if i % 3 == 0:
            head += f"\n\nAssistant: Which part of topic {i % 7}?\n\nHuman: the part number {i}."
        rows.append({"chosen": f"{head}\n\nAssistant: a careful answer number {i}.",
                     "rejected": f"{head}\n\nAssistant: no{'!' * (i % 4)}"})
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    return path


def _prompts(path: Path) -> set[str]:
    kind = "sft" if path.name.startswith("sft_") else "prompt" if path.name.endswith("prompts.jsonl") else "preference"
    records, _ = load_records(str(path), kind, verbose=False)
    return {normalise_prompt(prompt_of(r)) for r in records}


def test_a_files_world_splits_by_prompt_and_holds_out_eval_and_judge_prompts(tmp_path):
    source = _hh_file(tmp_path / "hh.jsonl.gz")
    world = FilesWorld(preferences=str(source), name="hh_rlhf", limits={"pref_test": 5})
    world.build(tmp_path / "w")
    files = {name: tmp_path / "w" / f"{name}.jsonl" for name in LAYOUT}
    prompts = {name: _prompts(path) for name, path in files.items()}
    assert all(prompts.values()), {k: len(v) for k, v in prompts.items()}
    report = json.loads((tmp_path / "w" / "world.json").read_text())
    assert report["files"]["pref_test"] == 5 == sum(1 for _ in files["pref_test"].open())
    assert sum(report["files"][n] for n in ("pref_train", "pref_val", "judge_train", "judge_val")) + \
        report["files"]["eval_prompts"] <= 120
    # no prompt crosses the preference splits; eval prompts are in no other file; the judge's in no proxy file
    for held_out in ("eval_prompts", "judge_train", "judge_val"):
        for other in set(LAYOUT) - {held_out, "judge_train", "judge_val", "eval_prompts"}:
            assert not prompts[held_out] & prompts[other], (held_out, other)
    assert not prompts["eval_prompts"] & (prompts["judge_train"] | prompts["judge_val"])
    # the SFT data are the training prompts with their chosen answers; RL prompts are the training prompts
    assert prompts["sft_train"] == prompts["pref_train"] == prompts["rl_prompts"]
    sft, _ = load_records(str(files["sft_train"]), "sft", verbose=False)
    pairs, _ = load_records(str(files["pref_train"]), "preference", verbose=False)
    assert [s.messages for s in sft] == [[*p.prompt, *p.chosen] for p in pairs]
    # normalised against the source: the multi-turn HH transcript of question 0 (if it landed in pref_train)
    first = next((p for p in pairs if "question 0 " in p.prompt[0]["content"]), None)
    if first is not None:
        assert first.prompt == [{"role": "user", "content": "question 0 about topic 0?"},
                                {"role": "assistant", "content": "Which part of topic 0?"},
                                {"role": "user", "content": "the part number 0."}]
        assert first.chosen == [{"role": "assistant", "content": "a careful answer number 0."}]


def test_a_world_key_follows_its_file_and_settings(tmp_path):
    source = _hh_file(tmp_path / "hh.jsonl.gz")
    key = FilesWorld(preferences=str(source)).key()
    assert FilesWorld(preferences=str(source), judge="rm:/elsewhere").key() == key  # the judge is not data
    assert FilesWorld(preferences=str(source), limits={"pref_train": 4}).key() != key
    os.utime(source, ns=(1, 1))
    assert FilesWorld(preferences=str(source)).key() == key  # touched (copied, checked out again): the same data
    copy = tmp_path / "elsewhere" / "hh.jsonl.gz"
    copy.parent.mkdir()
    copy.write_bytes(source.read_bytes())
    assert FilesWorld(preferences=str(copy)).key() != key  # another path in the settings
    data = bytearray(source.read_bytes())
    data[-1] ^= 1
    source.write_bytes(bytes(data))  # edited in place, the same size
    assert FilesWorld(preferences=str(source)).key() != key  # the file's content changed


def test_world_settings_are_checked_naming_the_key():
    with pytest.raises(ValueError, match=r"world.fractions must be shares >= 0 summing to 1"):
        FilesWorld(preferences="x.jsonl", fractions={"pref_train": 0.5})
    with pytest.raises(ValueError, match=r"world.fractions: unknown split\(s\) \['train'\]"):
        FilesWorld(preferences="x.jsonl", fractions={"train": 1.0})
    with pytest.raises(ValueError, match=r"world.limits: \{'pref_train': 0\}"):
        FilesWorld(preferences="x.jsonl", limits={"pref_train": 0})


@pytest.mark.skipif(not SHARED_HH.is_file(), reason="../shared/data (HH-RLHF harmless-base test) is absent")
def test_the_hh_rlhf_harmless_split_builds(tmp_path):
    FilesWorld(preferences=str(SHARED_HH), name="hh_rlhf").build(tmp_path / "w")
    files = json.loads((tmp_path / "w" / "world.json").read_text())
    assert files["sources"]["preferences"]["read"] == 2312
    assert files["sources"]["preferences"]["dropped/no_shared_prefix"] == 5
    assert files["files"]["pref_train"] + files["files"]["pref_val"] + files["files"]["pref_test"] + \
        files["files"]["judge_train"] + files["files"]["judge_val"] + files["files"]["eval_prompts"] <= 2307


# ------------------------------------------------------------------------------------------------- planning
def test_planning_refuses_the_toy_model_and_toy_gold_on_a_world_without_gold(tmp_path):
    source = _hh_file(tmp_path / "hh.jsonl.gz")
    world = ["world=files", f"world.preferences={source}", "logger=none", f"hydra.run.dir={tmp_path / 'run'}"]
    out = _train(tmp_path, "recipe=ppo_lora", *world, check=False)  # model=toy, the default
    assert out.returncode == 1
    assert _error_lines(out)[0] == (
        "lrlhf: error: model=toy is the toy world's tiny model, and world=files has none: name a model, e.g. "
        "model=smollm2 or model=hf model.name_or_path=<hub id or folder>"), out.stderr
    out = _train(tmp_path, "recipe=ppo_lora", *world, "model=hf", "model.name_or_path=gpt2", "eval.judge=toy_gold",
                 check=False)
    assert _error_lines(out)[0].startswith(
        "lrlhf: error: eval.judge=toy_gold: world=files has no gold utility (only the toy world does)"), out.stderr
    out = _train(tmp_path, "recipe=ppo_lora", *world, "model=hf", "model.name_or_path=gpt2", "reward=gold",
                 check=False)
    assert _error_lines(out)[0].startswith(
        "lrlhf: error: reward=gold is the toy world's verifier (its sort and count requests), and world=files has no "
        "gold utility"), out.stderr
    out = _train(tmp_path, "recipe=sft", *world[:1], f"world.preferences={tmp_path / 'nope.jsonl'}", *world[2:],
                 "model=hf", "model.name_or_path=gpt2", check=False)
    assert _error_lines(out)[0] == (
        f"lrlhf: error: world.preferences={str(tmp_path / 'nope.jsonl')!r}: no such file"), out.stderr
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("summary.json"))


def test_building_a_reward_model_judge_leaves_the_rng_alone(tmp_path):
    # issue #15: adding a judge changed the training rollouts (building it consumed the sampling RNG)
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from lrlhf.data.toy import build_tokenizer
    from lrlhf.eval.judges import resolve_judge
    from lrlhf.models.heads import ScalarModel
    from lrlhf.models.reward import HEAD_FILE

    tokenizer = build_tokenizer()
    backbone = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
    model = ScalarModel(backbone)
    backbone.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    save_file(model.head.state_dict(), tmp_path / "rm" / HEAD_FILE)
    torch.manual_seed(7)
    before = torch.get_rng_state()
    resolve_judge(f"rm:{tmp_path / 'rm'}")
    assert torch.equal(torch.get_rng_state(), before)


# ------------------------------------------------------------------------------------------- the pipeline
LIMITS = ["world.limits.pref_train=24", "world.limits.pref_val=6", "world.limits.pref_test=12",
          "world.limits.judge_train=24", "world.limits.judge_val=6", "world.limits.eval_prompts=6",
          "world.limits.rl_prompts=16", "world.limits.sft_train=24", "world.limits.sft_val=6"]
SHORT = ['stage_overrides.sft=["trainer.max_steps=2","data.batch_size=4"]',
         'stage_overrides.rm=["trainer.max_steps=2","data.batch_size=4"]',
         'stage_overrides.judge=["trainer.max_steps=2","data.batch_size=4"]',
         "trainer.max_steps=4", "module.config.max_new_tokens=8", "data.batch_size=8", "module.config.minibatch_size=4",
         "eval.n_samples=2", "eval.max_new_tokens=8", "callbacks.early_stopping.every_n_rollouts=1"]


@pytest.mark.slow
def test_ppo_on_an_hh_world_with_a_real_tokenizer_runs_every_stage_and_reports_the_judge(tmp_path, tiny_real_model):
    source = _hh_file(tmp_path / "hh.jsonl.gz", n=200)
    out = _train(tmp_path, "recipe=ppo_lora", "world=hh_rlhf", f"world.preferences={source}", "model=hf",
                 f"model.name_or_path={tiny_real_model}", "hparams=smollm2", "logger=csv",
                 f"hydra.run.dir={tmp_path / 'run'}", *LIMITS, *SHORT)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert not [k for k in summary if k.startswith("gold/")]  # no toy gold for a world without it
    lo, hi = summary["judge/ppo_win_rate_interval"]
    assert 0.0 <= lo <= summary["judge/ppo_win_rate"] <= hi <= 1.0
    assert "held-out judge score: SFT" in out.stdout and "PPO win rate against SFT" in out.stdout
    stages = {p.name.split("-")[0]: p for p in (tmp_path / "cache" / "stages").iterdir()}
    assert sorted(stages) == ["judge_rm", "rm", "sft_lora"]  # hparams=smollm2: LoRA SFT
    assert (stages["sft_lora"] / "merged" / "model.safetensors").is_file()
    for name in ("rm", "judge_rm"):
        assert (stages[name] / "model" / "config.json").is_file(), name
    judge = json.loads((stages["judge_rm"] / "summary.json").read_text())
    assert 0.0 <= judge["test/accuracy"] <= 1.0 and {"test/accuracy_interval", "test/longer_wins"} <= judge.keys()
    # the verdict says what the judge can see: its own held-out accuracy, next to the win rate
    assert summary["judge/accuracy"] == judge["test/pair_accuracy"]
    assert summary["judge/longer_wins"] == judge["test/longer_wins"] and summary["judge/pairs"] == judge["test/pairs"]
    assert f"the judge's own held-out pairwise accuracy: {judge['test/pair_accuracy']:.3f}" in out.stdout
    # the early stopping judge is the judge stage's model, and the data report is in summary.json
    config = (tmp_path / "run" / ".hydra" / "config.yaml").read_text()
    assert "judge_rm" in config
    assert summary["data"]["train"]["records"] == 16
    assert (tmp_path / "run" / "export" / "merged" / "config.json").is_file()
    # hparams=smollm2 (a LoRA RM): the reward role is the RM's adapter on the policy's own base (#15 item 5)
    assert "_target_: lrlhf.modules.RewardAdapter" in config
    # the sample table: PPO's calibrated reward, the judge RM's score, the KL (#15 item 5)
    [table] = (tmp_path / "run").rglob("samples.csv")
    rows = list(csv.DictReader(table.open()))
    assert rows and all(r["reward"] and r["judge"] and r["kl"] for r in rows)


def _tree_rankings(path: Path, trees: int = 60) -> Path:
    """OpenAssistant-style rankings: per tree a root question and a follow-up whose prompt quotes the root's best
    answer (as a conversation tree's later turn does), each with the tree's ``group``."""
    rows = []
    for t in range(trees):
        root = f"question {t} about topic {t % 5}?"
        answers = [f"answer {t}.{k}" for k in range(3)]
        rows.append({"prompt": root, "completions": answers, "ranks": [2, 1, 3], "group": f"tree-{t}"})
        follow = [{"role": "user", "content": root}, {"role": "assistant", "content": answers[1]},
                  {"role": "user", "content": f"and then {t}?"}]
        rows.append({"prompt": follow, "completions": [f"then {t}.a", f"then {t}.b"], "ranks": [1, 2],
                     "group": f"tree-{t}"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_world_keeps_each_group_in_one_split_and_counts_them(tmp_path):
    """#36 item 4: the world split by prompt, so a tree's turns crossed splits (11 of 26 OpenAssistant test trees
    were in the RM's training pairs)."""
    world = FilesWorld(preferences=str(_tree_rankings(tmp_path / "ranks.jsonl")), name="files")
    world.build(tmp_path / "w")
    groups = {}
    for name in ("pref_train", "pref_val", "pref_test", "judge_train", "judge_val", "eval_prompts"):
        kind = "prompt" if name == "eval_prompts" else "ranking"
        records, _ = load_records(str(tmp_path / "w" / f"{name}.jsonl"), kind, verbose=False)
        groups[name] = {r.meta["group"] for r in records}
        assert records, name
    names = list(groups)
    crossing = {(a, b): groups[a] & groups[b] for i, a in enumerate(names) for b in names[i + 1:]}
    assert not any(crossing.values()), crossing
    assert sum(len(g) for g in groups.values()) == 60  # every tree somewhere, whole
    report = json.loads((tmp_path / "w" / "world.json").read_text())
    assert {n: report["groups"][n] for n in names} == {n: len(g) for n, g in groups.items()}
    # a record joined to a group by its prompt alone goes with the group (no group field on it)
    from lrlhf.data.records import Ranking
    from lrlhf.data.splits import split_by_prompt

    user = [{"role": "user", "content": "q"}]
    a = [{"role": "assistant", "content": "x"}]
    records = [Ranking(user, [a, a], [1, 2], meta={"group": f"g{i}"}) for i in range(3)]
    records += [Ranking([{"role": "user", "content": f"other {i}"}], [a, a], [1, 2], meta={"group": f"g{i}"})
                for i in range(3)]
    parts = split_by_prompt(records, {"x": 0.5, "y": 0.5}, seed=1)
    assert sorted(len(v) for v in parts.values()) == [0, 6]  # g0..g2 share the prompt q: one component
