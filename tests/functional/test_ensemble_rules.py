"""The ensemble combination rules and the disagreement, by hand."""

import pytest
import torch

from lrlhf.functional import EnsembleMean, MeanMinusStd, SingleMember, WorstCase, disagreement

# 3 members x 2 samples: sample 0 spread (1, 3, 5), sample 1 agreed (2, 2, 2)
SCORES = torch.tensor([[1.0, 2.0], [3.0, 2.0], [5.0, 2.0]], dtype=torch.float64)


def test_disagreement_is_the_unbiased_std_across_members():
    # sample 0: mean 3, squared deviations 4 + 0 + 4 = 8, over N - 1 = 2: variance 4, std 2
    assert disagreement(SCORES).tolist() == [2.0, 0.0]
    assert disagreement(SCORES[:1]).tolist() == [0.0, 0.0]  # one member: no disagreement


def test_rules_by_hand():
    assert EnsembleMean()(SCORES).tolist() == [3.0, 2.0]
    assert MeanMinusStd(0.5)(SCORES).tolist() == [3.0 - 0.5 * 2.0, 2.0]
    assert MeanMinusStd(0.0)(SCORES).tolist() == EnsembleMean()(SCORES).tolist()
    assert WorstCase()(SCORES).tolist() == [1.0, 2.0]
    assert SingleMember(1)(SCORES).tolist() == [3.0, 2.0]


def test_conservative_rules_never_exceed_the_mean_and_rank_agreed_samples_higher():
    torch.manual_seed(0)
    scores = torch.randn(5, 64, dtype=torch.float64)
    mean = EnsembleMean()(scores)
    assert (MeanMinusStd(1.0)(scores) <= mean).all() and (WorstCase()(scores) <= mean).all()
    # the spread sample has the higher mean (3 against 2.5); the agreed one wins under both conservative rules
    pair = torch.tensor([[0.0, 2.0], [6.0, 3.0], [3.0, 2.5]], dtype=torch.float64)  # means 3, 2.5
    assert EnsembleMean()(pair)[0] > EnsembleMean()(pair)[1]
    assert MeanMinusStd(1.0)(pair)[0] < MeanMinusStd(1.0)(pair)[1]
    assert WorstCase()(pair)[0] < WorstCase()(pair)[1]


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="members, batch"):
        EnsembleMean()(torch.zeros(4))
    with pytest.raises(ValueError, match="coef must be >= 0"):
        MeanMinusStd(-1.0)
    with pytest.raises(ValueError, match="ensemble of 3 members"):
        SingleMember(3)(SCORES)


def test_an_ensemble_without_members_is_refused():
    with pytest.raises(ValueError, match="^an ensemble needs at least one member$"):
        EnsembleMean()(torch.zeros(0, 3))
    with pytest.raises(ValueError, match="^an ensemble needs at least one member$"):
        disagreement(torch.zeros(0, 3))


def test_default_rules_and_their_names():
    # MeanMinusStd() subtracts one std; SingleMember() is the first member
    assert MeanMinusStd()(SCORES).tolist() == [3.0 - 2.0, 2.0]
    assert SingleMember()(SCORES).tolist() == [1.0, 2.0]
    assert EnsembleMean().describe() == "EnsembleMean" and WorstCase().describe() == "WorstCase"


def test_single_member_takes_any_index_below_the_member_count():
    # member 0 and the last member (index 2 of 3, beyond the batch size 2) are valid
    assert SingleMember(0)(SCORES).tolist() == [1.0, 2.0]
    assert SingleMember(2)(SCORES).tolist() == [5.0, 2.0]
    wide = torch.arange(8, dtype=torch.float64).reshape(2, 4)  # 2 members x 4 samples
    with pytest.raises(ValueError, match=r"SingleMember\(index=2\) of an ensemble of 2 members"):
        SingleMember(2)(wide)
    with pytest.raises(ValueError, match="index must be >= 0, got -1"):
        SingleMember(-1)
