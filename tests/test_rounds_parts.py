"""The pure parts of iterative RLHF's loop (lrlhf.run.rounds, lrlhf.eval.round_figures), without training: the settings'
checks, the prompt pool, the on-policy pairs and their budget, replay, pairwise accuracy and the start checks."""

import json

import pytest
from omegaconf import OmegaConf

from lrlhf.data.toy import WorldSizes, build_world
from lrlhf.eval.round_figures import pair_accuracy
from lrlhf.models.generation import SamplingConfig
from lrlhf.run.rounds import Rounds, check_start, on_policy_pairs, prompt_pool, replayed


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    sizes = WorldSizes(sft_train=4, sft_val=2, pref_train=20, pref_val=2, pref_test=2, rl=4, eval=6)
    return build_world(tmp_path_factory.mktemp("toy"), seed=0, sizes=sizes)


def _cfg(world, **settings):
    return OmegaConf.create({
        "rounds": {"settings": {"_target_": "lrlhf.run.rounds.Rounds", **settings}}, "trainer": {"devices": 1},
        "hparams": {"rm": {"lora": None}}, "world": {"dir": str(world.root)},
        "eval": {"prompts": str(world.eval_prompts)}, "ckpt_path": None})


@pytest.mark.parametrize(("settings", "message"), [
    ({"samples_per_prompt": 2, "pairs_per_prompt": 2}, "pairs_per_prompt=2: 2 samples per prompt .* at most 1"),
    ({"n": 2, "ppo_steps": [4, 4, 4]}, r"ppo_steps must be one number >= 1 or 2 of them"),
    ({"replay": 1.5}, r"rounds.settings.replay must be in \[0, 1\]"),
    ({"rm_init": "last"}, "rounds.settings.rm_init must be one of"),
])
def test_bad_settings_name_their_key(settings, message):
    with pytest.raises(ValueError, match=message):
        Rounds(**settings)
    assert Rounds(n=3, ppo_steps=[1, 2, 3]).steps(2) == 2 and Rounds(ppo_steps=5).steps(2) == 5


def test_the_prompt_pool_leaves_out_the_initial_prompts_and_refuses_a_held_out_one(world, tmp_path):
    lines = [json.loads(line) for line in world.pref_train.read_text().splitlines()]
    initial, fresh = prompt_pool(world.pref_train, 10, world.eval_prompts)
    assert initial == lines[:10]
    used = {json.dumps(r["prompt"], sort_keys=True) for r in initial}
    keys = [json.dumps(p.prompt, sort_keys=True) for p in fresh]
    assert len(keys) == len(set(keys)) and not set(keys) & used  # each once, none of round 1's
    later = [json.dumps(r["prompt"], sort_keys=True) for r in lines[10:]]
    assert keys == list(dict.fromkeys(k for k in later if k not in used))
    assert all(set(p.meta) == {"task"} for p in fresh)  # a pair's own fields (both_bad) are not the prompt's
    leaky = tmp_path / "eval_prompts.jsonl"
    leaky.write_text(json.dumps({"prompt": lines[-1]["prompt"], "task": lines[-1]["task"]}) + "\n")
    with pytest.raises(ValueError, match="a preference prompt is also in .*eval_prompts.jsonl"):
        prompt_pool(world.pref_train, 10, leaky)


def test_on_policy_pairs_meet_the_budget_with_distinct_responses(world, monkeypatch):
    _, fresh = prompt_pool(world.pref_train, 10, world.eval_prompts)
    calls = []

    def fake_generate(model, tokenizer, prompts, sampling, batch_size=64, max_prompt_length=1024):
        calls.append(len(prompts))
        # per prompt of 4 samples: the first prompt of a block all alike (no pair), the others 3 distinct texts
        return [("same" if i // 4 % 2 == 0 else f"text {i % 3}") for i in range(len(prompts))]

    monkeypatch.setattr("lrlhf.models.generation.generate_responses", fake_generate)
    sizes = {"samples_per_prompt": 4, "pairs_per_prompt": 2, "budget": 5, "seed": "s"}
    pairs, used = on_policy_pairs(None, None, fresh, SamplingConfig(seed=1), **sizes)
    assert len(pairs) == 5 and all(p.a != p.b for p in pairs)
    # blocks of ceil(5 / 2) = 3 prompts; the even prompts give no pair, so the third block is needed (to prompt 7)
    assert used == 8 and calls == [12, 12, 12]
    assert [p.prompt.prompt for p in pairs] == [fresh[i].prompt for i in (1, 1, 4, 4, 7)]
    few, used = on_policy_pairs(None, None, fresh[:2], SamplingConfig(seed=1), **sizes)
    assert len(few) == 2 and used == 2  # the prompts ran out: fewer than the budget


def test_replay_keeps_a_seeded_subset_in_order():
    lines = [{"i": i} for i in range(10)]
    kept = replayed(lines, 0.5, "s")
    assert len(kept) == 5 and kept == sorted(kept, key=lambda r: r["i"]) and kept == replayed(lines, 0.5, "s")
    assert replayed(lines, 1.0, "s") == lines and replayed(lines, 0.0, "s") == []


def test_pair_accuracy_leaves_out_the_pairs_the_judge_ties():
    acc = pair_accuracy([1.0, 0.0, 2.0, 5.0], [0.0, 1.0, 1.0, 5.0], [0.9, 0.9, 0.1, 0.3], [0.1, 0.1, 0.5, 0.3])
    assert acc["pairs"] == 3 and acc["accuracy"] == pytest.approx(1 / 3)


def test_start_checks_name_the_key(world, tmp_path, monkeypatch):
    run = tmp_path / "run"
    initial, fresh, per_round = check_start(_cfg(world, initial_labels=10, labels_per_round=4, pairs_per_prompt=2), run)
    assert len(initial) == 10 and per_round == 2 and fresh
    with pytest.raises(ValueError, match="need 2000, but pref_train has"):
        check_start(_cfg(world, initial_labels=10, n=2, labels_per_round=4000, pairs_per_prompt=2), run)
    lora = _cfg(world, reference="previous")
    lora.hparams.rm.lora = {"r": 4}
    with pytest.raises(ValueError, match="rounds.settings.reference=previous needs a fully fine-tuned reward model"):
        check_start(lora, run)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="runs on one process .*WORLD_SIZE=2"):
        check_start(_cfg(world, initial_labels=10), run)
