"""A reward mixture's parts (lrlhf.rewards.mixture) with stub sources: what it builds, what each source sees, its
weights and settings, and its calibration state."""

import pytest
import torch
from torch import nn

from lrlhf.functional import ResponseMasks
from lrlhf.rewards.mixture import Mixture
from lrlhf.rewards.protocol import RewardScores, RewardSource


class Stub(RewardSource):
    """Builds ``module`` (None: nothing) and scores every row ``value``, recording what it was handed."""

    def __init__(self, module=None, value=1.0):
        self.module, self.value, self.built, self.metas = module, value, [], []

    def build(self, model, tokenizer):
        self.built.append((model, tokenizer))
        return self.module

    def score(self, query_ids, query_mask, response_ids, masks, meta=None):
        self.metas.append(meta)
        return RewardScores(torch.full((len(query_ids),), self.value))


class Calibrate:
    def __repr__(self):
        return "Calibrate(n=3)"


def _inputs(n=2):
    ids = torch.zeros(n, 2, dtype=torch.long)
    masks = ResponseMasks(*(torch.zeros(n, 2, dtype=torch.bool),) * 2, torch.zeros(n, dtype=torch.long),
                          torch.ones(n, dtype=torch.bool), torch.ones(n, dtype=torch.long))
    return ids, ids, ids, masks


def test_a_mixture_needs_a_part():
    with pytest.raises(ValueError, match="^module.reward_model.parts must name at least one source$"):
        Mixture({})


def test_build_hands_each_source_the_policy_and_keeps_the_modules_built():
    head = nn.Linear(2, 1)
    model, tokenizer = nn.Linear(1, 1), object()
    rm, rule = Stub(module=head), Stub()
    built = Mixture({"rm": {"source": rm}, "rule": {"source": rule}}).build(model, tokenizer)
    assert isinstance(built, nn.ModuleDict) and list(built.keys()) == ["rm"] and built["rm"] is head
    assert rm.built == [(model, tokenizer)] and rule.built == [(model, tokenizer)]
    assert Mixture({"a": {"source": Stub()}, "b": {"source": Stub()}}).build(model, tokenizer) is None


def test_each_source_scores_with_the_records():
    a, b = Stub(value=1.0), Stub(value=2.0)
    mixture = Mixture({"a": {"source": a}, "b": {"source": b, "weight": 0.5}})
    meta = [{"reference": "x"}, {"reference": "y"}]
    parts = mixture.parts_scores(*_inputs(), meta=meta)
    assert a.metas == [meta] and b.metas == [meta]
    assert parts["a"].scores.tolist() == [1.0, 1.0] and parts["b"].scores.tolist() == [2.0, 2.0]


def test_a_part_weighs_one_unless_given_and_the_settings_say_so():
    mixture = Mixture({"a": {"source": Stub()}, "b": {"source": Stub(value=2.0), "weight": 0.5}},
                      calibrate=Calibrate())
    assert mixture.weights == {"a": 1.0, "b": 0.5}
    assert mixture.settings() == {"parts": {"a": {"source": "Stub", "weight": 1.0},
                                            "b": {"source": "Stub", "weight": 0.5}},
                                  "calibrate": "Calibrate(n=3)"}
    raw = Mixture({"a": {"source": Stub(value=3.0)}})
    assert raw.score(*_inputs()).scores.tolist() == [3.0, 3.0]  # the default weight 1 on the raw score
    assert raw.settings()["calibrate"] == "None"


def test_the_calibration_state_round_trips_and_none_clears_it():
    mixture = Mixture({"a": {"source": Stub()}})
    assert mixture.calibration_state() is None
    mixture.load_calibration_state({"a": [0.5, 2]})
    assert mixture.stats == {"a": (0.5, 2.0)} and mixture.calibration_state() == {"a": [0.5, 2.0]}
    mixture.load_calibration_state(None)
    assert mixture.stats is None
    mixture.load_calibration_state({})
    assert mixture.stats is None
