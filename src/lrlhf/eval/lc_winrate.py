"""Length-controlled win rate: how often A beats B once the length difference of the two responses is held at 0.

Judges (human or model) and reward models often prefer longer answers (the toy world's annotators do, by
construction), so a policy can "win" by writing more. Following the idea of AlpacaEval's length-controlled win
rate (Dubois et al., 2024), each comparison's outcome is regressed on the length difference,

    P(A preferred) = sigmoid(a + b * (len_A - len_B) / scale),

by (weighted) logistic regression with fractional targets (win = 1, loss = 0, tie and both-bad = 1/2), and the
length-controlled win rate is the prediction at a length difference of 0: ``sigmoid(a)``. ``scale`` (the root mean
square of the length differences) only conditions the fit; the differences are not centred, so 0 keeps its
meaning. Each prompt weighs the same (its comparisons share a weight of 1), and the interval is a bootstrap over
prompts (every resample refits the model; all resamples are fitted at once).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from lrlhf.eval.winrate import _per_prompt, outcome

#: Regression target of each outcome: A preferred (1), B preferred (0), neither (1/2).
TARGETS = {"win": 1.0, "loss": 0.0, "tie": 0.5, "both_bad": 0.5}


class LengthControlledWinRate(NamedTuple):
    """Fields:
        rate: ``sigmoid(a)``: the predicted preference for A at a length difference of 0.
        raw: the prompt-weighted mean target (win + (tie + both-bad) / 2), the same quantity without the control.
        slope: ``b`` per ``scale`` tokens of length difference (> 0: the longer side tends to win).
        scale: root mean square of the length differences (1 when they are all 0).
        interval: percentile bootstrap interval of ``rate``, prompts resampled.
        n: comparisons; prompts: prompts.
    """

    rate: float
    raw: float
    slope: float
    scale: float
    interval: tuple[float, float]
    n: int
    prompts: int


def fit_logistic(x: torch.Tensor, y: torch.Tensor, weights: torch.Tensor, l2: float = 0.0, max_iter: int = 100,
                 tol: float = 1e-12) -> torch.Tensor:
    """Weighted logistic regression ``y ~ sigmoid(a + b x)`` by Newton's method, for ``R`` weightings at once.

    Args:
        x, y: ``(n,)`` feature and target in [0, 1] (fractional targets allowed).
        weights: ``(R, n)`` non-negative weights, one fit per row.
        l2: ridge penalty on the slope ``b`` (never on ``a``); 0 = maximum likelihood.

    Returns:
        ``(R, 2)`` float64 ``(a, b)``. Under perfect separation the maximum likelihood is at infinity: the
        coefficients are clamped to ``[-30, 30]`` (``sigmoid`` is then 0 or 1 to 1e-13).
    """
    x, y, w = x.double(), y.double(), weights.double()
    design = torch.stack([torch.ones_like(x), x], dim=1)  # (n, 2)
    theta = torch.zeros(w.shape[0], 2, dtype=torch.float64)
    ridge = torch.tensor([[0.0, 0.0], [0.0, l2]], dtype=torch.float64)
    jitter = 1e-12 * torch.eye(2, dtype=torch.float64)  # keeps the solve defined; the fixed point is unchanged
    for _ in range(max_iter):
        p = torch.sigmoid(theta @ design.T)  # (R, n)
        grad = (w * (y - p)) @ design - theta @ ridge  # (R, 2)
        curvature = w * p * (1 - p)  # (R, n)
        hessian = torch.einsum("rn,ni,nj->rij", curvature, design, design) + ridge + jitter  # (R, 2, 2), negated
        step = torch.linalg.solve(hessian, grad.unsqueeze(-1)).squeeze(-1)
        theta = (theta + step).clamp(-30.0, 30.0)
        if step.abs().max() < tol:
            break
    return theta


def length_controlled_win_rate(
    a: Sequence[float | Sequence[float]],
    b: Sequence[float | Sequence[float]],
    len_a: Sequence[float | Sequence[float]],
    len_b: Sequence[float | Sequence[float]],
    tie_band: float = 0.0,
    bad_below: float | None = None,
    l2: float = 0.0,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> LengthControlledWinRate:
    """The length-controlled win rate of A against B (see the module docstring).

    Args:
        a, b: per prompt, a utility or a sequence of utilities (as :func:`lrlhf.eval.win_rate`).
        len_a, len_b: the lengths of those responses, same shapes.
        tie_band, bad_below: of :func:`lrlhf.eval.winrate.outcome`.
        l2: ridge on the slope (0 = maximum likelihood).
        n_resamples, seed, level: of the prompt bootstrap.
    """
    rows = [_per_prompt(v) for v in (a, b, len_a, len_b)]
    if len({len(r) for r in rows}) != 1:
        raise ValueError(f"a, b, len_a, len_b need the same prompts, got {[len(r) for r in rows]}")
    if not rows[0]:
        raise ValueError("length_controlled_win_rate needs at least one prompt")
    xs, ys, weight, prompt_of = [], [], [], []
    for p, (ua, ub, la, lb) in enumerate(zip(*rows, strict=True)):
        if not (len(ua) == len(ub) == len(la) == len(lb)) or not ua:
            raise ValueError(f"prompt {p}: utilities and lengths of A and B need the same count (>= 1)")
        for x_a, x_b, l_a, l_b in zip(ua, ub, la, lb, strict=True):
            xs.append(l_a - l_b)
            ys.append(TARGETS[outcome(x_a, x_b, tie_band, bad_below)])
            weight.append(1.0 / len(ua))
            prompt_of.append(p)
    n_prompts = len(rows[0])
    x = torch.tensor(xs, dtype=torch.float64)
    scale = float(x.pow(2).mean().sqrt()) or 1.0
    y = torch.tensor(ys, dtype=torch.float64)
    w = torch.tensor(weight, dtype=torch.float64)
    prompt_of_t = torch.tensor(prompt_of)
    g = torch.Generator().manual_seed(seed)
    draws = torch.randint(0, n_prompts, (n_resamples, n_prompts), generator=g)
    counts = torch.zeros(n_resamples, n_prompts, dtype=torch.float64).scatter_add_(
        1, draws, torch.ones_like(draws, dtype=torch.float64))
    weights = torch.cat([w[None], counts[:, prompt_of_t] * w[None]])  # row 0: the data itself
    theta = fit_logistic(x / scale, y, weights, l2=l2)
    rates = torch.sigmoid(theta[:, 0])
    tail = (1.0 - level) / 2
    interval = (rates[1:].quantile(tail).item(), rates[1:].quantile(1.0 - tail).item())
    raw = float((w * y).sum() / n_prompts)
    return LengthControlledWinRate(rates[0].item(), raw, theta[0, 1].item(), scale, interval, len(xs), n_prompts)
