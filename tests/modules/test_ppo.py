"""PPOModule: alignment, reference, adapter isolation, terminal rewards, frozen rollouts, hooks, guards, fit."""

import math
import re

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from lrlhf.data.datamodules import PromptDataModule
from lrlhf.data.toy import WorldSizes, build_world
from lrlhf.functional import FixedKLController, ResponseMasks
from lrlhf.models import LoraSpec, ModelConfig, ScalarModel, load_causal_lm
from lrlhf.modules import PPOConfig, PPOModule
from lrlhf.modules.advantages import GAE, GRPO, RLOO
from lrlhf.modules.critic import ValueAdapter
from lrlhf.modules.rollout import Sampled

BATCH = 4


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    sizes = WorldSizes(sft_train=4, sft_val=4, pref_train=2, pref_val=2, pref_test=2, rl=16, eval=4)
    return build_world(tmp_path_factory.mktemp("toy"), seed=0, sizes=sizes)


@pytest.fixture(scope="module")
def tokenizer(world):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(world.tokenizer)


def _data(world, tokenizer, batch_size=BATCH):
    return PromptDataModule(tokenizer, train=str(world.rl_prompts), batch_size=batch_size, max_length=64)


def _batch(world, tokenizer):
    data = _data(world, tokenizer)
    data.setup("fit")
    return next(iter(data.train_dataloader()))


def _module(world, tokenizer, cls=PPOModule, advantage=None, critic=None, kl_coef=0.05, reward=None, parts=None,
            **overrides):
    """The toy PPO module: GAE and a ``value`` adapter of rank 4 unless ``advantage`` / ``critic`` say otherwise; the
    reward a random-head reward model on the toy model unless ``reward`` names another; ``parts``: more components
    by keyword (``policy_loss``, ``kl_penalty``, ``off_policy``, ``overlong``)."""
    config = dict(max_new_tokens=8, ppo_epochs=2, minibatch_size=2, forward_batch_size=3, lr=5e-2,
                  policy_lora=LoraSpec(r=4))
    config.update(overrides)
    advantage = advantage or GAE()
    if critic is None and advantage.needs_critic:
        critic = ValueAdapter(LoraSpec(r=4))
    torch.manual_seed(0)
    reward = reward if reward is not None else ScalarModel(load_causal_lm(ModelConfig(str(world.model))))
    module = cls(load_causal_lm(ModelConfig(str(world.model))), reward, tokenizer, PPOConfig(**config),
                 advantage=advantage, critic=critic, kl_controller=FixedKLController(kl_coef), **(parts or {}))
    module.configure_model()
    return module


def _fit(module, world, tokenizer, rollouts, tmp_path, logger=False, **kw):
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, limit_train_batches=rollouts, logger=logger,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         log_every_n_steps=1, default_root_dir=tmp_path, **kw)
    trainer.fit(module, datamodule=_data(world, tokenizer))
    return trainer


def _snapshot(module):
    return {n: p.detach().clone() for n, p in module.model.named_parameters()}


