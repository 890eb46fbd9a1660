"""The rollout-engine seam (issue #46 item 4): the shipped engine samples as the sampler does, and after every
weight sync the engine is checked against the policy being trained: an engine that lost the policy adapter, or
whose copy of the weights was never synced, stops the run at the rollout where it first differs, naming the gap."""

# ruff: noqa: F811 -- the world / tokenizer fixtures come from test_ppo
import copy

import pytest
import torch

from lrlhf.models import ModelConfig, load_causal_lm
from lrlhf.models.decoding import _CACHES
from lrlhf.models.engines import LocalEngine, RolloutEngine, teacher_forced_logprobs
from lrlhf.models.generation import sample_with_logprobs
from lrlhf.utils.errors import InvariantError

from .test_ppo import _batch, _fit, _module, _snapshot, tokenizer, world  # noqa: F401 (fixtures)


def test_the_local_engine_samples_as_the_sampler_and_scores_as_a_forward(world, tokenizer):
    model = load_causal_lm(ModelConfig(str(world.model))).eval()
    batch = _batch(world, tokenizer)
    ids, mask = batch["input_ids"][:4], batch["attention_mask"][:4]
    engine = LocalEngine(decoding="static", bucket=8)
    assert isinstance(engine, RolloutEngine)
    with pytest.raises(RuntimeError, match="call sync"):
        engine.logprobs(ids, mask, ids[:, -3:], 1.0)
    engine.sync(model)
    kwargs = dict(max_new_tokens=6, temperature=1.0, eos_token_ids=[tokenizer.eos_token_id], pad_token_id=0)
    torch.manual_seed(3)
    got = engine.generate(ids, mask, **kwargs)
    torch.manual_seed(3)
    expected = sample_with_logprobs(model, ids, mask, decoding="static", bucket=8, **kwargs)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert model in _CACHES
    # teacher-forced: the log-probs the sampler drew its own tokens with (fp32)
    torch.testing.assert_close(engine.logprobs(ids, mask, got[0], 1.0) * (got[1] != 0), got[1], atol=1e-5, rtol=0)
    engine.free()
    assert model not in _CACHES
    with pytest.raises(ValueError, match=r"module.config.decoding='fast'; choose one of auto, eager"):
        LocalEngine(decoding="fast")


class AdapterLost(LocalEngine):
    """An engine that samples from the base: its policy adapter is gone (disabled), as after a bad sync."""

    def generate(self, *args, **kwargs):
        with self.model.disable_adapter():
            return super().generate(*args, **kwargs)

    def logprobs(self, *args, **kwargs):
        with self.model.disable_adapter():
            return super().logprobs(*args, **kwargs)


class NeverSynced(LocalEngine):
    """An engine with its own copy of the weights, taken once: later syncs never reach it."""

    def sync(self, model):
        if self.model is None:
            self.model = copy.deepcopy(model)


@pytest.mark.parametrize("engine", [AdapterLost(), NeverSynced()], ids=["adapter lost", "never synced"])
def test_an_engine_that_samples_other_weights_stops_the_run_after_the_sync(world, tokenizer, tmp_path, engine):
    module = _module(world, tokenizer)
    module.engine = engine
    with pytest.raises(InvariantError, match=rf"the rollout engine \({type(engine).__name__}\) disagrees with the "
                                             r"policy being trained after the weight sync of rollout 1: its "
                                             r"log-probs of 16 fixed tokens differ .* nats on average"):
        _fit(module, world, tokenizer, 3, tmp_path)
    assert module.rollouts_done == 1  # rollout 0 ran (the adapter starts as the identity); rollout 1 did not


def test_the_guard_measures_every_rollout_of_a_correct_run(world, tokenizer, tmp_path, monkeypatch):
    import lrlhf.modules.guards as guards

    gaps = []
    check = guards.check_engine_sync
    monkeypatch.setattr(guards, "check_engine_sync", lambda *a, **k: gaps.append(check(*a, **k)) or gaps[-1])
    module = _module(world, tokenizer)
    before = _snapshot(module) if module.model is not None else None
    _fit(module, world, tokenizer, 3, tmp_path)
    assert len(gaps) == 3 and all(g["max_gap"] < 1e-4 for g in gaps), gaps  # the same model: rounding only
    assert before is None or any(not torch.equal(before[n], p) for n, p in _snapshot(module).items())
    model = module.model
    ids = _batch(world, tokenizer)["input_ids"][:2]
    mask = torch.ones_like(ids)
    torch.testing.assert_close(teacher_forced_logprobs(model, ids, mask, ids[:, -4:], 1.0),
                               module.policy_forward(ids, mask, ids[:, -4:])[0], atol=1e-5, rtol=0)
