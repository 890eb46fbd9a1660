"""PPO's run-time guards and the tests that kill the mutants the older suite let through: the sampler really uses
its KV cache, the first-update ratio and the sampler self-check stop a corrupted run, half precision turns
``recompute_old_logprobs`` on, the rollout draws from ``softmax(logits / T)``, dropout stays off in sampling and
scoring, and the rewards use the frozen calibration. The guards are the module's ``guards`` collaborator
(:class:`lrlhf.modules.guards.PPOGuards`), whose checks are also tested without a module."""

# ruff: noqa: F811 -- the world / tokenizer fixtures come from test_ppo
import lightning.pytorch as pl
import pytest
import torch
from transformers import AutoModelForCausalLM

import lrlhf.models.generation as generation
import lrlhf.utils.compat as compat
from lrlhf.models import LoraSpec, ModelConfig, ScalarModel, load_causal_lm
from lrlhf.models.generation import CacheNotUsedError, sample_with_logprobs
from lrlhf.modules import PPOConfig, PPOModule
from lrlhf.modules.critic import ValueAdapter
from lrlhf.modules.guards import RATIO_TOLERANCE, PPOGuards, Precision, run_precision
from lrlhf.modules.rm import RewardCalibration
from lrlhf.modules.rollout import Sampled
from lrlhf.utils.errors import InvariantError

from .test_ppo import (  # noqa: F401 (fixtures)
    BATCH,
    RecordRatios,
    Stubbed,
    _batch,
    _data,
    _fit,
    _module,
    _snapshot,
    tokenizer,
    world,
)


def _ignored_keyword(monkeypatch):
    """Put back the defect of transformers 5.17 + ``cache=``: the sampler passes its cache under a keyword the
    model does not take, which lands in ``**kwargs`` and is ignored (every decode step sees one token)."""
    monkeypatch.setattr(compat, "cache_keyword", lambda model: "kv_cache_the_model_ignores")


# ------------------------------------------------------------------------------------ the KV-cache keyword
def test_cache_keyword_is_the_one_the_models_forward_takes(world):
    import inspect

    model = load_causal_lm(ModelConfig(str(world.model)))
    expected = next(k for k in compat.CACHE_KEYWORDS if k in inspect.signature(type(model).forward).parameters)
    assert compat.cache_keyword(model) == expected
    assert expected == ("cache" if compat.transformers_version() >= (5, 24) else "past_key_values")
    from lrlhf.models import add_adapters

    assert compat.cache_keyword(add_adapters(model, {"policy": LoraSpec(r=2)})) == expected  # through peft


def test_sampler_refuses_a_cache_the_model_ignores(world, monkeypatch):
    model = load_causal_lm(ModelConfig(str(world.model))).eval()
    ids, mask = torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.long)
    _ignored_keyword(monkeypatch)
    with pytest.raises(CacheNotUsedError, match=r"holds 0 columns after the prefill, expected 3.*kv_cache_the_model"):
        sample_with_logprobs(model, ids, mask, max_new_tokens=4, temperature=1.0, eos_token_ids=[1], pad_token_id=0)


def test_ppo_run_with_the_old_keyword_stops_at_its_first_rollout(world, tokenizer, tmp_path, monkeypatch):
    module = _module(world, tokenizer)
    before = _snapshot(module)
    _ignored_keyword(monkeypatch)
    with pytest.raises(CacheNotUsedError, match="did not use the cache"):
        _fit(module, world, tokenizer, 2, tmp_path)
    assert module.rollouts_done == 0
    assert all(torch.equal(before[n], p) for n, p in _snapshot(module).items())


def test_without_the_cache_check_the_self_check_stops_the_contextless_sampler(world, tokenizer, tmp_path,
                                                                               monkeypatch):
    """The second line of defence: with the cache check gone too, the sampler's log-probs (one token of context)
    disagree with a teacher-forced forward, and the self-check stops the run before the first rollout."""
    module = _module(world, tokenizer)
    _ignored_keyword(monkeypatch)
    monkeypatch.setattr(generation, "_check_cache", lambda *a, **k: 1)
    with pytest.raises(InvariantError, match=r"sampler self-check.*mean \|ratio - 1\| = ") as error:
        _fit(module, world, tokenizer, 2, tmp_path)
    assert "precision 32-true, float32 weights" in str(error.value)
    assert "tolerance of 0.001" in str(error.value)
    assert module.rollouts_done == 0