# ------------------------------------------------------------------------------------------- alignment
class RecordRatios(PPOModule):
    """Records ``logprobs - old_logprobs`` on valid actions at the first minibatch of each rollout."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.first_log_ratios, self._seen = [], set()

    def policy_loss(self, logprobs, old_logprobs, advantages, action_mask):
        if self.rollouts_done not in self._seen:
            self._seen.add(self.rollouts_done)
            self.first_log_ratios.append((logprobs - old_logprobs)[action_mask.bool()].detach())
        return super().policy_loss(logprobs, old_logprobs, advantages, action_mask)


def test_first_update_ratio_is_one_for_every_token(world, tokenizer, tmp_path):
    batch = _batch(world, tokenizer)
    assert len(set(batch["prompt_lengths"].tolist())) > 1, "the test needs left padding of different lengths"
    module = _module(world, tokenizer, cls=RecordRatios)
    _fit(module, world, tokenizer, 2, tmp_path)
    # two rollouts: the second starts from adapters the first update moved (not the zero-init LoRA)
    assert len(module.first_log_ratios) == 2
    for log_ratio in module.first_log_ratios:
        assert log_ratio.numel() > 0
        torch.testing.assert_close(log_ratio.exp(), torch.ones_like(log_ratio), atol=1e-5, rtol=0)


def test_logprobs_at_temperature_07_match_a_direct_computation(world, tokenizer):
    module = _module(world, tokenizer, temperature=0.7, max_new_tokens=10)
    with torch.no_grad():  # a non-zero policy adapter, so the policy differs from the base
        for name, p in module.model.named_parameters():
            if "lora_B" in name and ".policy." in name:
                p.normal_(0, 0.3)
    batch = _batch(world, tokenizer)
    torch.manual_seed(1)
    rollout = module.make_rollout(batch)
    masks = rollout.masks
    assert masks.lengths.min() > 0
    module.model.set_adapter("policy")
    for row in range(len(rollout)):
        # each row alone, unpadded: the exact prompt ids then the sampled ids up to the stop
        prompt = rollout.query_ids[row][rollout.query_mask[row].bool()]
        n = int(masks.lengths[row])
        ids = torch.cat([prompt, rollout.response_ids[row, :n]])[None]
        with torch.no_grad():
            logits = module.model(input_ids=ids).logits[0]
        direct = torch.log_softmax(logits[len(prompt) - 1:len(prompt) - 1 + n] / 0.7, dim=-1)
        direct = direct.gather(-1, rollout.response_ids[row, :n, None]).squeeze(-1)
        torch.testing.assert_close(rollout.logprobs[row, :n], direct, atol=1e-5, rtol=0)
    # (the sampler's draws follow these probabilities: tests/models/test_generation.py)


# ------------------------------------------------------------------------------- roles and adapters
def test_reference_is_a_separately_loaded_frozen_base_and_adapters_train_in_isolation(world, tokenizer, tmp_path):
    module = _module(world, tokenizer)
    before = _snapshot(module)
    head_before = module.critic.head.linear.weight.detach().clone()
    _fit(module, world, tokenizer, 2, tmp_path)
    after = _snapshot(module)
    base_names = [n for n in after if "lora_" not in n]
    assert base_names and all(torch.equal(after[n], before[n]) for n in base_names)  # bit for bit
    for adapter in ("policy", "value"):
        names = [n for n in after if "lora_B" in n and f".{adapter}." in n]
        assert names and any(not torch.equal(after[n], before[n]) for n in names), adapter
    assert not torch.equal(module.critic.head.linear.weight, head_before)
    assert not any(p.requires_grad for p in module.reward_model.parameters())

    # the reference (adapters disabled) equals a separately loaded base; the policy no longer does
    rollout = module.make_rollout(_batch(world, tokenizer))
    fresh = load_causal_lm(ModelConfig(str(world.model))).eval()
    ids, mask, pos = module._sequence(rollout.query_ids, rollout.query_mask, rollout.response_ids)
    with torch.no_grad():
        hidden = fresh.model(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
        logits = fresh.lm_head(hidden)
    p = rollout.query_ids.shape[1]
    expected = torch.log_softmax(logits[:, p - 1:-1], -1).gather(-1, rollout.response_ids[..., None]).squeeze(-1)
    valid = rollout.action_mask
    # the same trunk; the LM head (on the kept columns vs all) and the log-softmax kernels differ. Each side's
    # logits are dot products of length H (at most H u sum_i |h_i W_vi| off), its log-softmax adds u times the
    # terms it subtracts (logit, max, log-sum-exp) and (V + 2) u for the sum of V exponentials
    z, u = logits[:, p - 1:-1].double(), 2.0**-24
    head = (hidden[:, p - 1:-1].abs() @ fresh.lm_head.weight.abs().T).amax(-1).double()
    tol = 2 * u * (hidden.shape[-1] * head + 4 * z.abs().amax(-1) + 2 * torch.logsumexp(z, -1).abs() + z.shape[-1] + 4)
    assert ((rollout.ref_logprobs - expected).abs() <= tol)[valid].all()
    assert (rollout.logprobs[valid] - expected[valid]).abs().max() > 1e-3


# --------------------------------------------------------------------------------- terminal rewards


class Stubbed(PPOModule):
    """Fixed responses and fixed scores: ``responses`` (B, R) and ``scores`` (B,)."""

    responses: torch.Tensor
    scores: torch.Tensor

    def sample(self, query_ids, query_mask, max_new_tokens=None):
        return Sampled(self.responses)  # no log-probs: a scoring forward computes them

    def score(self, query_ids, query_mask, response_ids, masks: ResponseMasks):
        return self.scores[:query_ids.shape[0]] if len(self.scores) == query_ids.shape[0] else self._chunk_scores()

    def _chunk_scores(self):
        raise AssertionError("forward_batch_size must cover the batch in this test")


def test_terminal_score_added_once_at_the_last_valid_action(world, tokenizer):
    eos = tokenizer.eos_token_id
    w = tokenizer.convert_tokens_to_ids(tokenizer.tokenize("1")[0])
    module = _module(world, tokenizer, cls=Stubbed, kl_coef=0.0, forward_batch_size=BATCH, missing_eos_penalty=0.5,
                     advantage=GAE(lam=1.0))
    module.responses = torch.tensor([
        [w, eos, w, eos],   # EOS mid-sequence -> terminal 1 (the rest is after the stop)
        [w, w, w, eos],     # EOS at the last slot -> terminal 3
        [w, w, w, w],       # no EOS (truncated) -> terminal 3, penalised
        [eos, eos, eos, eos],  # an empty text: only the EOS action -> terminal 0
    ])  # fmt: skip
    module.scores = torch.tensor([1.0, 2.0, 3.0, 4.0])
    rollout = module.make_rollout(_batch(world, tokenizer))
    expected = torch.zeros(4, 4)
    expected[0, 1], expected[1, 3], expected[2, 3], expected[3, 0] = 1.0, 2.0, 3.0 - 0.5, 4.0
    torch.testing.assert_close(rollout.rewards, expected, atol=0, rtol=0)
    assert rollout.masks.terminal_index.tolist() == [1, 3, 3, 0]
    assert rollout.masks.has_eos.tolist() == [True, True, False, True]
    # GAE with gamma = lambda = 1 and values 0 (zero head): returns are the undiscounted return-to-go
    torch.testing.assert_close(rollout.returns, expected.flip(1).cumsum(1).flip(1) * rollout.action_mask)
    stats = module.rollout_stats(rollout)
    assert stats["rollout/truncated"] == 1.0 and stats["rollout/eos_rate"] == 0.75


def test_empty_responses_get_no_reward_and_skip_the_update(world, tokenizer):
    module = _module(world, tokenizer, cls=Stubbed, forward_batch_size=BATCH)
    module.responses = torch.zeros(BATCH, 0, dtype=torch.long)
    module.scores = torch.ones(BATCH)
    rollout = module.make_rollout(_batch(world, tokenizer))
    assert rollout.rewards.shape == (BATCH, 0) and rollout.masks.terminal_index.tolist() == [-1] * BATCH
    assert module.rollout_stats(rollout)["rollout/length_mean"] == 0.0


# ------------------------------------------------------------------------------------ frozen rollout
class CheckFrozen(PPOModule):
    def update(self, rollout):
        before = {k: v.clone() for k, v in rollout.tensors().items()}
        out = super().update(rollout)
        self.unchanged = all(torch.equal(before[k], v) for k, v in rollout.tensors().items())
        return out


def test_rollout_tensors_identical_before_and_after_the_update_epochs(world, tokenizer, tmp_path):
    module = _module(world, tokenizer, cls=CheckFrozen)
    _fit(module, world, tokenizer, 1, tmp_path)
    assert module.unchanged


# ------------------------------------------------------------------------------------- hooks, guards
class ConstantScore(PPOModule):
    def score(self, query_ids, query_mask, response_ids, masks):
        return torch.full((query_ids.shape[0],), 3.0)


def test_a_subclass_hook_is_used_by_the_loop(world, tokenizer, tmp_path):
    module = _module(world, tokenizer, cls=ConstantScore)
    trainer = _fit(module, world, tokenizer, 1, tmp_path)
    assert trainer.callback_metrics["rollout/score_raw"].item() == 3.0
    assert trainer.callback_metrics["rollout/score"].item() == 3.0


def test_the_module_optimises_its_policy_loss_object(world, tokenizer, tmp_path):
    """``module.policy_loss`` is what the update minimises: a recording objective sees every minibatch, and a
    module without one is PPO's clip at 0.2 on the token mean (the default recipes name it explicitly)."""
    from lrlhf.functional import ClipHigher, ClipPPO, TokenMean

    calls = []

    class Recording(ClipHigher):
        def __call__(self, *args):
            calls.append(args[0].shape)
            return super().__call__(*args)

    module = _module(world, tokenizer)
    assert module.surrogate == ClipPPO(0.2, TokenMean())
    assert module.hparams["policy_loss"] == {"_target_": "lrlhf.functional.policy_losses.ClipPPO", "clip_eps": 0.2,
                                             "aggregation": {"_target_": "lrlhf.functional.policy_losses.TokenMean"}}
    module = _module(world, tokenizer)
    module.surrogate = Recording(0.2, 0.28)
    trainer = _fit(module, world, tokenizer, 1, tmp_path)
    assert len(calls) == trainer.global_step > 0  # one call per optimiser step (no early stop)
    with pytest.raises(ValueError, match="module.policy_loss must be a PolicyLoss"):
        PPOModule(load_causal_lm(ModelConfig(str(world.model))), "unused", tokenizer, PPOConfig(max_new_tokens=8),
                  policy_loss=lambda *a: None)


