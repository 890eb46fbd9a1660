"""``world=sentiment``: real instructions with a programmatic gold (the sentiment of the answer), the SFT policy's own
sample pairs labelled by simulated annotators on that gold (the ``pairs`` stage), and the whole PPO pipeline through
train.py at a tiny size, the gold measured on held-out prompts no training file holds."""

import csv
import json
import math
import random
from pathlib import Path

import pytest
from test_cli import _compose, _train

from lrlhf.data.formats import PREFERENCE_KINDS, load_records
from lrlhf.data.records import PromptExample
from lrlhf.data.sentiment import (
    SentimentWorld,
    on_topic,
    on_topic_sentiment_gold,
    on_topic_sentiment_reward,
    polarity,
    sentiment_gold,
    topic_words,
)
from lrlhf.data.splits import normalise_prompt, prompt_of
from lrlhf.eval.annotators import Pair, SimulatedAnnotators
from lrlhf.eval.judges import judge_accuracy, resolve_judge
from lrlhf.run.pairs import PairSettings, split_prompts

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
ALPACA = SHARED / "llama-factory" / "alpaca_en_demo.json"
SELF_INSTRUCT = SHARED / "self-instruct" / "seed_tasks.jsonl"
needs_data = pytest.mark.skipif(not ALPACA.is_file(), reason="../shared/data is absent (an outside clone)")
PROMPT = PromptExample([{"role": "user", "content": "Describe your day."}])


def _vader(valences: list[float], alpha: float = 15.0) -> float:
    """VADER's compound by hand (Hutto & Gilbert 2014): the sum of the words' valences, normalised x / sqrt(x^2 + a)."""
    x = sum(valences)
    return x / math.sqrt(x * x + alpha)


# ------------------------------------------------------------------------------------------ the gold by hand
def test_the_gold_is_the_answer_s_sentiment_mapped_to_the_unit_interval():
    assert sentiment_gold(PROMPT, "The meeting is at noon in room four.") == 0.5  # no lexicon word: neutral
    # one lexicon word, its valence in VADER's lexicon ("love" 3.2, "hate" -2.7): the compound, then (c + 1) / 2
    assert sentiment_gold(PROMPT, "I love it") == pytest.approx((_vader([3.2]) + 1) / 2, abs=1e-4)
    assert sentiment_gold(PROMPT, "I hate it") == pytest.approx((_vader([-2.7]) + 1) / 2, abs=1e-4)
    assert polarity("I love it") == pytest.approx(_vader([3.2]), abs=1e-4)
    # what it rewards: more positive words, exclamation marks; a negation turns a word
    assert sentiment_gold(PROMPT, "I love it!!") > sentiment_gold(PROMPT, "I love it") > 0.5
    assert sentiment_gold(PROMPT, "It is not good.") < 0.5 < sentiment_gold(PROMPT, "It is good.")
    assert 0.0 <= sentiment_gold(PROMPT, "awful terrible horrible bad sad " * 20) < 0.01  # saturates inside [0, 1]
    # the response alone: the prompt is never read
    other = PromptExample([{"role": "user", "content": "I hate everything about this awful request."}])
    assert sentiment_gold(other, "I love it") == sentiment_gold(PROMPT, "I love it")


def test_the_gold_is_exact_so_no_judge_accuracy_is_asked_of_it():
    judge = resolve_judge("lrlhf.data.sentiment:sentiment_gold")
    assert judge is sentiment_gold and judge_accuracy(judge) == {}
    assert judge_accuracy(lambda record, text: 0.0) == {"judge/accuracy": None}  # an unknown judge stays unknown


def test_the_on_topic_gold_is_the_sentiment_times_the_share_of_the_prompt_s_topic_words():
    asked = "Describe the planets of the solar system, with three examples."
    # topic words: 4+ letters, lower-cased, cut to 5 letters; short words ("the", "of") and the instruction's own
    # words ("describe", "with", "three", "examples") are not topics
    assert topic_words(asked) == {"plane", "solar", "syste"}
    assert topic_words("Tell me ABOUT cats, dogs and Parrots!") == {"cats", "dogs", "parro"}
    assert on_topic(asked, "Planet Mars orbits; the SOLAR wind...") == pytest.approx(2 / 3)  # stems meet: planet(s)
    assert on_topic(asked, "Jupiter is big.") == 0.0
    assert on_topic("Say hi.", "anything") == 1.0  # a prompt without a topic word asks no topic
    record = PromptExample([{"role": "user", "content": asked}])
    cheerful_elsewhere = "What a wonderful, lovely day! I love it!"
    assert sentiment_gold(record, cheerful_elsewhere) > 0.9
    assert on_topic_sentiment_gold(record, cheerful_elsewhere) == 0.0
    answer = "The planets of our solar system are wonderful!"
    assert on_topic_sentiment_gold(record, answer) == pytest.approx(sentiment_gold(record, answer))  # all 3 topics
    half = "The planets are wonderful!"
    assert on_topic_sentiment_gold(record, half) == pytest.approx(sentiment_gold(record, half) / 3)
    # it reads the prompt (the record's user turns), and the reward form (texts) is the same number
    other = PromptExample([{"role": "user", "content": "Name a wonderful planet."}])
    assert on_topic_sentiment_gold(other, half) == pytest.approx(sentiment_gold(other, half))
    assert on_topic_sentiment_reward(asked, half) == on_topic_sentiment_gold(record, half)
    system = PromptExample([{"role": "system", "content": "You are a cheerful poet."}, *record.prompt])
    assert on_topic_sentiment_gold(system, answer) == on_topic_sentiment_gold(record, answer)  # the user's words
    judge = resolve_judge("lrlhf.data.sentiment:on_topic_sentiment_gold")
    assert judge is on_topic_sentiment_gold and judge_accuracy(judge) == {}


