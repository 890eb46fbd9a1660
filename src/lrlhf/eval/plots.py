"""Every plot of the project, as PNG files written atomically (matplotlib's Agg canvas, no pyplot state):

- :func:`plot_goodhart`: held-out utility and proxy reward against sqrt(KL to the reference) over one PPO run's
  evaluations (Gao et al. 2022), written by the early-stopping callback and by ``recipe=eval``;
- :func:`plot_utility_vs_kl`: ``recipe=eval``'s gold utility against KL, one point per policy and the BoN curves
  (under the proxy; under gold too with ``recipe=frontier``).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path

from lrlhf.utils.io import atomic_write_bytes


def figure(size: tuple[float, float] = (6.0, 4.0)):
    """A matplotlib ``Figure`` (90 dpi) on its own Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=90)
    FigureCanvasAgg(fig)
    return fig


def save_png(fig, path: str | Path) -> Path:
    """Lay ``fig`` out tightly and write it as a PNG to ``path`` (atomically)."""
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    return atomic_write_bytes(path, buffer.getvalue())


def plot_goodhart(history: Sequence[dict], best_index: int | None, path: str | Path,
                  title: str = "held-out utility vs proxy reward") -> Path:
    """Write a PNG of two panels: ``utility`` (left axis) and ``proxy`` (right axis) of each evaluation against
    ``sqrt(max(kl, 0))`` (``kl``: mean per-sequence KL to the reference; the Goodhart plot), and the same against
    the rollout (KL need not grow monotonically, so the first panel alone can hide the order). The evaluation
    ``best_index`` (the kept checkpoint) is marked in both."""
    fig = figure((9.0, 3.4))
    sqrt_kl = [math.sqrt(max(h["kl"], 0.0)) for h in history]
    rollouts = [h.get("rollout", i) for i, h in enumerate(history)]
    panels = [(sqrt_kl, "sqrt(KL to reference), KL = mean per-sequence sum (nats)"), (rollouts, "rollout")]
    for column, (x, xlabel) in enumerate(panels):
        ax = fig.add_subplot(1, 2, column + 1)
        style = dict(lw=0.6, alpha=0.5) if column == 0 else dict(lw=1.2)
        ax.plot(x, [h["utility"] for h in history], "o-", color="tab:blue", ms=3, label="held-out utility",
                **style)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel("held-out utility", color="tab:blue", fontsize=8)
        proxy_ax = ax.twinx()
        proxy_ax.plot(x, [h["proxy"] for h in history], "s--", color="tab:red", ms=3, label="proxy reward",
                      **style)
        proxy_ax.set_ylabel("proxy reward (training RM, calibrated)", color="tab:red", fontsize=8)
        if best_index is not None and 0 <= best_index < len(history):
            best = history[best_index]
            ax.axvline(x[best_index], color="gray", ls=":", lw=1)
            ax.plot([x[best_index]], [best["utility"]], marker="*", color="black", ms=12, ls="none",
                    label=f"kept: rollout {rollouts[best_index]}")
        if column == 0:
            handles, labels = ax.get_legend_handles_labels()
            proxy_handles, proxy_labels = proxy_ax.get_legend_handles_labels()
            ax.legend(handles + proxy_handles, labels + proxy_labels, loc="best", fontsize=7)
        for a in (ax, proxy_ax):
            a.tick_params(labelsize=7)
    fig.suptitle(title, fontsize=9)
    return save_png(fig, path)


def plot_utility_vs_kl(rows: Sequence[dict], curve: Sequence[tuple[int, float, float]], path: str | Path,
                       baseline: str, gold_curve: Sequence[tuple[int, float, float]] | None = None) -> Path:
    """Gold utility against KL to the reference (nats per sequence): the BoN curve ``(n, kl, gold)`` under the
    proxy, under gold when ``gold_curve`` is given (the oracle selection), and one point per policy row (with its
    bootstrap interval)."""
    fig = figure((7.0, 4.6) if gold_curve else (6.0, 4.0))
    ax = fig.add_subplot(1, 1, 1)
    if gold_curve:
        ax.plot([c[1] for c in gold_curve], [c[2] for c in gold_curve], "--", color="black", lw=1.0,
                label=f"Best-of-N under gold from {baseline} (oracle selection)")
    if curve:
        ax.plot([c[1] for c in curve], [c[2] for c in curve], "-", color="gray", lw=1.2,
                label=f"Best-of-N from {baseline}, N = 1..{curve[-1][0]} (KL = log N - (N-1)/N)")
        for n, kl, gold in curve:
            if n in (1, 2, 4, 8, 16, 32, 64):
                ax.annotate(f"N={n}", (kl, gold), fontsize=6, color="gray", textcoords="offset points",
                            xytext=(2, -8))
    for i, row in enumerate(rows):
        if row.get("gold") is None:
            continue
        lo, hi = row["gold_ci"]
        ax.errorbar([row["kl_seq"]], [row["gold"]], yerr=[[row["gold"] - lo], [hi - row["gold"]]], fmt="o",
                    ms=5, capsize=3, color=f"C{i}", label=row["policy"])
    ax.set_xlabel("KL to the reference (nats per sequence; k1 sample mean, BoN analytic)", fontsize=8)
    ax.set_ylabel("held-out gold utility (95% prompt bootstrap)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6, loc="best")
    ax.set_title("utility vs KL", fontsize=9)
    return save_png(fig, path)