# ---------------------------------------------------------------------------------- the first-update ratio
class OffPolicySampler(PPOModule):
    """Old log-probs off by 0.2 nats per action in the rollouts (the self-check's short samples are left alone):
    what a sampler/scorer mismatch looks like to the update."""

    def sample(self, query_ids, query_mask, max_new_tokens=None):
        ids, logprobs, values = super().sample(query_ids, query_mask, max_new_tokens)
        return Sampled(ids, logprobs + 0.2 if max_new_tokens is None else logprobs, values)


class OffPolicyEverywhere(PPOModule):
    def sample(self, query_ids, query_mask, max_new_tokens=None):
        ids, logprobs, values = super().sample(query_ids, query_mask, max_new_tokens)
        return Sampled(ids, logprobs + 0.2, values)


def test_the_self_check_runs_a_subclass_sampler_the_rollouts_use(world, tokenizer, tmp_path):
    """One sampling hook: the sampler self-check samples with the subclass's own ``sample``, so a sampler whose
    log-probs are off is stopped before the first rollout."""
    module = _module(world, tokenizer, cls=OffPolicyEverywhere)
    with pytest.raises(InvariantError, match=r"sampler self-check.*mean \|ratio - 1\| = 0\.181"):
        _fit(module, world, tokenizer, 1, tmp_path)
    assert module.rollouts_done == 0


def test_first_update_ratio_guard_stops_before_any_optimiser_step(world, tokenizer, tmp_path):
    module = _module(world, tokenizer, cls=OffPolicySampler)
    before = _snapshot(module)
    with pytest.raises(InvariantError, match=r"at rollout 0 \(first minibatch.*mean \|ratio - 1\| = 0\.181") as err:
        _fit(module, world, tokenizer, 2, tmp_path)
    message = str(err.value)
    for cause in ("KV cache", "temperature", "dropout", "module.config.recompute_old_logprobs",
                  "module.config.first_ratio_tolerance"):
        assert cause in message
    assert all(torch.equal(before[n], p) for n, p in _snapshot(module).items())


def test_first_update_ratio_guard_bound_and_switch_are_config(world, tokenizer, tmp_path):
    loose = _module(world, tokenizer, cls=OffPolicySampler, first_ratio_tolerance=0.25)  # exp(0.2) - 1 = 0.221
    trainer = _fit(loose, world, tokenizer, 1, tmp_path)
    deviation = trainer.callback_metrics["guard/first_ratio_deviation"].item()
    assert deviation == pytest.approx(1 - torch.exp(torch.tensor(-0.2, dtype=torch.float64)).item(), abs=1e-4)
    off = _module(world, tokenizer, cls=OffPolicySampler, check_invariants=False)
    _fit(off, world, tokenizer, 1, tmp_path)
    assert off.rollouts_done == 1
    with pytest.raises(ValueError, match="module.config.first_ratio_tolerance must be > 0"):
        PPOConfig(first_ratio_tolerance=0.0)


def test_a_correct_run_logs_a_first_ratio_deviation_inside_the_full_precision_bound(world, tokenizer, tmp_path):
    module = _module(world, tokenizer)
    trainer = _fit(module, world, tokenizer, 2, tmp_path)
    assert module.rollouts_done == 2
    assert 0 <= trainer.callback_metrics["guard/first_ratio_deviation"].item() <= RATIO_TOLERANCE[False]


# ----------------------------------------------------------------------------------------- precision
def test_half_precision_turns_recompute_on_and_says_so(world, tokenizer, tmp_path, caplog):
    module = _module(world, tokenizer, cls=RecordRatios)
    assert module.config.recompute_old_logprobs is None
    with caplog.at_level("INFO"):
        _fit(module, world, tokenizer, 2, tmp_path, precision="bf16-mixed")
    assert module.compute_precision.reduced and module.compute_precision.label.startswith("precision bf16-mixed")
    assert module.guards.recompute_old_logprobs(module.compute_precision)
    assert "old log-probs are recomputed by a full forward" in caplog.text
    # recomputed by the same full forward the update runs: the first ratio is 1 to the bit under bf16 autocast
    assert len(module.first_log_ratios) == 2
    for log_ratio in module.first_log_ratios:
        assert log_ratio.numel() > 0 and (log_ratio == 0).all()


