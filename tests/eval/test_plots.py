"""Every plot writes a PNG (Agg canvas, no pyplot state)."""

import pytest

from lrlhf.eval.plots import plot_goodhart, plot_utility_vs_kl

pytest.importorskip("matplotlib")
PNG = b"\x89PNG\r\n\x1a\n"


def test_the_plots_write_pngs(tmp_path):
    history = [{"rollout": 0, "utility": 0.1, "proxy": 0.0, "kl": 0.0},
               {"rollout": 1, "utility": 0.3, "proxy": 0.5, "kl": 1.0},
               {"rollout": 2, "utility": 0.2, "proxy": 0.9, "kl": -0.1}]  # a negative k1 mean is drawn at 0
    assert plot_goodhart(history, 1, tmp_path / "g.png").read_bytes()[:8] == PNG
    rows = [{"policy": "sft", "gold": 0.2, "gold_ci": (0.1, 0.3), "kl_seq": 0.0},
            {"policy": "ppo", "gold": None, "kl_seq": 2.0}]  # a row without gold is left out
    curve = [(1, 0.0, 0.2), (2, 0.31, 0.25)]
    assert plot_utility_vs_kl(rows, curve, tmp_path / "u.png", "sft").read_bytes()[:8] == PNG