def test_world_sentiment_on_topic_is_world_sentiment_s_folder_with_the_other_gold(monkeypatch):
    from lrlhf.run.planning import world_of

    monkeypatch.setenv("LRLHF_DATA", str(SHARED))
    plain, on_topic_world = (_compose(["recipe=ppo_lora", f"world={w}", "model=smollm2"])
                             for w in ("sentiment", "sentiment_on_topic"))
    assert on_topic_world.world.judge == "lrlhf.data.sentiment:on_topic_sentiment_gold"
    assert on_topic_world.world.gold_reward == "lrlhf.data.sentiment.on_topic_sentiment_reward"
    assert on_topic_world.eval.judge == on_topic_world.world.judge  # the verdict and early stopping read this gold
    assert world_of(plain.world).key() == world_of(on_topic_world.world).key()  # same prompts, same splits


# ------------------------------------------------------------------------------------------ the annotators
def test_simulated_annotators_label_by_any_gold_with_their_noise_and_length_bias():
    pairs = [Pair(PROMPT, "I love it, wonderful!", "It is at noon.")] * 2000
    exact = SimulatedAnnotators(seed=0, gold="lrlhf.data.sentiment:sentiment_gold", temperature=1e-3,
                                length_bias=0.0, tie_band=0.0)
    assert set(exact.label(pairs, 1)) == {1.0}  # no noise: the gold's side
    noisy = SimulatedAnnotators(seed=0, gold=sentiment_gold, temperature=0.5, length_bias=0.0, tie_band=0.0)
    gap = sentiment_gold(PROMPT, pairs[0].a) - 0.5
    share = sum(noisy.label(pairs, 1)) / len(pairs)
    assert abs(share - 1 / (1 + math.exp(-gap / 0.5))) < 0.035  # Bradley-Terry on the gold difference
    longer = [Pair(PROMPT, "It is at noon. " * 6, "It is at noon.")] * 200  # equal golds, 15 words longer
    biased = SimulatedAnnotators(seed=0, gold=sentiment_gold, temperature=1e-3, length_bias=0.1, tie_band=0.0)
    assert set(biased.label(longer, 1)) == {1.0}
    golds_a, golds_b = exact.golds(pairs[:1])
    assert golds_a == [sentiment_gold(PROMPT, pairs[0].a)] and golds_b == [0.5]


# ------------------------------------------------------------------------------------------ the splits
def test_pair_prompts_split_into_disjoint_parts_each_non_empty():
    prompts = [PromptExample([{"role": "user", "content": f"q{i}"}]) for i in range(40)]
    shares = {"pref_train": 0.8, "pref_val": 0.05, "pref_test": 0.15}
    parts = split_prompts(prompts, shares, seed=3)
    assert [len(parts[k]) for k in ("pref_train", "pref_val", "pref_test")] == [32, 2, 6]
    ids = [id(p) for part in parts.values() for p in part]
    assert len(ids) == len(set(ids)) == 40 and parts == split_prompts(prompts, shares, seed=3)
    assert parts != split_prompts(prompts, shares, seed=4)
    assert all(len(split_prompts(prompts[:3], shares, seed=s)["pref_val"]) == 1 for s in range(5))
    with pytest.raises(ValueError, match="2 pair prompts, too few for pairs.shares"):
        split_prompts(prompts[:2], shares, seed=0)
    with pytest.raises(ValueError, match="pairs.samples_per_prompt must be >= 2"):
        PairSettings(samples_per_prompt=1)
    with pytest.raises(ValueError, match="pairs.shares must give"):
        PairSettings(shares={"pref_train": 0.9, "pref_test": 0.1})


