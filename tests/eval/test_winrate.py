"""Win / tie / loss / both-bad on hand-made utilities; per-prompt weighting; the prompt-clustered bootstrap."""

import pytest

from lrlhf.eval import bootstrap_interval
from lrlhf.eval.winrate import outcome, win_rate


def test_outcome_by_hand():
    assert outcome(1.0, 0.5) == "win" and outcome(0.5, 1.0) == "loss" and outcome(0.5, 0.5) == "tie"
    assert outcome(0.6, 0.5, tie_band=0.1) == "tie"  # |a - b| = 0.1 <= band: still a tie
    assert outcome(0.61, 0.5, tie_band=0.1) == "win"
    assert outcome(0.1, 0.0, bad_below=0.2) == "both_bad"  # both below: not a win, however large the gap
    assert outcome(0.3, 0.0, bad_below=0.2) == "win"  # only B is bad
    assert outcome(0.2, 0.0, bad_below=0.2) == "win"  # "below" is strict


def test_counts_and_rates_with_a_tie_band_and_a_bad_threshold():
    a = [1.0, 0.5, 0.2, 0.1, 0.9, 0.0]
    b = [0.5, 0.5, 0.25, 0.05, 0.95, 0.8]
    result = win_rate(a, b, tie_band=0.1, bad_below=0.15)
    # 1 vs 0.5 win; 0.5 vs 0.5 tie; 0.2 vs 0.25 tie (gap 0.05); 0.1 and 0.05 both bad; 0.9 vs 0.95 tie;
    # 0 vs 0.8 loss (only A is bad)
    assert result.counts == {"win": 1, "tie": 3, "loss": 1, "both_bad": 1}
    assert result.rates == pytest.approx({"win": 1 / 6, "tie": 1 / 2, "loss": 1 / 6, "both_bad": 1 / 6})
    assert result.n == 6 and result.prompts == 6 and result.net == pytest.approx(0.0)
    # one comparison per prompt: the intervals are the bootstrap of the 0/1 outcome indicators
    assert result.intervals["win"] == bootstrap_interval([1, 0, 0, 0, 0, 0])
    assert result.intervals["net"] == bootstrap_interval([1, 0, 0, 0, 0, -1])


def test_each_prompt_weighs_the_same():
    # prompt 0: three comparisons (win, win, tie); prompt 1: one comparison (loss)
    result = win_rate([[1, 1, 0], [0]], [[0, 0, 0], [1]])
    assert result.counts == {"win": 2, "tie": 1, "loss": 1, "both_bad": 0}
    # per-prompt fractions: win (2/3, 0), tie (1/3, 0), loss (0, 1) -> means 1/3, 1/6, 1/2 (not 2/4, 1/4, 1/4)
    assert result.rates == pytest.approx({"win": 1 / 3, "tie": 1 / 6, "loss": 1 / 2, "both_bad": 0.0})
    assert sum(result.rates.values()) == pytest.approx(1.0)
    assert result.intervals["win"] == bootstrap_interval([2 / 3, 0.0])


def test_the_bootstrap_resamples_prompts_not_comparisons():
    a = [0.9, 0.1, 0.8, 0.7, 0.2, 0.6, 0.9, 0.3]
    b = [0.5] * 8
    single = win_rate(a, b)
    assert single.counts["win"] == 5 and single.counts["loss"] == 3
    lo, hi = single.intervals["win"]
    assert lo < single.rates["win"] < hi
    # ten identical comparisons per prompt add no information: a clustered interval does not shrink
    repeated = win_rate([[x] * 10 for x in a], [[y] * 10 for y in b])
    assert repeated.n == 80 and repeated.intervals == single.intervals
    # ten times the prompts does
    more = win_rate(a * 10, b * 10)
    assert more.intervals["win"][1] - more.intervals["win"][0] < (hi - lo) / 2
    # all wins: every resample has win rate 1
    assert win_rate([1.0, 1.0], [0.0, 0.0]).intervals["win"] == (1.0, 1.0)


def test_rejects_mismatched_inputs():
    with pytest.raises(ValueError, match="A has 2 prompts and B 1"):
        win_rate([1.0, 0.0], [1.0])
    with pytest.raises(ValueError, match="prompt 0: 2 utilities of A and 1 of B"):
        win_rate([[1.0, 0.0]], [[1.0]])
    with pytest.raises(ValueError, match="tie_band must be >= 0"):
        win_rate([1.0], [0.0], tie_band=-0.1)
    with pytest.raises(ValueError, match="at least one prompt"):
        win_rate([], [])
