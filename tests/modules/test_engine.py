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


# ------------------------------------------------------------------------------------- the merged engine
def _perturb_policy(model, seed):
    """Move the policy adapter away from the identity (B = 0 at init), as updates do."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name and ".policy." in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def test_the_merged_engine_is_the_policy_merged_into_a_copy_and_follows_each_sync(world, tokenizer):
    from lrlhf.models.engines import MergedEngine
    from lrlhf.modules.guards import Precision, check_engine_sync

    module = _module(world, tokenizer, parts={"engine": MergedEngine(dtype="float32")})
    engine = module.engine
    assert engine.decoding == module.config.decoding  # the module's decoding, when the engine names none
    batch = _batch(world, tokenizer)
    ids, mask = batch["input_ids"][:4], batch["attention_mask"][:4]
    probe = ids[:, -5:]
    _perturb_policy(module.model, 1)
    engine.sync(module.model)
    assert engine.copy is None  # merged at the first use, under the rollout's autocast state
    trainer = module.policy_forward(ids, mask, probe)[0]
    torch.testing.assert_close(engine.logprobs(ids, mask, probe, 1.0), trainer, atol=1e-4, rtol=0)
    assert engine.copy is not module.model and not engine.reduced
    assert not any("lora_" in n for n, _ in engine.copy.named_parameters())  # one matmul per layer: merged
    assert all(not p.requires_grad for p in engine.copy.parameters())
    with module.model.disable_adapter():
        base = module.policy_forward(ids, mask, probe)[0]
    assert (trainer - base).abs().mean() > 1e-2  # the adapter moves the policy: a copy without it would be seen
    # an update the engine was not synced with: its copy is stale, and the guard says so
    _perturb_policy(module.model, 2)
    full = Precision("32-true", False)
    with pytest.raises(InvariantError, match=r"the rollout engine \(MergedEngine\) disagrees"):
        check_engine_sync(engine, module.policy_forward, ids, mask, 1.0, full, None, rollout=5)
    copied = engine.copy
    engine.sync(module.model)
    assert engine.copy is copied  # the base is copied once; a sync writes the merged layers into it
    assert check_engine_sync(engine, module.policy_forward, ids, mask, 1.0, full, None, rollout=5)["max_gap"] < 1e-4
    # sampling: the copy's log-probs of its own tokens, as the trainer computes them
    torch.manual_seed(0)
    sampled, logprobs = engine.generate(ids, mask, max_new_tokens=6, temperature=1.0,
                                        eos_token_ids=module.eos_token_ids, pad_token_id=module.pad_token_id)
    forward = module.policy_forward(ids, mask, sampled)[0]
    torch.testing.assert_close(forward * (logprobs != 0), logprobs, atol=1e-4, rtol=0)


def test_a_bf16_merged_engine_beside_fp32_weights_has_its_log_probs_recomputed_and_its_rounding_allowed(
        world, tokenizer, tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    from lrlhf.models.engines import MergedEngine

    module = _module(world, tokenizer, parts={"engine": MergedEngine(dtype="bfloat16")})
    assert module.engine.reduced and module.engine.copy is None  # known at the sync, before any merge (self-check)
    rollouts = []
    make = module.make_rollout
    module.make_rollout = lambda batch: rollouts.append(make(batch)) or rollouts[-1]
    trainer = _fit(module, world, tokenizer, 3, tmp_path, logger=CSVLogger(tmp_path))
    assert module.engine.reduced and module.engine.copy.dtype == torch.bfloat16
    auto = _module(world, tokenizer, parts={"engine": MergedEngine()}).engine  # dtype auto: autocast's at the merge
    auto._model()
    assert auto.copy.dtype == torch.float32 and not auto.reduced  # no autocast here: the weights' own
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto.sync(auto.source)
        auto._model()
    assert auto.copy.dtype == torch.bfloat16 and auto.reduced  # bf16 weights beside the fp32 master weights
    assert module.guards.recompute_old_logprobs(module.compute_precision, module.engine)  # auto: on
    for rollout in rollouts:  # mu is the bf16 sampler's; the old log-probs the trainer's fp32 forward
        mask = rollout.action_mask
        assert not torch.equal(rollout.sampler_logprobs[mask], rollout.logprobs[mask])
    gap = trainer.logged_metrics["engine/logprob_gap_mean"].item()
    assert 0 < gap < 0.1, gap  # bf16 rounding, measured and inside the reduced tolerance
    assert module.rollouts_done == 3  # the first-ratio guard held at full precision on the recomputed log-probs


def test_the_merged_engine_refuses_what_it_cannot_merge(world, tokenizer):
    from lrlhf.models.engines import MergedEngine

    with pytest.raises(ValueError, match=r"module.engine.dtype='half16': auto or a torch dtype name"):
        MergedEngine(dtype="half16")
    module = _module(world, tokenizer)
    missing = MergedEngine(adapter="missing")
    missing.sync(module.model)
    ids = _batch(world, tokenizer)["input_ids"][:2]
    with pytest.raises(ValueError, match=r"no LoRA adapter 'missing' to merge"):
        missing.logprobs(ids, torch.ones_like(ids), ids[:, -2:], 1.0)
    engine = MergedEngine(dtype="float32")
    engine.sync(module.model)
    with pytest.raises(ValueError, match=r"a sharded forward \(FSDP\) needs the local engine"):
        engine.generate(ids, torch.ones_like(ids), max_new_tokens=2, temperature=1.0, eos_token_ids=[0],
                        pad_token_id=0, synced=True)


def test_the_merged_copy_follows_each_update_for_the_callbacks_after_the_step(world, tokenizer, tmp_path):
    """Callbacks sample after the update (the held-out evaluation): the copy is merged from the updated weights."""
    import lightning.pytorch as pl

    from lrlhf.models.engines import MergedEngine

    gaps = []

    class AfterTheStep(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            ids, mask = batch["input_ids"][:2], batch["attention_mask"][:2]
            probe = ids[:, -4:]
            gap = pl_module.engine.logprobs(ids, mask, probe, 1.0) - pl_module.policy_forward(ids, mask, probe)[0]
            gaps.append(gap.abs().max().item())

    module = _module(world, tokenizer, parts={"engine": MergedEngine(dtype="float32")})
    _fit(module, world, tokenizer, 3, tmp_path, callbacks=[AfterTheStep()])
    assert len(gaps) == 3 and max(gaps) < 1e-4, gaps  # (the pre-update copy: a gap of the update's size)


def test_the_merged_engine_merges_an_embedding_adapter_and_refuses_a_tied_one(world, tokenizer):
    from peft import LoraConfig, get_peft_model

    from lrlhf.models.engines import MergedEngine

    model = load_causal_lm(ModelConfig(str(world.model)))
    peft = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "embed_tokens"]), adapter_name="policy")
    _perturb_policy(peft, 3)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_embedding_B" in name:
                p.normal_()
    engine = MergedEngine(dtype="float32")
    engine.sync(peft)
    ids = _batch(world, tokenizer)["input_ids"][:2]
    mask = torch.ones_like(ids)
    expected = teacher_forced_logprobs(peft, ids, mask, ids[:, -4:], 1.0)
    with peft.disable_adapter():
        base = teacher_forced_logprobs(peft, ids, mask, ids[:, -4:], 1.0)
    assert (expected - base).abs().max() > 1e-2
    torch.testing.assert_close(engine.logprobs(ids, mask, ids[:, -4:], 1.0), expected, atol=1e-4, rtol=0)
    tied = load_causal_lm(ModelConfig(str(world.model)))
    tied.lm_head.weight = tied.model.embed_tokens.weight  # tied embeddings: one weight, two modules
    tied = get_peft_model(tied, LoraConfig(r=4, target_modules=["embed_tokens"]), adapter_name="policy")
    engine = MergedEngine(dtype="float32")
    engine.sync(tied)
    with pytest.raises(ValueError, match=r"shares its weight with .*lm_head.* \(tied embeddings\)"):
        engine.logprobs(ids, mask, ids[:, -4:], 1.0)