def test_precision_of_half_weights_and_full_ones(world):
    model = load_causal_lm(ModelConfig(str(world.model)))
    assert run_precision(None, model).reduced is False
    assert run_precision(None, model.to(torch.bfloat16)).reduced is True
    explicit = PPOModule(model, ScalarModel(model), config=PPOConfig(recompute_old_logprobs=False), tokenizer=object())
    explicit.model = model
    assert explicit.guards.recompute_old_logprobs(explicit.compute_precision) is False  # a setting the user wrote wins


# ------------------------------------------------------------------------------- the guards on their own
FULL, REDUCED = Precision("full", reduced=False), Precision("half", reduced=True)


def test_the_recompute_follows_the_setting_or_else_the_precision():
    assert PPOGuards(True, None, None).recompute_old_logprobs(REDUCED) is True
    assert PPOGuards(True, None, None).recompute_old_logprobs(FULL) is False
    assert PPOGuards(True, None, False).recompute_old_logprobs(REDUCED) is False
    assert PPOGuards(True, None, True).recompute_old_logprobs(FULL) is True


def test_the_precision_is_resolved_once_per_fit(world):
    model = load_causal_lm(ModelConfig(str(world.model)))
    guards = PPOGuards(True, None, None)
    first = guards.resolve_precision(None, model)
    assert first.reduced is False and guards.resolve_precision(None, model.to(torch.bfloat16)) is first  # kept
    guards.start_fit()
    assert guards.resolve_precision(None, model).reduced is True and guards.self_check_pending


def test_the_first_ratio_guard_names_the_rollout_and_is_off_with_the_checks():
    logprobs, mask = torch.zeros(2, 3), torch.tensor([[True, True, False], [True, False, False]])
    assert PPOGuards(True, None, None).first_ratio(logprobs, logprobs, mask, FULL, 3) == 0.0
    off_by = logprobs + 0.2
    with pytest.raises(InvariantError, match=r"at rollout 3 \(first minibatch.*tolerance of 0\.001 for full"):
        PPOGuards(True, None, None).first_ratio(logprobs, off_by, mask, FULL, 3)
    loose = PPOGuards(True, 0.25, None).first_ratio(logprobs, off_by, mask, FULL, 3)
    assert loose == pytest.approx(1 - torch.exp(torch.tensor(-0.2, dtype=torch.float64)).item())
    assert PPOGuards(False, None, None).first_ratio(logprobs, off_by, mask, FULL, 3) is None
    assert PPOGuards(True, None, None).first_ratio(logprobs, off_by, mask & False, FULL, 3) is None  # no action


def test_the_sampler_check_runs_once_with_the_hooks_it_is_given():
    ids, mask = torch.tensor([[5, 6], [7, 8]]), torch.ones(2, 2, dtype=torch.long)
    response = torch.tensor([[3, 1], [4, 1]])  # each stops at EOS 1
    calls = []

    def sample(query_ids, query_mask, max_new_tokens):
        calls.append(("sample", query_ids.shape[0], max_new_tokens))
        return Sampled(response, torch.full(response.shape, -1.0))

    def policy_forward(query_ids, query_mask, response_ids):
        calls.append(("forward", query_ids.shape[0]))
        return torch.full(response_ids.shape, -1.5), None

    guards = PPOGuards(True, None, None)
    with pytest.raises(InvariantError, match="sampler self-check"):
        guards.check_sampler(sample, policy_forward, [1], 0, {"input_ids": ids, "attention_mask": mask}, FULL)
    assert calls == [("sample", 2, 8), ("forward", 2)] and not guards.self_check_pending
    calls.clear()
    PPOGuards(False, None, None).check_sampler(sample, policy_forward, [1], 0,
                                               {"input_ids": ids, "attention_mask": mask}, FULL)
    assert calls == []  # checks off: nothing sampled


def test_a_non_finite_loss_stops_naming_the_rollout_and_minibatch():
    PPOGuards.check_loss(torch.tensor(1.0), 0, 0)
    with pytest.raises(FloatingPointError, match=r"non-finite loss \(nan\) at rollout 2, minibatch 5"):
        PPOGuards.check_loss(torch.tensor(float("nan")), 2, 5)


