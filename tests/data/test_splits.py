"""Splits by normalised prompt (disjoint, stable, order-free) and dedup of prompts and pairs."""

import random

import pytest

from lrlhf.data.records import PreferencePair, PromptExample, SFTExample
from lrlhf.data.splits import dedup_pairs, dedup_prompts, normalise_prompt, prompt_of, split_by_prompt
from lrlhf.data.summary import DataSummary

FRACTIONS = {"train": 0.8, "validation": 0.1, "test": 0.1}


def user(text):
    return {"role": "user", "content": text}


def bot(text):
    return {"role": "assistant", "content": text}


def pair(prompt, chosen, rejected, target=1.0):
    return PreferencePair(
        prompt=[user(prompt)], chosen=[bot(chosen)], rejected=[bot(rejected)], target=target
    )


def many_prompts():
    # 200 prompts, each three times with different casing / spacing, which must stay together.
    variants = ("sort {} 1 2", "Sort  {} 1 2 ", "SORT {}\t1 2")
    return [PromptExample(prompt=[user(v.format(i))]) for i in range(200) for v in variants]


def test_normalise_prompt_is_role_tagged_lower_case_and_whitespace_collapsed():
    prompt = [{"role": "system", "content": "Be  Brief"}, user(" Sort\n3   1 ")]
    assert normalise_prompt(prompt) == "system: be brief\nuser: sort 3 1"


def test_prompt_of_an_sft_example_is_everything_before_the_last_assistant_turn():
    example = SFTExample(messages=[user("a"), bot("b"), user("c"), bot("d")])
    assert prompt_of(example) == [user("a"), bot("b"), user("c")]


def test_no_prompt_crosses_splits_and_every_record_lands_once():
    records = many_prompts()
    splits = split_by_prompt(records, FRACTIONS, seed=3)
    assert list(splits) == ["train", "validation", "test"]
    keys = {name: {normalise_prompt(r.prompt) for r in part} for name, part in splits.items()}
    assert keys["train"].isdisjoint(keys["validation"])
    assert keys["train"].isdisjoint(keys["test"])
    assert keys["validation"].isdisjoint(keys["test"])
    assert sum(len(part) for part in splits.values()) == 600
    assert sum(len(k) for k in keys.values()) == 200
    assert all(len(part) > 0 for part in splits.values())


def test_split_is_stable_for_a_seed_and_independent_of_order_and_of_other_records():
    records = many_prompts()
    first = split_by_prompt(records, FRACTIONS, seed=3)
    shuffled = records[:]
    random.Random(0).shuffle(shuffled)
    again = split_by_prompt(shuffled, FRACTIONS, seed=3)
    for name in FRACTIONS:
        assert sorted(map(normalise_prompt, map(prompt_of, first[name]))) == sorted(
            map(normalise_prompt, map(prompt_of, again[name]))
        )
    alone = split_by_prompt(records[:3], FRACTIONS, seed=3)
    home = next(name for name, part in first.items() if records[0] in part)
    assert alone[home] == records[:3]
    other_seed = split_by_prompt(records, FRACTIONS, seed=4)
    assert other_seed["train"] != first["train"]


def test_split_keeps_input_order_within_each_split():
    records = many_prompts()
    for part in split_by_prompt(records, FRACTIONS, seed=0).values():
        positions = [records.index(r) for r in part]
        assert positions == sorted(positions)


def test_zero_share_gets_nothing_and_a_whole_share_gets_everything():
    records = many_prompts()
    splits = split_by_prompt(records, {"train": 1.0, "test": 0.0}, seed=0)
    assert splits == {"train": records, "test": []}


@pytest.mark.parametrize("fractions", [{}, {"train": 0.8, "test": 0.1}, {"train": 1.2, "test": -0.2}])
def test_bad_fractions_are_refused(fractions):
    with pytest.raises(ValueError, match="fractions must be shares >= 0 summing to 1"):
        split_by_prompt(many_prompts(), fractions)


def test_dedup_prompts_keeps_the_first_of_each_normalised_prompt():
    records = many_prompts()
    summary = DataSummary(source="s", kind="prompt", read=len(records))
    kept = dedup_prompts(records, summary)
    assert kept == records[::3]
    assert summary.dropped == {"duplicate_prompt": 400}
    assert summary.kept == 200


def test_dedup_pairs_keeps_the_first_of_exact_and_reversed_duplicates():
    first = pair("Q", "a", "b")
    same = pair("q ", "a", "b")  # same prompt after normalisation
    reversed_same_label = pair("Q", "b", "a", target=0.0)  # says a wins too
    other = pair("Q", "a", "c")
    summary = DataSummary(source="s", kind="preference", read=4)
    assert dedup_pairs([first, same, reversed_same_label, other], summary) == [first, other]
    assert summary.dropped == {"duplicate_pair": 2}


def test_reversed_duplicate_with_the_opposite_label_is_a_contradiction_dropping_both():
    keep = pair("Q", "a", "c")
    pairs = [pair("Q", "a", "b"), keep, pair("Q", "b", "a")]  # a beats b, and b beats a
    summary = DataSummary(source="s", kind="preference", read=3)
    assert dedup_pairs(pairs, summary) == [keep]
    assert summary.dropped == {"contradictory_pair": 2}
    assert summary.kept == 1


def test_ties_reversed_are_duplicates_and_continuations_compare_exactly():
    tie = pair("Q", "a", "b", target=0.5)
    cased = pair("Q", "A", "b")  # case in an answer can be what the label is about: not a duplicate
    assert dedup_pairs([tie, pair("Q", "b", "a", target=0.5), cased]) == [tie, cased]


def test_dedup_that_removes_everything_says_so():
    summary = DataSummary(source="s", kind="preference", read=2)
    with pytest.raises(ValueError, match=r"all 2 records were removed by filters \(contradictory_pair: 2\)"):
        dedup_pairs([pair("Q", "a", "b"), pair("Q", "b", "a")], summary)
