"""The Goodhart plot (Gao et al. 2022): held-out utility and proxy reward against sqrt(KL to the reference)."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path

from lrlhf.utils.io import atomic_write_bytes


def plot_goodhart(history: Sequence[dict], best_index: int | None, path: str | Path,
                  title: str = "held-out utility vs proxy reward") -> Path:
    """Write a PNG of two panels: ``utility`` (left axis) and ``proxy`` (right axis) of each evaluation against
    ``sqrt(max(kl, 0))`` (``kl``: mean per-sequence KL to the reference; the Goodhart plot), and the same against
    the rollout (KL need not grow monotonically, so the first panel alone can hide the order). The evaluation
    ``best_index`` (the kept checkpoint) is marked in both. Uses matplotlib's Agg canvas (no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.0, 3.4), dpi=90)
    FigureCanvasAgg(fig)
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
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return atomic_write_bytes(path, buffer.getvalue())
