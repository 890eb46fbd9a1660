r"""Simulated annotators: Bradley–Terry on gold utility plus a length bias, with a tie band.

An annotator perceives the difference between responses A and B as

.. math::

    \tilde d = \Delta + \tau \varepsilon,\qquad
    \Delta = g_A - g_B + b\,\frac{\mathrm{len}_A - \mathrm{len}_B}{L},\qquad
    \varepsilon \sim \mathrm{Logistic}(0, 1)

and labels "A" if :math:`\tilde d > w`, "B" if :math:`\tilde d < -w`, a tie (target 0.5) otherwise, so

- P(A) = σ((Δ − w)/τ), P(B) = σ((−Δ − w)/τ), P(tie) = 1 − P(A) − P(B);
- with w = 0 this is exactly P(A ≻ B) = σ(Δ/τ).

Length is the number of whitespace words (:func:`~.utility.response_tokens`). K-way rankings use the same
noisy scores: s_i = g_i + b len_i / L + τ G_i with G_i ~ Gumbel(0, 1), sorted best first — a Plackett–Luce
order whose pairwise marginals are σ(Δ/τ) (the difference of two Gumbels is logistic); neighbours whose noisy
scores differ by less than w share a rank (dense ranks: 1, 2, 2, 3).

"Both bad" marks a pair whose gold utilities are both below ``bad_threshold``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class AnnotatorConfig:
    """The label model. Defaults are calibrated (docs/toy_world.md) so that on the preference data the labels
    agree with the gold ordering ~72 % of the time, like human raters in the source documents."""

    temperature: float = 0.18
    """τ > 0: the noise scale; larger = noisier labels."""
    length_bias: float = 0.3
    """b: utility an annotator adds per ``length_scale`` words of extra length (0 = no bias)."""
    length_scale: float = 10.0
    """L > 0: the length difference (in words) that is worth ``length_bias`` of utility."""
    tie_band: float = 0.05
    """w >= 0: a perceived difference within ±w is labelled a tie (target 0.5)."""
    bad_threshold: float = 0.3
    """A pair is flagged ``both_bad`` when both gold utilities are below this."""

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not self.length_scale > 0:
            raise ValueError(f"length_scale must be > 0, got {self.length_scale}")
        if not self.tie_band >= 0:
            raise ValueError(f"tie_band must be >= 0, got {self.tie_band}")
        if not 0.0 <= self.bad_threshold <= 1.0:
            raise ValueError(f"bad_threshold must be in [0, 1], got {self.bad_threshold}")


def sigmoid(x: float) -> float:
    """Numerically safe logistic function."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def perceived_gap(gold_a: float, gold_b: float, len_a: int, len_b: int, cfg: AnnotatorConfig) -> float:
    """Δ = g_A − g_B + b (len_A − len_B) / L: the noise-free difference an annotator perceives."""
    return gold_a - gold_b + cfg.length_bias * (len_a - len_b) / cfg.length_scale


def label_probabilities(
    gold_a: float, gold_b: float, len_a: int, len_b: int, cfg: AnnotatorConfig
) -> tuple[float, float, float]:
    """(P(A preferred), P(B preferred), P(tie)) under the label model."""
    gap = perceived_gap(gold_a, gold_b, len_a, len_b, cfg)
    p_a = sigmoid((gap - cfg.tie_band) / cfg.temperature)
    p_b = sigmoid((-gap - cfg.tie_band) / cfg.temperature)
    return p_a, p_b, max(0.0, 1.0 - p_a - p_b)


def sample_label(
    rng: random.Random, gold_a: float, gold_b: float, len_a: int, len_b: int, cfg: AnnotatorConfig
) -> float:
    """One label: 1.0 (A preferred), 0.0 (B preferred) or 0.5 (tie); one draw from ``rng``."""
    p_a, p_b, _ = label_probabilities(gold_a, gold_b, len_a, len_b, cfg)
    u = rng.random()
    if u < p_a:
        return 1.0
    if u < p_a + p_b:
        return 0.0
    return 0.5


def sample_ranks(
    rng: random.Random, golds: Sequence[float], lengths: Sequence[int], cfg: AnnotatorConfig
) -> list[int]:
    """Dense ranks (1 = best, ties equal) of K responses from one Plackett–Luce draw; K draws from ``rng``."""
    if len(golds) != len(lengths) or not golds:
        raise ValueError(f"need K >= 1 golds and as many lengths, got {len(golds)} and {len(lengths)}")
    scores = []
    for g, n in zip(golds, lengths, strict=True):
        u = min(max(rng.random(), 1e-12), 1.0 - 1e-12)
        scores.append(g + cfg.length_bias * n / cfg.length_scale - cfg.temperature * math.log(-math.log(u)))
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    ranks = [0] * len(scores)
    rank = 1
    for position, i in enumerate(order):
        if position > 0 and scores[order[position - 1]] - scores[i] >= cfg.tie_band:
            rank += 1
        ranks[i] = rank
    return ranks


def expected_agreement(
    golds_a: Sequence[float], golds_b: Sequence[float], lens_a: Sequence[int], lens_b: Sequence[int],
    cfg: AnnotatorConfig,
) -> float:
    """Expected agreement of a label with the gold order over the pairs whose golds differ (a tie counts 1/2):
    mean of P(label on the gold-better side) + P(tie)/2. NaN when every pair is a gold tie."""
    total, n = 0.0, 0
    for ga, gb, la, lb in zip(golds_a, golds_b, lens_a, lens_b, strict=True):
        if ga == gb:
            continue
        p_a, p_b, p_tie = label_probabilities(ga, gb, la, lb, cfg)
        total += (p_a if ga > gb else p_b) + 0.5 * p_tie
        n += 1
    return total / n if n else math.nan


def observed_agreement(golds_a: Sequence[float], golds_b: Sequence[float], labels: Sequence[float]) -> float:
    """The same agreement measured on sampled labels (1 A, 0 B, 0.5 tie): ties count 1/2."""
    total, n = 0.0, 0
    for ga, gb, label in zip(golds_a, golds_b, labels, strict=True):
        if ga == gb:
            continue
        total += label if ga > gb else 1.0 - label
        n += 1
    return total / n if n else math.nan


def accuracy_ceiling(
    golds_a: Sequence[float], golds_b: Sequence[float], lens_a: Sequence[int], lens_b: Sequence[int],
    cfg: AnnotatorConfig,
) -> float:
    """The best accuracy any reward model can reach on these annotators' non-tie labels, exactly:
    Σ max(P(A), P(B)) / Σ (P(A) + P(B)) over the pairs — the Bayes predictor picks the likelier side.
    With ``tie_band = 0`` (no ties) this is E[max(p, 1 − p)], p = σ(Δ/τ)."""
    best, mass = 0.0, 0.0
    for ga, gb, la, lb in zip(golds_a, golds_b, lens_a, lens_b, strict=True):
        p_a, p_b, _ = label_probabilities(ga, gb, la, lb, cfg)
        best += max(p_a, p_b)
        mass += p_a + p_b
    return best / mass if mass else math.nan
