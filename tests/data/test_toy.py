"""The toy world: gold utility by hand, annotators, demonstrator, disjoint sets, round trips, determinism."""

import hashlib
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lrlhf.data.records import PreferencePair, PromptExample, Ranking, SFTExample
from lrlhf.data.toy import (
    AnnotatorConfig,
    DemonstratorConfig,
    TaskConfig,
    TinyModelConfig,
    WorldSizes,
    accuracy_ceiling,
    build_tokenizer,
    build_world,
    expected_agreement,
    gold_utilities,
    gold_utility,
    label_probabilities,
    observed_agreement,
    sample_label,
    sample_ranks,
)
from lrlhf.data.toy.__main__ import main
from lrlhf.data.toy.utility import brevity, count_correctness, lcs_length, sort_correctness
from lrlhf.data.toy.vocab import UNK

SORT = {"kind": "sort", "items": [3, 1, 2]}
COUNT = {"kind": "count", "items": ["fig", "cat", "fig"]}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The default world (seed 0), built once for the module."""
    paths = build_world(tmp_path_factory.mktemp("world") / "w", seed=0)
    return paths, json.loads(paths.world_json.read_text())


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def file_hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- gold utility, component by component


def test_lcs_and_sort_correctness_by_hand():
    assert lcs_length([1, 3, 2], [1, 2, 3]) == 2
    assert lcs_length([], [1]) == 0
    assert sort_correctness([1, 2, 3], [3, 1, 2]) == 1.0
    # "1 3 2": 1 exact position, LCS 2 -> (1 + 2) / (2 * 3) = 0.5
    assert sort_correctness([1, 3, 2], [3, 1, 2]) == 0.5
    # "1 2": 2 positions, LCS 2, max(2, 3) = 3 -> 4 / 6
    assert sort_correctness([1, 2], [3, 1, 2]) == pytest.approx(4 / 6, abs=1e-12)
    # "1 2 3 3": 3 positions, LCS 3, max(4, 3) = 4 -> 6 / 8
    assert sort_correctness([1, 2, 3, 3], [3, 1, 2]) == 0.75
    assert sort_correctness([], [3, 1, 2]) == 0.0


def test_count_correctness_and_brevity_by_hand():
    items = ["a", "b", "c"]
    assert count_correctness([3], items) == 1.0
    assert count_correctness([4], items) == pytest.approx(2 / 3, abs=1e-12)  # 1 - 1/3
    assert count_correctness([1], items) == pytest.approx(1 / 3, abs=1e-12)  # 1 - 2/3
    assert count_correctness([6], items) == 0.0
    assert count_correctness([3, 9], items) == 1.0  # the first number is the answer
    assert count_correctness([], items) == 0.0
    assert brevity(1, 1) == 1.0
    assert brevity(0, 3) == 1.0  # short answers are charged through correctness, not brevity
    assert brevity(5, 1) == 5 / 9  # (1 + 4) / (1 + 4 + 4)
    assert brevity(4, 3) == 7 / 8  # (3 + 4) / (3 + 4 + 1)


@pytest.mark.parametrize(("task", "response", "expected"), [
    (SORT, "1 2 3", 1.0),
    (SORT, "1 3 2", 0.5),
    (SORT, "sure 1 2 3", 7 / 8),  # correctness 1, brevity (3+4)/(3+4+1)
    (SORT, "1 2 3 3", 0.75 * 7 / 8),  # repetition: correctness 6/8, brevity 7/8
    (SORT, "1 2 3 <|end|> junk junk", 1.0),  # cut at the end-of-turn token
    (SORT, "3 1 2", (0 + 2) / 6),  # unsorted echo: no exact position, LCS 2
    (SORT, "", 0.0),
    (SORT, "ok ok ok", 0.0),
    (COUNT, "3", 1.0),
    (COUNT, "4", 2 / 3),
    (COUNT, "3 i hope this helps", 5 / 9),  # correctness 1, 4 filler words: 5 / 9
    (COUNT, "3 3 3 3 3", 5 / 9),  # repetition costs like filler
    (COUNT, "fig cat fig", 0.0),  # no number: missing answer
])
def test_gold_utility_by_hand(task, response, expected):
    assert gold_utility(task, response) == pytest.approx(expected, abs=1e-12)


def test_gold_utility_accepts_records_and_batches():
    record = {"prompt": [{"role": "user", "content": "how many items : fig cat fig"}], "task": COUNT}
    assert gold_utility(record, "4") == pytest.approx(2 / 3, abs=1e-12)
    assert gold_utility(PromptExample(prompt=record["prompt"], meta={"task": COUNT}), "3") == 1.0
    assert gold_utilities([SORT, COUNT], ["1 3 2", "3"]) == [0.5, 1.0]
    with pytest.raises(ValueError, match="2 tasks but 1 responses"):
        gold_utilities([SORT, COUNT], ["1"])
    with pytest.raises(ValueError, match="cannot find a toy-world task"):
        gold_utility({"prompt": []}, "1")
    with pytest.raises(ValueError, match="task kind must be one of"):
        gold_utility({"kind": "reverse", "items": [1]}, "1")


# ---------------------------------------------------------------- annotators


def test_label_probabilities_by_hand():
    cfg = AnnotatorConfig(temperature=1.0, length_bias=0.0, tie_band=0.0)
    p_a, p_b, p_tie = label_probabilities(1.0, 0.0, 3, 3, cfg)
    assert p_a == pytest.approx(1 / (1 + math.exp(-1)), abs=1e-12)  # sigma(1) = 0.7311
    assert p_b == pytest.approx(1 / (1 + math.exp(1)), abs=1e-12)
    assert p_tie == pytest.approx(0.0, abs=1e-12)
    # length bias: gap = 0 - 0 + 0.5 * (20 - 10) / 10 = 0.5; band 0.1, tau 0.2
    # -> P(A) = sigma((0.5 - 0.1) / 0.2) = sigma(2)
    cfg = AnnotatorConfig(temperature=0.2, length_bias=0.5, length_scale=10.0, tie_band=0.1)
    p_a, p_b, p_tie = label_probabilities(0.0, 0.0, 20, 10, cfg)
    assert p_a == pytest.approx(1 / (1 + math.exp(-2)), abs=1e-12)
    assert p_b == pytest.approx(1 / (1 + math.exp(3)), abs=1e-12)  # sigma((-0.5 - 0.1) / 0.2) = sigma(-3)
    assert p_tie == pytest.approx(1 - p_a - p_b, abs=1e-12)


def test_sampled_labels_follow_the_probabilities():
    cfg = AnnotatorConfig(temperature=0.5, length_bias=0.0, tie_band=0.1)
    rng = random.Random(0)
    labels = [sample_label(rng, 0.6, 0.4, 5, 5, cfg) for _ in range(20000)]
    p_a, p_b, p_tie = label_probabilities(0.6, 0.4, 5, 5, cfg)  # sigma(0.2), sigma(-0.6), rest
    # 20000 draws: 4 standard errors of a proportion near 0.5 is 4 * 0.0035 = 0.014
    assert abs(labels.count(1.0) / 20000 - p_a) < 0.014
    assert abs(labels.count(0.0) / 20000 - p_b) < 0.014
    assert abs(labels.count(0.5) / 20000 - p_tie) < 0.014


def test_accuracy_ceiling_hand_case():
    cfg = AnnotatorConfig(temperature=1.0, length_bias=0.0, tie_band=0.0)
    # pairs: gap 1 -> max(p, 1-p) = sigma(1); gap 0 -> 0.5; gap -1 -> sigma(1)
    # -> (0.7311 * 2 + 0.5) / 3 = 0.6540
    expected = (2 / (1 + math.exp(-1)) + 0.5) / 3
    assert accuracy_ceiling([1.0, 0.5, 0.0], [0.0, 0.5, 1.0], [1, 1, 1], [1, 1, 1], cfg) == pytest.approx(
        expected, abs=1e-12)
    # with a tie band the ceiling is over non-tie labels: sum max(P(A), P(B)) / sum (P(A) + P(B))
    cfg = AnnotatorConfig(temperature=1.0, length_bias=0.0, tie_band=0.5)
    p_a, p_b, _ = label_probabilities(1.0, 0.0, 1, 1, cfg)  # sigma(0.5), sigma(-1.5)
    assert accuracy_ceiling([1.0], [0.0], [1], [1], cfg) == pytest.approx(p_a / (p_a + p_b), abs=1e-12)


def test_agreement_hand_case():
    cfg = AnnotatorConfig(temperature=1.0, length_bias=0.0, tie_band=0.0)
    # the gold tie (0.5, 0.5) is skipped; gap 1 -> sigma(1); gap -1 -> P(B) = sigma(1)
    assert expected_agreement([1.0, 0.5, 0.0], [0.0, 0.5, 1.0], [1] * 3, [1] * 3, cfg) == pytest.approx(
        1 / (1 + math.exp(-1)), abs=1e-12)
    # labels: agree (1), gold tie skipped, tie (1/2), disagree (0) -> (1 + 0.5 + 0) / 3
    assert observed_agreement([1.0, 0.5, 0.2, 0.9], [0.0, 0.5, 0.4, 0.1], [1.0, 1.0, 0.5, 0.0]) == 0.5


def test_rankings_follow_gold_without_noise_and_tie_within_the_band():
    golds, lengths = [0.2, 0.9, 0.5, 0.9], [3, 3, 3, 3]
    sharp = AnnotatorConfig(temperature=1e-6, length_bias=0.0, tie_band=1e-3)
    assert sample_ranks(random.Random(0), golds, lengths, sharp) == [3, 1, 2, 1]  # dense ranks, 0.9s tie
    wide = AnnotatorConfig(temperature=1e-6, length_bias=0.0, tie_band=10.0)
    assert sample_ranks(random.Random(0), golds, lengths, wide) == [1, 1, 1, 1]
    biased = AnnotatorConfig(temperature=1e-6, length_bias=1.0, length_scale=1.0, tie_band=1e-3)
    # the length bonus 1 per word outweighs gold: the 5-word answer (0.2 + 5) ranks first
    assert sample_ranks(random.Random(0), golds, [5, 3, 3, 3], biased)[0] == 1


def test_annotator_defaults_agree_with_gold_70_to_75_percent(world):
    _, summary = world
    y = summary["yardsticks"]
    # exact for seed 0 (8000 pairs of the preference training set); the range is the calibration target
    assert y["annotator_agreement_expected"] == pytest.approx(0.7334235, abs=1e-6)
    assert 0.70 <= y["annotator_agreement_expected"] <= 0.75
    assert 0.70 <= y["annotator_agreement_observed"] <= 0.75
    assert y["annotator_agreement_expected"] < y["annotator_accuracy_ceiling"] < 1.0


def test_demonstrator_is_middling_and_best_of_16_is_better(world):
    y = world[1]["yardsticks"]
    assert 0.4 <= y["demonstrator_mean_gold"] <= 0.6
    assert 0.4 <= y["sft_train_mean_gold"] <= 0.6
    assert y["demonstrator_best_of_16_gold"] > y["demonstrator_mean_gold"] + 0.3


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="temperature"):
        AnnotatorConfig(temperature=0.0)
    with pytest.raises(ValueError, match="tie_band"):
        AnnotatorConfig(tie_band=-0.1)
    with pytest.raises(ValueError, match="p_correct"):
        DemonstratorConfig(p_correct=1.5)
    with pytest.raises(ValueError, match="sort_min_len"):
        TaskConfig(sort_min_len=9)
    with pytest.raises(ValueError, match="hidden_size"):
        TinyModelConfig(hidden_size=66)
    with pytest.raises(ValueError, match="sizes.candidates_per_prompt"):
        WorldSizes(candidates_per_prompt=1)


# ---------------------------------------------------------------- the written world


def test_files_parse_as_records_and_prompt_sets_are_disjoint(world):
    paths, summary = world
    prompts = {}
    for name in ("sft_train", "sft_val"):
        records = read_jsonl(getattr(paths, name))
        for r in records:
            SFTExample(messages=r["messages"], meta={"task": r["task"]})
            assert [m["role"] for m in r["messages"]] == ["user", "assistant"]
        prompts[name] = {r["messages"][0]["content"] for r in records}
    for split in ("train", "val", "test"):
        pairs = read_jsonl(getattr(paths, f"pref_{split}"))
        ranks = read_jsonl(getattr(paths, f"rank_{split}"))
        for r in pairs:
            PreferencePair(prompt=r["prompt"], chosen=r["chosen"], rejected=r["rejected"], target=r["target"])
            assert r["target"] in (1.0, 0.5) and isinstance(r["both_bad"], bool)
            assert r["chosen"] != r["rejected"]
        for r in ranks:
            Ranking(prompt=r["prompt"], completions=r["completions"], ranks=r["ranks"])
            assert len(r["completions"]) == len(r["ranks"]) == 4 and min(r["ranks"]) == 1
        prompts[f"pref_{split}"] = {r["prompt"][0]["content"] for r in pairs}
        assert prompts[f"pref_{split}"] == {r["prompt"][0]["content"] for r in ranks}
    for name in ("rl_prompts", "eval_prompts"):
        prompts[name] = {PromptExample(prompt=r["prompt"]).prompt[0]["content"] for r in read_jsonl(
            getattr(paths, name))}
    sizes = WorldSizes()
    assert {k: len(v) for k, v in prompts.items()} == {
        "sft_train": sizes.sft_train, "sft_val": sizes.sft_val, "pref_train": sizes.pref_train,
        "pref_val": sizes.pref_val, "pref_test": sizes.pref_test, "rl_prompts": sizes.rl,
        "eval_prompts": sizes.eval}
    union = set().union(*prompts.values())
    assert len(union) == sum(len(v) for v in prompts.values())  # no prompt text in two sets
    assert summary["counts"]["pref_train"] == sizes.pref_train * sizes.pairs_per_prompt


def test_canonical_jsonl_lines(world):
    paths, _ = world
    raw = paths.pref_train.read_bytes()
    assert b"\r" not in raw and raw.endswith(b"\n")
    first = raw.split(b"\n", 1)[0].decode()
    assert first == json.dumps(json.loads(first), ensure_ascii=False, sort_keys=True)


def test_every_word_the_world_can_write_is_in_the_vocabulary():
    from lrlhf.data.toy.demonstrator import FILLER_PREFIXES, FILLER_SUFFIXES
    from lrlhf.data.toy.tasks import _PROMPT_HEADS

    vocab = build_tokenizer().get_vocab()
    phrases = (*FILLER_PREFIXES, *FILLER_SUFFIXES, *_PROMPT_HEADS.values())
    words = {w for phrase in phrases for w in phrase.split()}
    assert sorted(words - set(vocab)) == []


def test_tokenizer_round_trip_offline_and_no_unknown_words(world):
    from transformers import AutoTokenizer

    paths, _ = world
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    built = build_tokenizer()
    loaded = AutoTokenizer.from_pretrained(paths.tokenizer)
    record = read_jsonl(paths.sft_train)[0]
    messages = record["messages"]
    for tok in (built, loaded):
        assert len(tok) <= 512 and tok.eos_token == "<|end|>" and tok.pad_token_id == 0
    assert loaded.apply_chat_template(messages, tokenize=False) == built.apply_chat_template(messages,
                                                                                             tokenize=False)
    full = loaded.apply_chat_template(messages, tokenize=True)["input_ids"]
    assert full == built.apply_chat_template(messages, tokenize=True)["input_ids"]
    prompt = loaded.apply_chat_template(messages[:1], tokenize=True, add_generation_prompt=True)["input_ids"]
    assert full[: len(prompt)] == prompt  # the generation prompt is a prefix of the full conversation
    assert full[-1] == loaded.eos_token_id
    assert loaded.decode(full[len(prompt):], skip_special_tokens=True) == messages[1]["content"]
    unk = loaded.convert_tokens_to_ids(UNK)
    for name in ("sft_train", "pref_train", "rank_train", "eval_prompts"):
        text = getattr(paths, name).read_text()
        for r in map(json.loads, text.splitlines()[:200]):
            turns = r.get("messages", []) + r.get("prompt", []) + r.get("chosen", []) + r.get("rejected", [])
            for m in turns:
                assert unk not in loaded(m["content"])["input_ids"], m["content"]


def test_model_round_trip_offline(world):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lrlhf.data.toy import build_model

    paths, _ = world
    tok = AutoTokenizer.from_pretrained(paths.tokenizer)
    loaded = AutoModelForCausalLM.from_pretrained(paths.model)
    fresh = build_model(TinyModelConfig(), build_tokenizer(), seed=0)
    assert type(loaded).__name__ == "LlamaForCausalLM"
    assert loaded.config.vocab_size == len(tok) and loaded.config.eos_token_id == tok.eos_token_id
    # 2 layers x (4 * 64^2 attention + 3 * 64 * 256 MLP + 2 * 64 norms) + 2 * 88 * 64 embeddings + 64 norm
    assert len(tok) == 88
    n_params = sum(p.numel() for p in loaded.parameters())
    assert n_params == 2 * (4 * 64 * 64 + 3 * 64 * 256 + 128) + 2 * 88 * 64 + 64 == 142_656
    ids = torch.tensor([tok.apply_chat_template(read_jsonl(paths.sft_val)[0]["messages"])["input_ids"]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, fresh(ids).logits)


def test_build_is_byte_identical_for_a_seed(world, tmp_path):
    paths, _ = world
    again = build_world(tmp_path / "again", seed=0)
    first, second = file_hashes(paths.root), file_hashes(again.root)
    # 10 jsonl + world.json + 3 tokenizer files + model/ (3 model files + the same 3 tokenizer files)
    assert sorted(first) == sorted(second) and len(first) == 20
    assert first == second
    assert b"lrlhf" not in (again.model / "config.json").read_bytes()  # no paths or times leak in
    other = build_world(tmp_path / "other", seed=1, sizes=WorldSizes(sft_train=20, sft_val=5, pref_train=10,
                                                                       pref_val=5, pref_test=5, rl=5, eval=5))
    assert file_hashes(other.root)["model/model.safetensors"] != first["model/model.safetensors"]


# ---------------------------------------------------------------- commands


def test_describe_command_prints_every_yardstick(world):
    y = world[1]["yardsticks"]
    # another process with another hash seed must print the figures this process computed
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2] / "src"), PYTHONHASHSEED="123")
    out = subprocess.run([sys.executable, "-m", "lrlhf.data.toy", "describe", "--seed", "0"], env=env,
                         capture_output=True, text=True, check=True, timeout=60).stdout
    assert f"vocabulary size: {y['vocab_size']}" in out
    for kind in ("sort", "count"):
        ex = y["examples"][kind]
        assert f"example ({kind}):" in out and ex["prompt"] in out
        assert f"ideal answer: {ex['ideal_answer']}" in out
    assert f"demonstrator mean gold: {y['demonstrator_mean_gold']:.3f}" in out
    assert f"demonstrator best-of-16 gold: {y['demonstrator_best_of_16_gold']:.3f}" in out
    assert f"annotator agreement with gold: {y['annotator_agreement_expected']:.3f} expected" in out
    assert f"annotator accuracy ceiling: {y['annotator_accuracy_ceiling']:.3f}" in out


def test_build_command_writes_the_world(tmp_path, capsys, monkeypatch):
    import lrlhf.data.toy.world as world_module

    small = WorldSizes(sft_train=8, sft_val=2, pref_train=4, pref_val=2, pref_test=2, rl=2, eval=4)
    monkeypatch.setattr(world_module, "WorldSizes", lambda: small)
    assert main(["build", str(tmp_path / "w"), "--seed", "3"]) == 0
    assert "written to" in capsys.readouterr().out
    summary = json.loads((tmp_path / "w" / "world.json").read_text())
    assert summary["config"]["seed"] == 3 and summary["counts"]["sft_train"] == 8