class NanScore(PPOModule):
    def score(self, query_ids, query_mask, response_ids, masks):
        return torch.full((query_ids.shape[0],), float("nan"))


def test_non_finite_reward_stops_before_any_optimiser_step(world, tokenizer, tmp_path):
    module = _module(world, tokenizer, cls=NanScore)
    before = _snapshot(module)
    with pytest.raises(FloatingPointError, match="non-finite raw_scores in rollout 0"):
        _fit(module, world, tokenizer, 1, tmp_path)
    after = _snapshot(module)
    assert all(torch.equal(after[n], before[n]) for n in after)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [({"temperature": 0.0}, "module.config.temperature must be > 0"),
     ({"max_new_tokens": 0}, "module.config.max_new_tokens must be >= 1"),
     ({"decoding": "fast"}, "module.config.decoding must be one of auto, eager, static, compiled")],
)
def test_config_errors_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=re.escape(key)):
        PPOConfig(**kwargs)


# ---------------------------------------------------------------------------------------------- fit
@pytest.mark.parametrize("estimator", ["rloo", "grpo"])
def test_group_estimators_train_without_a_critic(world, tokenizer, tmp_path, estimator):
    advantage = {"rloo": RLOO, "grpo": GRPO}[estimator](samples_per_prompt=2)
    module = _module(world, tokenizer, advantage=advantage, ppo_epochs=1)
    assert module.critic is None and "value" not in module.model.peft_config and module.policy_name == estimator
    rollout = module.make_rollout(_batch(world, tokenizer))
    assert torch.equal(rollout.query_ids[0::2], rollout.query_ids[1::2])  # a prompt's two samples are adjacent
    # The expectation in fp64 from the rollout's own per-action rewards: each pair's sequence rewards r (P, 2),
    # RLOO r_i - r_j, GRPO (r_i - mean) / (std + 1e-6) (grpo_advantages' eps) = +-s / (sqrt(2) (s + 1e-6)).
    mask = rollout.action_mask
    rewards = torch.where(mask, rollout.rewards, 0).double()
    r = rewards.sum(1).reshape(-1, 2)
    s = r.std(1, keepdim=True)
    expected = r - r.flip(1) if estimator == "rloo" else (r - r.mean(1, keepdim=True)) / (s + 1e-6)
    # The module does this in fp32: its sum of a row's T rewards is off by at most (T - 1) u sum_t |reward_t|
    # (u = 2^-24), the pair's mean and difference by a few u |r| more; RLOO passes that error d of the pair on
    # as is, GRPO divides it by s + eps (so a pair of near-equal rewards, s ~ 1e-3, magnifies it ~1e3) and
    # rounds its own quotient (a few u |A|). Bound with a factor 4 to spare.
    u = 2.0**-24
    d = (mask.sum(1) * u * rewards.abs().sum(1) + 2 * u * rewards.sum(1).abs()).reshape(-1, 2).sum(1, keepdim=True)
    tol = 4 * (d if estimator == "rloo" else d / (s + 1e-6) + 4 * u * expected.abs())
    got = rollout.advantages.double()
    assert torch.equal(got, got[:, :1] * mask), "one advantage per sequence, on its valid actions only"
    error = (got[:, 0].reshape(-1, 2) - expected).abs()
    assert (error <= tol).all(), (got[:, 0].reshape(-1, 2), expected, error, tol)
    trainer = _fit(module, world, tokenizer, 1, tmp_path)
    assert math.isfinite(trainer.callback_metrics["ppo/approx_kl"].item())


