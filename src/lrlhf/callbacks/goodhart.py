"""The Goodhart plot (Gao et al. 2022): held-out utility and proxy reward against sqrt(KL to the reference)."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path

from lrlhf.utils.io import atomic_write_bytes


def plot_goodhart(history: Sequence[dict], best_index: int | None, path: str | Path,
                  title: str = "held-out utility vs proxy reward") -> Path:
    """Write a PNG: ``utility`` (left axis) and ``proxy`` (right axis) of each evaluation against
    ``sqrt(max(kl, 0))`` (``kl``: mean per-sequence KL to the reference), in evaluation order, with the
    evaluation ``best_index`` (the kept checkpoint) marked. Uses matplotlib's Agg canvas (no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    x = [math.sqrt(max(h["kl"], 0.0)) for h in history]
    fig = Figure(figsize=(6.0, 3.6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(x, [h["utility"] for h in history], "o-", color="tab:blue", ms=3, lw=1.2, label="held-out utility")
    ax.set_xlabel("sqrt(KL to reference), KL = mean per-sequence sum (nats)")
    ax.set_ylabel("held-out utility", color="tab:blue")
    proxy_ax = ax.twinx()
    proxy_ax.plot(x, [h["proxy"] for h in history], "s--", color="tab:red", ms=3, lw=1.0, label="proxy reward")
    proxy_ax.set_ylabel("proxy reward (calibrated RM)", color="tab:red")
    if best_index is not None and 0 <= best_index < len(history):
        best = history[best_index]
        ax.axvline(x[best_index], color="gray", ls=":", lw=1)
        ax.plot([x[best_index]], [best["utility"]], marker="*", color="black", ms=12, ls="none",
                label=f"kept: rollout {best.get('rollout', best_index)}")
    handles = ax.get_legend_handles_labels()
    proxy_handles = proxy_ax.get_legend_handles_labels()
    ax.legend(handles[0] + proxy_handles[0], handles[1] + proxy_handles[1], loc="best", fontsize=7)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return atomic_write_bytes(path, buffer.getvalue())
