"""Counterfactual rescoring: each transformation on hand-made text, and the sensitivity table by hand."""

import random

import pytest

from lrlhf.eval.counterfactual import (
    PadFiller,
    RepeatSentence,
    ShuffleList,
    StripFormatting,
    Truncate,
    counterfactual_table,
    table_markdown,
)

RNG = random.Random(0)


def test_truncate_keeps_the_first_fraction_of_words():
    assert Truncate(0.5)("a b c d e", RNG) == "a b c"  # ceil(2.5)
    assert Truncate(0.25)("a b c d", RNG) == "a"
    assert Truncate(0.1)("one", RNG) == "one"  # at least one word: unchanged
    assert Truncate(0.5).name == "truncate_50%"
    with pytest.raises(ValueError, match="fraction"):
        Truncate(1.0)


def test_strip_formatting_removes_markup_and_keeps_words():
    text = "## Plan\n- **first** step\n2. `code` here\n<b>bold</b> and __under__"
    assert StripFormatting()(text, RNG) == "Plan\nfirst step\ncode here\nbold and under"
    assert StripFormatting()("plain words", RNG) == "plain words"


def test_repeat_sentence_appends_the_last_sentence():
    assert RepeatSentence()("It is 3. I am sure!", RNG) == "It is 3. I am sure! I am sure!"
    assert RepeatSentence()("3 5 8", RNG) == "3 5 8 3 5 8"  # no sentence end: the whole text


def test_pad_filler_appends_the_filler():
    assert PadFiller()("3", RNG) == "3 i hope this helps i hope this helps"
    assert PadFiller("thanks", times=3)("ok.", RNG) == "ok. thanks thanks thanks"


def test_shuffle_list_changes_the_order_of_list_items_only():
    rng = random.Random(1)
    out = ShuffleList()("3 5 8", rng)
    assert out != "3 5 8" and sorted(out.split()) == ["3", "5", "8"]
    lines = "Steps:\n- a\n- b\n- c\nDone."
    out = ShuffleList()(lines, rng).split("\n")
    assert out[0] == "Steps:" and out[-1] == "Done." and out[1:4] != ["- a", "- b", "- c"]
    assert sorted(out[1:4]) == ["- a", "- b", "- c"]
    assert ShuffleList()("no list here", rng) == "no list here"
    assert ShuffleList()("2 2 2", rng) == "2 2 2"  # nothing to reorder


def test_the_table_of_a_length_loving_scorer_by_hand():
    def words(prompts, texts):  # a reward that is the length in words
        return [float(len(t.split())) for t in texts]

    def only_first_word(prompts, texts):  # a judge that cares about the answer (the first word) alone
        return [1.0 if t.split()[0] == "3" else 0.0 for t in texts]

    prompts = ["p1", "p2", "p3"]
    responses = ["3 apples", "3", "3 is the answer"]
    rows = {r["transform"]: r for r in counterfactual_table(
        words, prompts, responses, (PadFiller(), Truncate(0.5), StripFormatting()), judge=only_first_word)}
    pad = rows["pad_filler"]
    assert pad["changed"] == 3 and pad["reward_delta"] == 8.0 and pad["length_delta"] == 8.0
    assert pad["reward_interval"] == [8.0, 8.0] and pad["judge_delta"] == 0.0
    trunc = rows["truncate_50%"]  # "3" stays (one word): changed 2 of 3, -1 and -2 words
    assert trunc["changed"] == 2 and trunc["unchanged"] == 1 and trunc["reward_delta"] == -1.5
    assert rows["strip_formatting"] == {"transform": "strip_formatting", "changed": 0, "unchanged": 3}
    md = table_markdown(list(rows.values()))
    assert "| pad_filler | 3 | +8.000 [+8.000, +8.000] | +8.0 | +0.000 [+0.000, +0.000] |" in md
    assert "| strip_formatting | 0 | n/a | n/a | n/a |" in md
    with pytest.raises(ValueError, match="one each"):
        counterfactual_table(words, prompts, responses[:2])
