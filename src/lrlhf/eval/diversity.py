"""Diversity of sampled responses: distinct-n over a policy's outputs, self-similarity among one prompt's samples.

Responses are split into words by whitespace (the toy world's tokens are words; pass ``tokenize`` for another
scheme). Both measures watch for the mode collapse RLHF is prone to (the policy settles on a few answers):
distinct-n falls and self-similarity rises when a policy answers every prompt, or every sample of one prompt, the
same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import combinations

Tokenize = Callable[[str], list[str]]


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """The ``len(tokens) - n + 1`` contiguous n-grams of ``tokens`` (none when it is shorter than ``n``)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def distinct_n(responses: Sequence[str], n: int, tokenize: Tokenize = str.split) -> float:
    """Distinct-n (Li et al., 2016): distinct n-grams / all n-grams over every response (corpus level).

    1.0 when no n-gram repeats anywhere; 0.0 when there is no n-gram at all (every response shorter than ``n``).
    """
    grams = [g for r in responses for g in ngrams(tokenize(r), n)]
    return len(set(grams)) / len(grams) if grams else 0.0


def jaccard(a: set, b: set) -> float:
    """``|a & b| / |a | b|``; 1.0 for two empty sets (two empty responses are identical)."""
    union = a | b
    return len(a & b) / len(union) if union else 1.0


def self_similarity(groups: Sequence[Sequence[str]], n: int = 2, tokenize: Tokenize = str.split) -> float:
    """Mean pairwise n-gram overlap among the samples of one prompt, averaged over prompts.

    For each prompt with at least two samples: the mean over its sample pairs ``i < j`` of the Jaccard overlap of
    their n-gram sets (:func:`jaccard`); then the mean over those prompts (each weighs the same). 1.0 when every
    prompt's samples are identical, 0.0 when no two samples of a prompt share an n-gram.

    Args:
        groups: per prompt, its sampled responses.
    """
    per_prompt = []
    for group in groups:
        sets = [set(ngrams(tokenize(r), n)) for r in group]
        pairs = [jaccard(a, b) for a, b in combinations(sets, 2)]
        if pairs:
            per_prompt.append(sum(pairs) / len(pairs))
    if not per_prompt:
        raise ValueError("self_similarity needs at least one prompt with two or more samples")
    return sum(per_prompt) / len(per_prompt)
