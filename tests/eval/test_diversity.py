"""Distinct-n and self-similarity on hand-made responses, against values counted by hand."""

import pytest

from lrlhf.eval.diversity import distinct_n, jaccard, ngrams, self_similarity


def test_ngrams_by_hand():
    assert ngrams(["a", "b", "c"], 2) == [("a", "b"), ("b", "c")]
    assert ngrams(["a"], 2) == []
    with pytest.raises(ValueError, match="n must be >= 1"):
        ngrams(["a"], 0)


def test_distinct_n_by_hand():
    responses = ["a b a", "b c"]
    # unigrams a b a b c: 3 distinct of 5; bigrams ab ba bc: 3 of 3
    assert distinct_n(responses, 1) == pytest.approx(3 / 5, abs=1e-12)
    assert distinct_n(responses, 2) == pytest.approx(1.0, abs=1e-12)
    # one more "a b": bigrams ab ba bc ab, 3 distinct of 4
    assert distinct_n([*responses, "a b"], 2) == pytest.approx(3 / 4, abs=1e-12)
    assert distinct_n(["a", ""], 2) == 0.0  # no bigram at all
    assert distinct_n(["a-b a"], 1, tokenize=lambda s: s.replace("-", " ").split()) == pytest.approx(2 / 3)


def test_self_similarity_by_hand():
    assert jaccard(set(), set()) == 1.0
    groups = [["a b", "b c", "a b"], ["x", "y"], ["z"]]
    # prompt 0: J({a,b},{b,c}) = 1/3, J({a,b},{a,b}) = 1, J({b,c},{a,b}) = 1/3 -> 5/9; prompt 1: 0; prompt 2 skipped
    assert self_similarity(groups, n=1) == pytest.approx((5 / 9 + 0.0) / 2, abs=1e-12)
    # bigram sets {ab, bc} and {ab, bd}: 1 shared of 3
    assert self_similarity([["a b c", "a b d"]], n=2) == pytest.approx(1 / 3, abs=1e-12)
    assert self_similarity([["same words", "same words"]], n=2) == 1.0
    with pytest.raises(ValueError, match="two or more samples"):
        self_similarity([["only one"]])