@needs_data
def test_the_world_keeps_its_held_out_prompts_out_of_every_other_file(tmp_path):
    world = SentimentWorld(alpaca=str(ALPACA), self_instruct=str(SELF_INSTRUCT), seed=0)
    world.check()
    world.build(tmp_path)
    files = {name: load_records(str(tmp_path / f"{name}.jsonl"), kind, verbose=False)[0] for name, kind in (
        ("eval_prompts", "prompt"), ("sft_val", "sft"), ("sft_train", "sft"), ("rl_prompts", "prompt"),
        ("pair_prompts", "prompt"))}
    keys = {name: {normalise_prompt(prompt_of(r)) for r in records} for name, records in files.items()}
    report = json.loads((tmp_path / "world.json").read_text())
    assert report["prompts"] > 600 and len(keys["eval_prompts"]) == round(0.25 * report["prompts"])
    for name in ("sft_val", "sft_train", "rl_prompts", "pair_prompts"):
        assert not keys["eval_prompts"] & keys[name], name
    assert not keys["sft_val"] & (keys["rl_prompts"] | keys["pair_prompts"])  # early stopping's prompts
    assert keys["rl_prompts"] == keys["pair_prompts"] >= keys["sft_train"]
    with pytest.raises(ValueError, match="world.annotators: .*temperature must be > 0"):
        SentimentWorld(alpaca=str(ALPACA), annotators={"temperature": 0})


# ------------------------------------------------------------------------------------------ end to end
TINY = ["world.limits.rl_prompts=16", "world.limits.sft_train=16", "world.limits.sft_val=4",
        "world.limits.eval_prompts=8", "world.limits.pair_prompts=24", "hparams.sft.max_steps=2",
        "hparams.rm.max_steps=2", "hparams.ppo.max_steps=4", "hparams.ppo.max_new_tokens=8",
        "hparams.ppo.calibration.n_prompts=8", "hparams.eval.max_prompts=8",
        "callbacks.early_stopping.every_n_rollouts=1"]


@pytest.mark.slow
@needs_data
def test_ppo_on_the_sentiment_world_end_to_end(tmp_path, tiny_real_model):
    run = tmp_path / "run"
    out = _train(tmp_path, "recipe=ppo_lora", "world=sentiment", "model=hf", f"model.name_or_path={tiny_real_model}",
                 "hparams=smollm2", "logger=csv", f"hydra.run.dir={run}", *TINY)
    assert "plan: sft_lora 2 steps, pairs, rm 2 steps, then ppo_lora 4 steps" in out.stdout
    stages = tmp_path / "cache" / "stages"
    pairs = next(stages.glob("pairs-*"))
    summary = json.loads((pairs / "summary.json").read_text())
    world = next((tmp_path / "cache" / "worlds").iterdir())
    held_out = {normalise_prompt(prompt_of(r)) for r in
                load_records(str(world / "eval_prompts.jsonl"), "prompt", verbose=False)[0]}
    seen = {}
    for split in ("pref_train", "pref_val", "pref_test"):
        records = load_records(str(pairs / f"{split}.jsonl"), PREFERENCE_KINDS, verbose=False)[0]
        assert len(records) == summary[split]["pairs"] > 0
        seen[split] = {normalise_prompt(prompt_of(r)) for r in records}
        assert not seen[split] & held_out
        for r in random.Random(0).sample(records, min(3, len(records))):  # each gold written is the gold's
            answers = [r.chosen[0]["content"], r.rejected[0]["content"]]
            assert [r.meta["gold_chosen"], r.meta["gold_rejected"]] == [sentiment_gold(None, a) for a in answers]
        assert 0.0 <= summary[split]["agreement_with_gold"] <= 1.0 and 0.5 <= summary[split]["accuracy_ceiling"]
    assert not seen["pref_test"] & seen["pref_train"]
    rm = json.loads((next(stages.glob("rm-*")) / "summary.json").read_text())
    assert rm["data"]["train"]["records"] == summary["pref_train"]["pairs"]  # the RM trained on the pairs stage's
    assert 0.0 <= rm["test/gold_accuracy"] <= 1.0 and rm["test/gold_pairs"] >= 1
    final = json.loads((run / "summary.json").read_text())
    lo, hi = final["judge/ppo_minus_sft_interval"]  # the gold of SFT and PPO on the held-out prompts, paired
    assert lo <= final["judge/ppo_minus_sft"] <= hi and 0.0 <= final["judge/sft"] <= 1.0
    assert "not known" not in out.stdout  # the gold is exact: no "what the judge can see" caveat
    rows = list(csv.DictReader((run / "logs" / "metrics.csv").open()))
    assert any(r.get("heldout/utility") for r in rows)  # early stopping measured the gold on held-out prompts