# ----------------------------------------------------------------------------------- surviving mutants
def test_rollout_draws_from_softmax_of_logits_over_the_temperature(world, tokenizer):
    """The rollout's own sampler draws the first response token with probability softmax(logits / 0.7): a sampler
    that draws at T = 1 (and only scores at 0.7) fails by hundreds of sigmas."""
    temperature, n = 0.7, 6000
    module = _module(world, tokenizer, temperature=temperature, max_new_tokens=1)
    batch = _batch(world, tokenizer)
    ids, mask = batch["input_ids"][:1], batch["attention_mask"][:1]
    module.model.eval()
    with torch.no_grad():  # the untrained toy model is near uniform: sharpen it so that T changes the draws
        module.model.get_base_model().lm_head.weight.mul_(10)
    torch.manual_seed(1)
    response, _, _ = module.sample(ids.repeat(n, 1), mask.repeat(n, 1))
    with torch.no_grad():
        logits = module._response_logits(ids, mask, response[:1])[0, 0].double()
    expected = torch.softmax(logits / temperature, dim=-1)
    freq = torch.bincount(response[:, 0], minlength=expected.numel()).double() / n
    sigma = (expected * (1 - expected) / n).sqrt()
    assert ((freq - expected).abs() <= 5 * sigma + 1e-12).all()
    at_one = torch.softmax(logits, dim=-1)
    assert ((freq - at_one).abs() > 5 * sigma).any()  # the test tells the two temperatures apart


def _dropout_module(world, tokenizer, cls, p=0.3):
    """The toy PPO module on a copy of the toy model with attention and LoRA dropout ``p``."""
    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_pretrained(str(world.model), attention_dropout=p)
    reward = ScalarModel(load_causal_lm(ModelConfig(str(world.model))))
    config = PPOConfig(max_new_tokens=8, ppo_epochs=2, minibatch_size=2, forward_batch_size=3, lr=5e-2,
                       policy_lora=LoraSpec(r=4, dropout=p))
    module = cls(policy, reward, tokenizer, config, critic=ValueAdapter(LoraSpec(r=4, dropout=p)))
    module.configure_model()
    return module


class TrainModeRatios(RecordRatios):
    """Records the first ratios and whether any dropout module was in train mode while sampling or scoring."""

    def sample(self, query_ids, query_mask, max_new_tokens=None):
        self.sampled_in_train_mode = any(m.training for m in self.model.modules())
        return super().sample(query_ids, query_mask, max_new_tokens)


class TrainModeBeforeEachBatch(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        pl_module.train()


def test_dropout_is_off_in_sampling_and_scoring_so_the_first_ratio_is_one(world, tokenizer, tmp_path):
    module = _dropout_module(world, tokenizer, TrainModeRatios)
    module.model.train()  # as Lightning leaves it before each epoch
    with torch.no_grad():  # dropout would change the output in train mode: the test can see it
        batch = _batch(world, tokenizer)
        args = batch["input_ids"], batch["attention_mask"], batch["input_ids"][:, -3:]
        assert not torch.equal(module._response_logits(*args), module._response_logits(*args))
    # every batch starts in train mode, as after a validation loop (Lightning restores train mode after one)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, limit_train_batches=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path, callbacks=[TrainModeBeforeEachBatch()])
    trainer.fit(module, datamodule=_data(world, tokenizer))
    assert module.sampled_in_train_mode is False
    assert len(module.first_log_ratios) == 2
    for log_ratio in module.first_log_ratios:
        assert log_ratio.numel() > 0
        torch.testing.assert_close(log_ratio.exp(), torch.ones_like(log_ratio), atol=1e-5, rtol=0)


def test_rewards_use_the_frozen_calibration(world, tokenizer):
    module = _module(world, tokenizer, cls=Stubbed, kl_coef=0.0, forward_batch_size=BATCH)
    module.calibration = RewardCalibration(mean=1.5, std=0.25, count=10)
    eos = tokenizer.eos_token_id
    module.responses = torch.tensor([[eos, eos]] * BATCH)
    module.scores = torch.tensor([1.0, 2.0, 1.5, 0.0])
    rollout = module.make_rollout(_batch(world, tokenizer))
    calibrated = torch.tensor([-2.0, 2.0, 0.0, -6.0])
    torch.testing.assert_close(rollout.raw_scores, module.scores, atol=0, rtol=0)
    torch.testing.assert_close(rollout.scores, calibrated, atol=0, rtol=0)
    torch.testing.assert_close(rollout.rewards[:, 0], calibrated, atol=0, rtol=0)  # the EOS is the terminal action
