"""Pairs of a K-way ranking, pairwise accuracy, the margin summary and the bootstrap interval: exact values at ties,
single values and the documented defaults."""

import pytest
import torch

from lrlhf.functional.preferences import margin_summary, pairwise_accuracy, ranking_pairs
from lrlhf.functional.stats import bootstrap_interval


def test_ranking_pairs_orient_better_first_and_keep_row_order_for_ties():
    ranks = torch.tensor([2, 1, 1, 3])
    group = torch.tensor([0, 0, 0, 0])
    first, second, target = ranking_pairs(ranks, group)
    pairs = {(f, s): t for f, s, t in zip(first.tolist(), second.tolist(), target.tolist(), strict=True)}
    assert pairs == {
        (1, 0): 1.0,  # rank 1 beats rank 2: swapped
        (2, 0): 1.0,
        (0, 3): 1.0,
        (1, 2): 0.5,  # a tie keeps the row order
        (1, 3): 1.0,
        (2, 3): 1.0,
    }


def test_ranking_pairs_stay_within_groups():
    first, second, target = ranking_pairs(torch.tensor([1, 1, 2, 1]), torch.tensor([0, 1, 1, 2]))
    assert first.tolist() == [1]
    assert second.tolist() == [2]
    assert target.tolist() == [1.0]


def test_ranking_pairs_are_built_on_the_ranks_device():
    config = pytest.importorskip("torch.fx.experimental._config")
    if not hasattr(config, "meta_nonzero_assume_all_nonzero"):
        pytest.skip("this torch has no meta nonzero")
    ranks = torch.empty(3, dtype=torch.long, device="meta")
    with config.patch(meta_nonzero_assume_all_nonzero=True):
        out = ranking_pairs(ranks, torch.empty(3, dtype=torch.long, device="meta"))
    assert [t.device.type for t in out] == ["meta"] * 3


def test_pairwise_accuracy_is_one_half_or_zero():
    acc = pairwise_accuracy(torch.tensor([-2.0, -0.5, 0.0, 0.5, 1.0]))
    assert acc.tolist() == [0.0, 0.0, 0.5, 1.0, 1.0]


def test_margin_summary_of_float64_margins_matches_an_fp64_reference():
    margins = torch.tensor([0.5, -1.0, 2.0, 3.5, 0.25], dtype=torch.float64)
    out = margin_summary(margins)
    qs = torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95], dtype=torch.float64)
    expected = dict(zip(["q05", "q25", "q50", "q75", "q95"], torch.quantile(margins, qs).tolist(), strict=True))
    expected.update(mean=margins.mean().item(), std=margins.std().item())
    assert out == pytest.approx(expected)


def test_margin_summary_std_is_zero_for_one_margin_and_unbiased_for_two():
    assert margin_summary(torch.tensor([0.7]))["std"] == 0.0
    two = margin_summary(torch.tensor([1.0, 3.0], dtype=torch.float64))
    assert two["std"] == pytest.approx(2.0 ** 0.5)  # deviations 1, 1 -> sum 2 / (2 - 1)


def test_bootstrap_interval_defaults_are_2000_resamples_seed_0_and_95_percent():
    # many distinct units: resampled means rarely tie, so one resample more or less moves the percentiles
    values = [((7 * i) % 23) ** 0.5 for i in range(40)]
    assert bootstrap_interval(values) == bootstrap_interval(values, n_resamples=2000, seed=0, level=0.95)


@pytest.mark.parametrize("level", [0.95, 0.5])
def test_bootstrap_interval_is_the_percentile_interval_of_resampled_means(level):
    values = [0.3, -1.2, 2.0, 0.7, 1.1, -0.4]
    x = torch.tensor(values, dtype=torch.float64)
    g = torch.Generator().manual_seed(3)
    means = x[torch.randint(0, len(values), (500, len(values)), generator=g)].mean(1)
    tail = (1.0 - level) / 2
    lo, hi = bootstrap_interval(values, n_resamples=500, seed=3, level=level)
    assert lo == means.quantile(tail).item()
    assert hi == means.quantile(1.0 - tail).item()


def test_bootstrap_interval_resamples_every_unit():
    # 0 and 1: the resampled means cover both ends, so the interval is not a single point
    lo, hi = bootstrap_interval([0.0, 1.0], n_resamples=200)
    assert lo == 0.0
    assert hi == 1.0


def test_bootstrap_interval_of_one_value_is_that_value():
    assert bootstrap_interval([1.5], n_resamples=50) == (1.5, 1.5)


def test_bootstrap_interval_rejects_no_values():
    with pytest.raises(ValueError, match="^bootstrap_interval needs at least one value$"):
        bootstrap_interval([])


class _Seen(Exception):
    pass


def test_the_margin_summary_asks_its_quantiles_on_the_margins_device(monkeypatch):
    """Quantile levels left on the CPU make ``torch.quantile`` raise beside CUDA margins: both on the margins'
    device (read off the call on meta margins, which hold no values to summarise)."""
    seen = {}

    def spy(values, q, *args, **kwargs):
        seen["devices"] = (values.device.type, q.device.type, q.dtype)
        raise _Seen

    monkeypatch.setattr(torch, "quantile", spy)
    with pytest.raises(_Seen):
        margin_summary(torch.empty(4, dtype=torch.float64, device="meta"))
    assert seen["devices"] == ("meta", "meta", torch.float64)
