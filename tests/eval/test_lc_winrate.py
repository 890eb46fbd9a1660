"""Length-controlled win rate: the logistic fit against closed-form maximum-likelihood solutions."""

import math

import pytest
import torch

from lrlhf.eval.lc_winrate import fit_logistic, length_controlled_win_rate


def _data():
    # 5 prompts where A is 3 tokens longer (4 wins, 1 loss) and 2 where A is 1 token shorter (1 win, 1 loss)
    a = [1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    b = [0.0] * 4 + [1.0, 0.0, 1.0]
    len_a = [13] * 5 + [9] * 2
    len_b = [10] * 7
    return a, b, len_a, len_b


def test_two_length_differences_fit_exactly_and_the_rate_is_read_at_zero():
    # two distinct x values and two parameters: the MLE fits both groups' win fractions exactly:
    # sigmoid(a + 3 c) = 0.8 and sigmoid(a - c) = 0.5 (c = slope per token) -> c = log(4) / 4, a = log(4) / 4
    lc = length_controlled_win_rate(*_data(), n_resamples=200)
    a_hat = math.log(4) / 4
    assert lc.rate == pytest.approx(1 / (1 + math.exp(-a_hat)), abs=1e-9)  # 0.5858 = sqrt(2) / (1 + sqrt(2))
    assert lc.raw == pytest.approx(5 / 7, abs=1e-12)  # the uncontrolled preference: 5 wins of 7
    assert lc.scale == pytest.approx(math.sqrt((5 * 9 + 2 * 1) / 7), abs=1e-12)
    assert lc.slope == pytest.approx(math.log(4) / 4 * lc.scale, abs=1e-9)  # per `scale` tokens
    assert lc.n == 7 and lc.prompts == 7
    lo, hi = lc.interval
    assert lo <= lc.rate <= hi


def test_ties_count_half_and_equal_lengths_give_the_raw_rate():
    # every length difference 0: no slope to fit, the rate is the mean target (1 + 1 + 0.5 + 0) / 4
    lc = length_controlled_win_rate([0.9, 0.8, 0.5, 0.1], [0.1, 0.2, 0.5, 0.7], [5] * 4, [5] * 4, n_resamples=50)
    assert lc.rate == pytest.approx(0.625, abs=1e-9) and lc.raw == pytest.approx(0.625, abs=1e-12)
    assert lc.slope == pytest.approx(0.0, abs=1e-9) and lc.scale == 1.0
    # both below bad_below: both-bad, also 1/2
    lc = length_controlled_win_rate([0.3, 0.9], [0.1, 0.2], [5, 5], [5, 5], bad_below=0.5, n_resamples=50)
    assert lc.rate == pytest.approx(0.75, abs=1e-9)


def test_each_prompt_weighs_the_same():
    a, b, len_a, len_b = _data()
    single = length_controlled_win_rate(a, b, len_a, len_b, n_resamples=100)
    # the first prompt's comparison repeated three times inside that prompt: same fit, same bootstrap
    nested = length_controlled_win_rate([[a[0]] * 3, *a[1:]], [[b[0]] * 3, *b[1:]], [[len_a[0]] * 3, *len_a[1:]],
                                        [[len_b[0]] * 3, *len_b[1:]], n_resamples=100)
    assert nested.rate == pytest.approx(single.rate, abs=1e-9) and nested.n == 9 and nested.prompts == 7
    assert nested.interval == pytest.approx(single.interval, abs=1e-9)


def test_fit_logistic_zero_gradient_and_batched_rows_equal_single_fits():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, generator=g, dtype=torch.float64)
    y = (torch.rand(40, generator=g, dtype=torch.float64) < torch.sigmoid(0.3 + 1.2 * x)).double()
    w = torch.rand(3, 40, generator=g, dtype=torch.float64)
    theta = fit_logistic(x, y, w)
    for r in range(3):
        p = torch.sigmoid(theta[r, 0] + theta[r, 1] * x)
        grad = torch.stack([(w[r] * (y - p)).sum(), (w[r] * (y - p) * x).sum()])
        assert grad.abs().max() < 1e-9  # the maximum-likelihood equations hold
        torch.testing.assert_close(fit_logistic(x, y, w[r:r + 1])[0], theta[r], atol=1e-9, rtol=0)


def test_shape_errors_name_the_problem():
    with pytest.raises(ValueError, match="same prompts"):
        length_controlled_win_rate([1.0], [0.0, 1.0], [1], [1])
    with pytest.raises(ValueError, match="prompt 0"):
        length_controlled_win_rate([[1.0, 0.0]], [[0.0]], [[1, 2]], [[1]])