def test_trainer_fit_max_steps_2_logs_every_rollout_metric(world, tokenizer, tmp_path):
    # one optimiser step per rollout (1 epoch x 1 minibatch), so max_steps=2 is two rollouts
    module = _module(world, tokenizer, ppo_epochs=1, minibatch_size=BATCH)
    trainer = pl.Trainer(accelerator="cpu", max_steps=2, logger=CSVLogger(tmp_path, name="csv"),
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         log_every_n_steps=1, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=_data(world, tokenizer))
    assert trainer.global_step == 2 and module.rollouts_done == 2
    keys = ["rollout/score_raw", "rollout/score", "rollout/kl_seq", "rollout/kl_token", "rollout/kl_k1",
            "rollout/kl_cost", "rollout/reward_total", "ppo/approx_kl", "ppo/clipfrac", "ppo/ratio_mean",
            "ppo/ratio_max", "ppo/entropy", "ppo/value_loss", "ppo/explained_variance", "rollout/length_mean",
            "rollout/length_p95", "rollout/eos_rate", "rollout/truncated", "lr", "kl/beta"]
    for key in keys:
        assert math.isfinite(trainer.callback_metrics[key].item()), key
    assert trainer.callback_metrics["kl/beta"].item() == pytest.approx(0.05)


# --------------------------------------------------------------------------------------- GGUF model
@pytest.mark.slow
def test_smollm2_gguf_two_ppo_steps_with_lora(tmp_path, smollm2_config):
    from lrlhf.data.records import PromptExample
    from lrlhf.models import load_tokenizer

    cfg = smollm2_config
    tokenizer = load_tokenizer(cfg)
    # the same base as a (random-head) reward model: what matters here is that the loop runs on a real LM
    reward = ScalarModel(load_causal_lm(cfg))
    config = PPOConfig(max_new_tokens=6, ppo_epochs=1, minibatch_size=2, forward_batch_size=2, lr=1e-4,
                       policy_lora=LoraSpec(r=4))
    module = PPOModule(load_causal_lm(cfg), reward, tokenizer, config, critic=ValueAdapter(LoraSpec(r=4)))
    module.configure_model()
    prompts = [PromptExample([{"role": "user", "content": f"Count to {n}."}]) for n in range(2, 6)]
    data = PromptDataModule(tokenizer, train=prompts, batch_size=2, max_length=64)
    before = _snapshot(module)
    trainer = pl.Trainer(accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=data)
    after = _snapshot(module)
    assert trainer.global_step == 2
    assert math.isfinite(trainer.callback_metrics["ppo/approx_kl"].item())
    assert all(torch.equal(after[n], before[n]) for n in after if "lora_" not in n)
    assert any(not torch.equal(after[n], before[n]) for n in after if "lora_B" in n and ".policy." in n)


