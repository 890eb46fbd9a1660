"""The frontier's curves and gaps (lrlhf.eval.frontier, #31) against hand-computed cases."""

import math

import pytest

from lrlhf.eval.best_of_n import bon_kl
from lrlhf.eval.frontier import MAX_POOL, beyond_the_curves, curve_at, gap_to_curve, mean_curve, per_prompt_curves


def test_curves_by_hand():
    # one prompt, a pool of 3: proxy ranks c > a > b, gold 0.0 / 1.0 / 0.5
    proxy, gold = [[0.5, 0.1, 0.9]], [[0.0, 1.0, 0.5]]
    by_proxy = per_prompt_curves(proxy, gold, 3)[0]
    # N=1: the mean; N=2: pairs (a,b)->a 0, (a,c)->c .5, (b,c)->c .5; N=3: c
    assert by_proxy == pytest.approx([0.5, 1 / 3, 0.5])
    by_gold = per_prompt_curves(gold, gold, 3)[0]
    assert by_gold == pytest.approx([0.5, (1.0 + 0.5 + 1.0) / 3, 1.0])  # the oracle picks the best gold
    assert mean_curve([by_gold, [0.0, 0.0, 0.0]]) == [(1, 0.0, 0.25), (2, bon_kl(2), 2.5 / 6), (3, bon_kl(3), 0.5)]


def test_curve_at_interpolates_in_kl_and_stops_at_the_end():
    curve = [0.2, 0.6, 0.9]
    assert curve_at(curve, 0.0) == 0.2 and curve_at(curve, -0.1) == 0.2
    assert curve_at(curve, bon_kl(2)) == pytest.approx(0.6)
    mid = (bon_kl(2) + bon_kl(3)) / 2
    assert curve_at(curve, mid) == pytest.approx(0.75)
    assert curve_at(curve, bon_kl(2) / 4) == pytest.approx(0.2 + 0.4 / 4)
    assert curve_at(curve, bon_kl(3) + 1e-9) is None


def test_gap_is_paired_over_prompts():
    curves = [[0.0, 1.0], [0.5, 0.5]]
    mean, (lo, hi) = gap_to_curve([0.6, 0.4], curves, bon_kl(2) / 2, n_resamples=200)
    assert mean == pytest.approx(((0.6 - 0.5) + (0.4 - 0.5)) / 2) and lo <= mean <= hi
    assert gap_to_curve([0.6, 0.4], curves, math.log(3)) is None


def test_a_wandb_logger_gets_the_table_both_best_of_n_curves_and_the_goodhart_curve():
    from lrlhf.eval.harness import GOODHART_COLUMNS, _log

    class Logger:  # the WandbLogger methods the harness calls
        def __init__(self):
            self.tables, self.images = {}, {}

        def log_hyperparams(self, params):
            pass

        def log_metrics(self, metrics):
            pass

        def log_table(self, key, columns, data):
            self.tables[key] = (columns, data)

        def log_image(self, key, images):
            self.images[key] = images

        def finalize(self, status):
            pass

    point = {"stage": "ppo_weak_kl-0a1b", "rollout": 5, "global_step": 20, "kl": 4.5, "proxy": 0.3, "utility": 0.6,
             "length": 31.0}
    results = {"bon_curve": [{"n": 1, "kl": 0.0, "gold": 0.5}], "bon_gold_curve": [{"n": 4, "kl": 0.6, "gold": 0.8}],
               "goodhart": [point]}
    logger = Logger()
    _log(logger, [{"policy": "sft", "gold": 0.5}], {"goodhart": "goodhart.png"}, {}, results)
    assert logger.tables["eval/bon_curves"] == (["curve", "n", "kl", "gold"], [["proxy", 1, 0.0, 0.5],
                                                                                 ["gold", 4, 0.6, 0.8]])
    assert logger.tables["eval/goodhart"] == (list(GOODHART_COLUMNS), [[point[c] for c in GOODHART_COLUMNS]])
    assert logger.images == {"eval/goodhart": ["goodhart.png"]}


@pytest.mark.parametrize("kl", [3.382, bon_kl(80), 3.18, 5.0, math.log(MAX_POOL) - 1])
def test_a_policy_beyond_the_curves_is_named_with_the_smallest_pool_that_reaches_it(kl):
    (line,) = beyond_the_curves({"sft": 0.0, "bon64": bon_kl(64), "ppo": kl, "none": None}, 64)
    n = int(line.split("eval.bon.curve_max=")[1].split()[0])
    assert bon_kl(n) >= kl > bon_kl(n - 1) and n > 64  # the smallest N whose KL reaches the policy's
    assert line.startswith(f"eval: ppo's KL {kl:.2f} is beyond the Best-of-N curves (N <= 64: KL <= 3.17)")
    assert gap_to_curve([0.0], [[0.0] * 64], kl) is None  # what the line explains: a blank gap


def test_a_kl_no_pool_reaches_is_said_so():
    (line,) = beyond_the_curves({"weak_kl": 30.0}, 64)
    assert "beyond any pool" in line and "curve_max=" not in line
    assert beyond_the_curves({"ppo": bon_kl(64)}, 64) == []  # on the curve's end: placed