@pytest.mark.slow
@needs_data
def test_the_frontier_on_the_sentiment_world_puts_every_method_on_the_gold_plane(tmp_path, tiny_real_model):
    run = tmp_path / "run"
    out = _train(tmp_path, "recipe=frontier_text", "world=sentiment", "model=hf",
                 f"model.name_or_path={tiny_real_model}", "hparams=smollm2", "logger=csv", f"hydra.run.dir={run}",
                 "hparams.dpo.max_steps=2", "eval.n_samples=2", "eval.bon.n=[2]", "eval.bon.curve_max=4",
                 "eval.n_resamples=50",
                 'stage_overrides.weak_kl=["trainer.max_steps=8","callbacks.early_stopping.every_n_rollouts=1"]',
                 *[o for o in TINY if not o.startswith("callbacks.")])
    summary = json.loads((run / "summary.json").read_text())
    methods = ("sft", "dpo", "ppo", "rloo", "grpo", "ppo_gold", "weak_kl", "bon2")
    assert all(0.0 <= summary[f"gold/{m}"] <= 1.0 for m in methods)  # the world's gold, not a judge's score
    curves = list(csv.DictReader((run / "frontier_curves.csv").open()))
    assert {r["curve"] for r in curves} == {"proxy", "gold"} and (run / "utility_vs_kl.png").is_file()
    rows = {r["policy"]: r for r in csv.DictReader((run / "eval_table.csv").open())}
    assert all(rows[m]["gold_vs_bon_proxy"] != "" for m in methods)  # each policy's gap to the BoN curve at its KL
    stages = tmp_path / "cache" / "stages"
    rewards = {yaml_text.split("fn:")[1].split("path: ")[1].split()[0] for f in stages.glob("ppo_lora-*/config.yaml")
               if "FunctionReward" in (yaml_text := f.read_text())}
    assert rewards == {"lrlhf.data.sentiment.sentiment_reward"}  # ppo_gold: PPO on the gold itself (reward=gold)
    weak = json.loads(next(next(stages.glob("ppo_weak_kl-*")).rglob("heldout_history.json")).read_text())["history"]
    goodhart = list(csv.DictReader((run / "goodhart.csv").open()))  # the weak-KL run's curve: gold and proxy
    assert [float(r["utility"]) for r in goodhart] == [h["utility"] for h in weak] and len(weak) >= 2
    assert [float(r["proxy"]) for r in goodhart] == [h["proxy"] for h in weak] and (run / "goodhart.png").is_file()
    assert f"the plots' figures: {run / 'frontier_curves.csv'}, {run / 'goodhart.csv'}" in out.stdout  # named


@needs_data
def test_an_sft_stage_is_one_for_both_golds_and_every_stage_that_reads_the_gold_is_its_own(tmp_path, monkeypatch):
    """The SFT stage reads no gold (the world's files and the model only), so world=sentiment_on_topic reuses
    world=sentiment's SFT (it trained an identical one again); the pairs (labelled and measured by the gold), the RM
    on them, DPO and PPO (early stopping reads the gold) are each their own stage."""
    from test_cli import _dep_composer

    from lrlhf.run.planning import cache_folder, plan

    monkeypatch.setenv("LRLHF_DATA", str(SHARED))

    def planned(recipe, world):
        shared = [*f"world={world}".split(), "model=smollm2", f"paths.cache_dir={tmp_path}"]
        cfg = _compose([f"recipe={recipe}", *shared, "paths.run_dir=."])
        todo = {name: (dep, folder) for name, dep, folder in plan(cfg, shared, _dep_composer(tmp_path))}
        return cfg, todo

    plain, plain_todo = planned("ppo_lora", "sentiment")
    topic, topic_todo = planned("ppo_lora", "sentiment_on_topic")
    assert set(plain_todo) == set(topic_todo) == {"sft_lora", "pairs", "rm"}
    assert plain_todo["sft_lora"][1] == topic_todo["sft_lora"][1]  # one SFT
    for name in ("pairs", "rm"):
        assert plain_todo[name][1] != topic_todo[name][1], name
    pairs = topic_todo["pairs"][0]
    assert pairs.gold == pairs.annotator.gold == "lrlhf.data.sentiment:on_topic_sentiment_gold"
    assert cache_folder(plain, "ppo_lora") != cache_folder(topic, "ppo_lora")
    assert plain.callbacks.early_stopping.utility != topic.callbacks.early_stopping.utility
    sft = [planned("sft_lora", world)[0] for world in (  # nor do the world's other roles enter SFT's key
        "sentiment", "sentiment_on_topic world.judge_recipe=judge_rm")]
    assert cache_folder(sft[0], "sft_lora") == cache_folder(sft[1], "sft_lora") == plain_todo["sft_lora"][1]
    dpo = [planned("dpo_lora", world)[0] for world in ("sentiment", "sentiment_on_topic")]
    assert cache_folder(dpo[0], "dpo_lora") != cache_folder(dpo[1], "dpo_lora")