# ------------------------------------------------------------------------------ reward as an adapter
def _lora_reward_export(world, out_dir):
    from lrlhf.modules import RewardConfig, RewardModule

    torch.manual_seed(1)
    rm = RewardModule(ModelConfig(str(world.model)), RewardConfig(lora=LoraSpec(r=4)), tokenizer=world.tokenizer)
    with torch.no_grad():  # a non-trivial adapter, as after training (peft starts lora_B at zero)
        for name, param in rm.model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    return rm.export(out_dir)


def test_reward_adapter_on_the_policy_base_scores_like_the_merged_rm(world, tokenizer, tmp_path):
    from lrlhf.modules import RewardAdapter
    from lrlhf.modules.rm import load_reward_model

    rm_dir = _lora_reward_export(world, tmp_path / "rm")
    config = PPOConfig(max_new_tokens=8, ppo_epochs=1, minibatch_size=2, forward_batch_size=3, lr=5e-2,
                       policy_lora=LoraSpec(r=4))
    module = PPOModule(ModelConfig(str(world.model)), RewardAdapter(str(rm_dir)), tokenizer, config,
                       critic=ValueAdapter(LoraSpec(r=4)))
    module.configure_model()
    # one copy of the base: the reward role owns only its head
    assert [n for n, _ in module.reward_model.named_parameters()] == ["head.linear.weight", "head.linear.bias"]
    assert set(module.model.peft_config) == {"policy", "value", "reward"}
    # loading the frozen reward adapter leaves the policy's and the value's adapters trainable (peft 0.18 froze them:
    # lrlhf.utils.compat.load_frozen_adapter)
    adapters = {n: p.requires_grad for n, p in module.model.named_parameters() if "lora_" in n}
    assert all(adapters[n] for n in adapters if ".policy." in n or ".value." in n)
    assert not any(adapters[n] for n in adapters if ".reward." in n)

    rollout = module.make_rollout(_batch(world, tokenizer))
    merged = load_reward_model(rm_dir)
    ids = torch.cat([rollout.query_ids, rollout.response_ids], dim=1)
    mask = torch.cat([rollout.query_mask, rollout.action_mask.long()], dim=1)
    with torch.no_grad():
        expected = merged.score(ids, mask)
    # merged W + BA vs x W + (x A) B: equal to fp32 accuracy
    torch.testing.assert_close(rollout.raw_scores, expected, atol=1e-5, rtol=1e-5)
    assert module.model.active_adapter == "policy"

    reward_before = {n: p.detach().clone() for n, p in module.model.named_parameters() if ".reward." in n}
    before = _snapshot(module)
    _fit(module, world, tokenizer, 2, tmp_path)
    after = _snapshot(module)
    assert reward_before and all(torch.equal(after[n], v) for n, v in reward_before.items())
    assert not any(after[n].requires_grad for n in reward_before)
    assert any(not torch.equal(after[n], before[n]) for n in after if "lora_B" in n and ".policy." in n)


