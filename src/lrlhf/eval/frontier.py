"""The reward–KL frontier's reference curves, and each policy's distance to them (``recipe=frontier``).

Two Best-of-N curves from one pool of ``m`` samples per prompt of the reference policy, each the exact expectation
over every ``N``-subset of the pool (:func:`~lrlhf.eval.best_of_n.bon_expected`), at KL ``log N - (N - 1) / N``:

- **under the proxy**: the pick is the reward model's best; what reranking by the RM the policies trained against
  buys per nat;
- **under gold**: the pick is the gold utility's best; an oracle selection, a lower bound on what the KL-regularised
  optimum of the gold utility reaches per nat.

A policy's **gap to a curve** is its held-out gold minus the curve's gold *at the policy's own KL* (linear in KL
between neighbouring N), paired over prompts: each prompt's curve is its own pool's, so the bootstrap over prompts
gives the interval of the difference. A policy above the proxy curve with the interval above 0 buys more gold per
nat than reranking by its own reward model does. Beyond the curve's largest N the gap is not defined (None).
"""

from __future__ import annotations

from collections.abc import Sequence

from lrlhf.eval.best_of_n import bon_expected, bon_kl
from lrlhf.eval.utility import bootstrap_interval


def per_prompt_curves(select: Sequence[Sequence[float]], gold: Sequence[Sequence[float]],
                      n_max: int) -> list[list[float]]:
    """``[p][N - 1]``: prompt ``p``'s expected gold of the best of ``N`` pool samples by ``select``, N = 1..n_max."""
    return [[bon_expected(s, g, n) for n in range(1, n_max + 1)] for s, g in zip(select, gold, strict=True)]


def mean_curve(curves: Sequence[Sequence[float]]) -> list[tuple[int, float, float]]:
    """``(N, KL, mean gold over prompts)`` for N = 1..len(curves[0])."""
    size = len(curves)
    return [(n + 1, bon_kl(n + 1), sum(c[n] for c in curves) / size) for n in range(len(curves[0]))]


def curve_at(curve: Sequence[float], kl: float) -> float | None:
    """One prompt's curve (``curve[N - 1]``) read at ``kl`` nats, linear in KL between neighbouring N; a KL below
    0 (a k1 sample mean may be) reads N = 1; None beyond the largest N."""
    kls = [bon_kl(n + 1) for n in range(len(curve))]
    if kl <= 0:
        return float(curve[0])
    if kl > kls[-1]:
        return None
    upper = next(i for i, k in enumerate(kls) if k >= kl)
    if upper == 0:
        return float(curve[0])
    w = (kl - kls[upper - 1]) / (kls[upper] - kls[upper - 1])
    return (1 - w) * curve[upper - 1] + w * curve[upper]


def gap_to_curve(gold_per_prompt: Sequence[float], curves: Sequence[Sequence[float]], kl: float,
                 n_resamples: int = 1000, seed: int = 0) -> tuple[float, tuple[float, float]] | None:
    """``(mean gap, 95 % bootstrap interval)`` of ``gold_per_prompt[p] - curve_at(curves[p], kl)`` over prompts
    (paired); None when ``kl`` is beyond the curves."""
    at = [curve_at(c, kl) for c in curves]
    if any(a is None for a in at):
        return None
    diff = [g - a for g, a in zip(gold_per_prompt, at, strict=True)]
    return sum(diff) / len(diff), bootstrap_interval(diff, n_resamples=n_resamples, seed=seed)


MAX_POOL = 4096  #: the largest Best-of-N pool a line suggests (samples a prompt)


def beyond_the_curves(kls: dict[str, float], curve_max: int) -> list[str]:
    """For each policy (``name -> KL``) whose KL is beyond Best-of-N's largest N, the line that says so: its gaps to
    the curves are left blank (a curve is not extrapolated), and the ``eval.bon.curve_max`` that would place it."""
    end = bon_kl(curve_max)
    lines = []
    for name, kl in kls.items():
        if kl is None or kl <= end:
            continue
        n = next((n for n in range(curve_max + 1, MAX_POOL + 1) if bon_kl(n) >= kl), None)  # the smallest N
        reach = (f"eval.bon.curve_max={n} reaches it (a pool of {n} samples a prompt)" if n is not None else
                 f"Best-of-N above {MAX_POOL} would be needed, beyond any pool")
        lines.append(f"eval: {name}'s KL {kl:.2f} is beyond the Best-of-N curves (N <= {curve_max}: KL <= {end:.2f}); "
                     f"its gaps to them are left blank: {reach}")
    return lines


__all__ = ["beyond_the_curves", "curve_at", "gap_to_curve", "mean_curve", "per_prompt_curves"]
