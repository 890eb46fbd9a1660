"""Pairwise win / tie / loss / both-bad of policy A against policy B, from the utilities a judge gave them.

Each comparison is one response of A and one of B to the same prompt, judged by utilities ``a`` and ``b`` (the toy
world's gold utility, a held-out reward model, a rule set, ...). The outcome is exclusive, checked in this order:

- **both-bad**: ``a < bad_below`` and ``b < bad_below`` (when ``bad_below`` is set): neither answer is acceptable,
  so which is less bad is not counted as a preference;
- **win**: ``a > b + tie_band``; **loss**: ``b > a + tie_band``; **tie**: otherwise (``|a - b| <= tie_band``).

The four rates sum to 1. A prompt may have several comparisons (sample ``i`` of A against sample ``i`` of B);
comparisons of one prompt are correlated, so intervals come from a bootstrap that resamples **prompts**
(:func:`lrlhf.eval.bootstrap_interval` over per-prompt rates; each prompt weighs the same).

With a model-based judge, randomise which side it sees first before it produces the utilities; utilities that
are functions of one response alone (gold utility, a reward model) need no such care.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from lrlhf.eval.utility import bootstrap_interval

OUTCOMES = ("win", "tie", "loss", "both_bad")


def outcome(a: float, b: float, tie_band: float = 0.0, bad_below: float | None = None) -> str:
    """The outcome of A (utility ``a``) against B (``b``): one of :data:`OUTCOMES`, see the module docstring."""
    if bad_below is not None and a < bad_below and b < bad_below:
        return "both_bad"
    if a > b + tie_band:
        return "win"
    if b > a + tie_band:
        return "loss"
    return "tie"


class WinRate(NamedTuple):
    """Counts and rates of A's outcomes against B over ``n`` comparisons of ``prompts`` prompts.

    Fields:
        counts: comparisons per outcome, keys :data:`OUTCOMES`.
        rates: mean over prompts of each prompt's outcome fractions (the plain fraction ``count / n`` when every
            prompt has the same number of comparisons); they sum to 1.
        intervals: percentile bootstrap interval of each rate and of ``net = win - loss``, prompts resampled.
        n: comparisons; prompts: prompts.
    """

    counts: dict[str, int]
    rates: dict[str, float]
    intervals: dict[str, tuple[float, float]]
    n: int
    prompts: int

    @property
    def net(self) -> float:
        """``win - loss`` rate: > 0 when A wins more often than it loses."""
        return self.rates["win"] - self.rates["loss"]


def _per_prompt(values: Sequence[float | Sequence[float]]) -> list[list[float]]:
    return [[float(v)] if isinstance(v, (int, float)) else [float(x) for x in v] for v in values]


def win_rate(
    a: Sequence[float | Sequence[float]],
    b: Sequence[float | Sequence[float]],
    tie_band: float = 0.0,
    bad_below: float | None = None,
    n_resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> WinRate:
    """Win / tie / loss / both-bad of A against B with prompt-clustered bootstrap intervals.

    Args:
        a, b: per prompt (same order), a utility or a sequence of utilities; prompt ``p``'s ``i``-th utility of A
            is compared with its ``i``-th of B, so both need the same count per prompt.
        tie_band: ``|a - b| <= tie_band`` is a tie (``>= 0``).
        bad_below: both below it is "both bad"; None never counts both-bad.
        n_resamples, seed, level: of :func:`bootstrap_interval`.
    """
    if tie_band < 0:
        raise ValueError(f"tie_band must be >= 0, got {tie_band}")
    a_rows, b_rows = _per_prompt(a), _per_prompt(b)
    if len(a_rows) != len(b_rows):
        raise ValueError(f"A has {len(a_rows)} prompts and B {len(b_rows)}; compare the same prompts")
    if not a_rows:
        raise ValueError("win_rate needs at least one prompt")
    counts = dict.fromkeys(OUTCOMES, 0)
    fractions: dict[str, list[float]] = {name: [] for name in OUTCOMES}  # per prompt
    for p, (row_a, row_b) in enumerate(zip(a_rows, b_rows, strict=True)):
        if len(row_a) != len(row_b) or not row_a:
            raise ValueError(f"prompt {p}: {len(row_a)} utilities of A and {len(row_b)} of B; need the same, >= 1")
        here = [outcome(x, y, tie_band, bad_below) for x, y in zip(row_a, row_b, strict=True)]
        for name in OUTCOMES:
            counts[name] += here.count(name)
            fractions[name].append(here.count(name) / len(here))
    n_prompts = len(a_rows)
    rates = {name: sum(f) / n_prompts for name, f in fractions.items()}
    boot = {"n_resamples": n_resamples, "seed": seed, "level": level}
    intervals = {name: bootstrap_interval(f, **boot) for name, f in fractions.items()}
    # net uses the same seed, hence the same resampled prompts, as the rates' intervals
    net = [w - lo for w, lo in zip(fractions["win"], fractions["loss"], strict=True)]
    intervals["net"] = bootstrap_interval(net, **boot)
    return WinRate(counts, rates, intervals, sum(counts.values()), n_prompts)