def test_reward_adapter_from_another_base_is_refused(world, tokenizer, tmp_path):
    from lrlhf.models import LoraSpec as Spec
    from lrlhf.models import add_adapters
    from lrlhf.modules.rm import attach_reward_adapter

    rm_dir = _lora_reward_export(world, tmp_path / "rm")
    load_causal_lm(ModelConfig(str(world.model))).save_pretrained(tmp_path / "other_base")
    other = add_adapters(load_causal_lm(ModelConfig(str(tmp_path / "other_base"))), {"policy": Spec(r=2)})
    with pytest.raises(ValueError, match="trained on base .* but the policy's base is .*other_base"):
        attach_reward_adapter(other, rm_dir)


def test_export_reloads_with_plain_transformers_and_peft(world, tokenizer, tmp_path):
    from peft import PeftModel

    module = _module(world, tokenizer)
    _fit(module, world, tokenizer, 1, tmp_path)
    paths = module.export(tmp_path / "export")
    batch = _batch(world, tokenizer)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    module.model.eval()
    with torch.no_grad():
        live = module.model(input_ids=ids, attention_mask=mask).logits
        merged = load_causal_lm(ModelConfig(str(paths["merged"]))).eval()(input_ids=ids, attention_mask=mask).logits
        base = load_causal_lm(ModelConfig(str(world.model)))
        adapter = PeftModel.from_pretrained(base, paths["adapter"]).eval()(input_ids=ids, attention_mask=mask).logits
    assert set(module.model.peft_config) == {"policy", "value"}
    torch.testing.assert_close(merged, live, atol=1e-5, rtol=1e-5)  # merged weights round differently
    assert torch.equal(adapter, live)


# ------------------------------------------------------------------------------------------- calibration
def test_calibration_measured_on_reference_samples_is_the_one_ppo_uses(world, tokenizer, tmp_path):
    """#15 item 4: the reward scale is measured on the starting policy's own samples for the RL prompts, without
    moving the run's RNG; PPO then normalises by it, and a checkpoint keeps it."""
    from lrlhf.models.reward import RewardCalibration
    from lrlhf.rewards.calibration import ReferenceSamples

    measured = _module(world, tokenizer)
    measured.calibration = measured.calibration_spec = ReferenceSamples(n_prompts=8, seed=3)
    torch.manual_seed(0)
    _fit(measured, world, tokenizer, 2, tmp_path / "a")
    calibration = measured.calibration
    assert isinstance(calibration, RewardCalibration) and calibration.count == 8 and calibration.std > 0

    # by hand: the same 8 prompts, one sample each from the starting policy with seed 3, scored raw
    fresh = _module(world, tokenizer)
    data = _data(world, tokenizer)
    data.setup("fit")
    batch = data.collate(data.datasets["train"][:8])
    torch.manual_seed(3)
    response_ids = fresh.sample(batch["input_ids"], batch["attention_mask"]).response_ids
    from lrlhf.functional.masks import response_masks

    masks = response_masks(response_ids, fresh.eos_token_ids, fresh.pad_token_id)
    scores = fresh.score(batch["input_ids"], batch["attention_mask"], response_ids, masks).double()
    assert calibration.mean == pytest.approx(scores.mean().item(), abs=1e-6)
    assert calibration.std == pytest.approx(scores.std().item(), abs=1e-6)

    # the same run given that calibration as a fixed one trains bitwise alike: measuring took no RNG
    fixed = _module(world, tokenizer)
    fixed.calibration = calibration
    torch.manual_seed(0)
    _fit(fixed, world, tokenizer, 2, tmp_path / "b")
    after_fixed, after_measured = _snapshot(fixed), _snapshot(measured)
    assert all(torch.equal(after_fixed[n], after_measured[n]) for n in after_fixed)

    checkpoint = {}
    measured.on_save_checkpoint(checkpoint)
    restored = _module(world, tokenizer)
    restored.calibration = restored.calibration_spec = ReferenceSamples(n_prompts=8, seed=3)
    from lrlhf.callbacks import ResumableCheckpoint

    callback = ResumableCheckpoint(dirpath=tmp_path / "c")
    assert callback._config(restored) == callback._config(measured)  # a resume compares the settings, not values
    restored.on_load_checkpoint(checkpoint)
    assert restored.calibration == calibration
