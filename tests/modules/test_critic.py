"""The critic roles (lrlhf.modules.critic): a value adapter, a head on the policy's own trunk, a separate value
model, or none; where each reads its values, which passes run, what trains, and the errors that name the keys."""

# ruff: noqa: F811 -- the world / tokenizer fixtures come from test_ppo
import pytest
import torch

from lrlhf.models import LoraSpec, ModelConfig, ScalarModel, load_causal_lm
from lrlhf.modules import PPOModule
from lrlhf.modules.advantages import GRPO, RLOO
from lrlhf.modules.critic import SharedTrunk, ValueAdapter, ValueModel

from .test_ppo import (  # noqa: F401 (fixtures)
    BATCH,
    RecordRatios,
    _batch,
    _fit,
    _module,
    _snapshot,
    tokenizer,
    world,
)


def _value_tol(head, hidden):
    """Bound on the difference of two fp32 computations of ``head(hidden)``: each side's dot product of length H
    rounds by at most H u sum_i |w_i h_i| (+ u |b|), u = 2^-24; the trunks' own roundings of ``hidden`` (a few u
    relative: padded vs alone, cached vs full) stay well inside it."""
    scale = (hidden.abs() @ head.linear.weight.abs().T).squeeze(-1) + head.linear.bias.abs()
    return 2 * hidden.shape[-1] * 2.0**-24 * scale


def test_shared_trunk_first_ratio_is_one_and_values_come_from_the_policy_pass(world, tokenizer, tmp_path):
    module = _module(world, tokenizer, cls=RecordRatios, critic=SharedTrunk())
    assert "value" not in module.model.peft_config  # one adapter: the critic reads the policy's trunk
    with torch.no_grad():
        module.critic.head.linear.weight.normal_()
    rollout = module.make_rollout(_batch(world, tokenizer))
    # the values of the shared pass equal the old values (a no-grad pass of the policy trunk) and the
    # direct computation: the policy adapter's last hidden state at the column before each action
    logprobs, _, values = module.policy_value_forward(rollout.query_ids, rollout.query_mask, rollout.response_ids)
    valid = rollout.action_mask
    ids, mask, pos = module._sequence(rollout.query_ids, rollout.query_mask, rollout.response_ids)
    with torch.no_grad():
        trunk = module.model.get_base_model().model(input_ids=ids, attention_mask=mask, position_ids=pos)
    tol = _value_tol(module.critic.head, trunk.last_hidden_state[:, rollout.query_ids.shape[1] - 1:-1])
    assert ((values - rollout.values).abs() <= tol)[valid].all()
    torch.testing.assert_close(logprobs[valid], rollout.logprobs[valid], atol=1e-5, rtol=0)
    row, n = 0, int(rollout.masks.lengths[0])
    prompt = rollout.query_ids[row][rollout.query_mask[row].bool()]
    ids = torch.cat([prompt, rollout.response_ids[row, :n]])[None]
    with torch.no_grad():
        hidden = module.model.get_base_model().model(input_ids=ids).last_hidden_state[0]
        direct = module.critic.head(hidden[len(prompt) - 1:len(prompt) - 1 + n])
    tol = _value_tol(module.critic.head, hidden[len(prompt) - 1:len(prompt) - 1 + n])
    assert ((rollout.values[row, :n] - direct).abs() <= tol).all()
    # training: ratio 1 at the first minibatch of each rollout; the value loss moves the policy adapter
    before = _snapshot(module)
    _fit(module, world, tokenizer, 2, tmp_path)
    assert len(module.first_log_ratios) == 2
    for log_ratio in module.first_log_ratios:
        assert log_ratio.numel() > 0
        torch.testing.assert_close(log_ratio.exp(), torch.ones_like(log_ratio), atol=1e-5, rtol=0)
    after = _snapshot(module)
    assert any(not torch.equal(after[n], before[n]) for n in after if "lora_B" in n)
    assert all(torch.equal(after[n], before[n]) for n in after if "lora_" not in n)


class CountPasses(PPOModule):
    calls: dict

    def policy_forward(self, *a):
        self.calls["policy"] = self.calls.get("policy", 0) + 1
        return super().policy_forward(*a)

    def value_forward(self, *a):
        self.calls["value"] = self.calls.get("value", 0) + 1
        return super().value_forward(*a)


@pytest.mark.parametrize("shared", [False, True])
def test_rollout_takes_old_logprobs_and_shared_values_from_sampling(world, tokenizer, shared):
    module = _module(world, tokenizer, cls=CountPasses, critic=SharedTrunk() if shared else None,
                     forward_batch_size=BATCH)
    module.calls = {}
    rollout = module.make_rollout(_batch(world, tokenizer))
    assert module.calls == ({} if shared else {"value": 1})  # no policy scoring forward; no value one if shared
    logprobs, _ = module.policy_forward(rollout.query_ids, rollout.query_mask, rollout.response_ids)
    valid = rollout.action_mask
    torch.testing.assert_close(rollout.logprobs[valid], logprobs[valid], atol=1e-5, rtol=0)


@pytest.mark.parametrize("shared", [False, True])
def test_recompute_old_logprobs_takes_them_from_a_full_forward(world, tokenizer, shared):
    module = _module(world, tokenizer, cls=CountPasses, critic=SharedTrunk() if shared else None,
                     forward_batch_size=BATCH, recompute_old_logprobs=True)
    module.calls = {}
    rollout = module.make_rollout(_batch(world, tokenizer))
    assert module.calls == {"policy": 1, "value": 1}  # one chunk: the scoring forwards run again
    with torch.no_grad():
        logprobs, _ = module.policy_forward(rollout.query_ids, rollout.query_mask, rollout.response_ids)
        values = module.value_forward(rollout.query_ids, rollout.query_mask, rollout.response_ids)
    valid = rollout.action_mask
    assert torch.equal(rollout.logprobs[valid], logprobs[valid])  # the update's own computation, bit for bit
    assert torch.equal(rollout.values[valid], values.float()[valid])


def test_values_read_at_the_state_before_each_action(world, tokenizer):
    module = _module(world, tokenizer)
    with torch.no_grad():
        module.critic.head.linear.weight.normal_()
    rollout = module.make_rollout(_batch(world, tokenizer))
    row = 0
    prompt = rollout.query_ids[row][rollout.query_mask[row].bool()]
    n = int(rollout.masks.lengths[row])
    ids = torch.cat([prompt, rollout.response_ids[row, :n]])[None]
    module.model.set_adapter("value")
    with torch.no_grad():
        hidden = module.model.get_base_model().model(input_ids=ids).last_hidden_state[0]
        direct = module.critic.head(hidden[len(prompt) - 1:len(prompt) - 1 + n])
    module.model.set_adapter("policy")
    tol = _value_tol(module.critic.head, hidden[len(prompt) - 1:len(prompt) - 1 + n])
    assert ((rollout.values[row, :n] - direct).abs() <= tol).all()


def test_a_separate_value_model_trains_whole_and_adds_no_adapter(world, tokenizer, tmp_path):
    torch.manual_seed(0)
    value_model = ScalarModel(load_causal_lm(ModelConfig(str(world.model))), zero_init=True)
    module = _module(world, tokenizer, critic=ValueModel(value_model), ppo_epochs=1)
    assert set(module.model.peft_config) == {"policy"} and module.critic.model is value_model
    before = {n: p.detach().clone() for n, p in value_model.named_parameters()}
    rollout = module.make_rollout(_batch(world, tokenizer))
    ids, mask, pos = module._sequence(rollout.query_ids, rollout.query_mask, rollout.response_ids)
    p = rollout.query_ids.shape[1]
    with torch.no_grad():  # the value of action t: the model's scalar at column P + t - 1
        expected = value_model(ids, mask, position_ids=pos)[:, p - 1:-1]
    assert torch.equal(rollout.values, expected * rollout.action_mask)
    _fit(module, world, tokenizer, 1, tmp_path)
    after = dict(value_model.named_parameters())
    assert any(not torch.equal(after[n], before[n]) for n in before if not n.startswith("head."))  # the trunk too
    module.train()  # as Lightning does before each epoch: the critic stays without dropout
    assert module.critic.training is False and not any(m.training for m in module.critic.modules())


def test_an_estimator_without_a_critic_refuses_one_and_gae_gets_a_value_adapter(world, tokenizer):
    policy = load_causal_lm(ModelConfig(str(world.model)))
    with pytest.raises(ValueError, match=r"module.critic must be null with RLOO \(module.advantage\)"):
        PPOModule(policy, "rm", tokenizer, advantage=RLOO(), critic=ValueAdapter())
    assert PPOModule(policy, "rm", tokenizer, advantage=GRPO()).critic is None
    assert isinstance(PPOModule(policy, "rm", tokenizer).critic, ValueAdapter)  # GAE by default: it needs one


@pytest.mark.parametrize(("make", "message"), [
    (lambda: ValueAdapter(vf_coef=-1.0), "module.critic.vf_coef must be >= 0, got -1.0"),
    (lambda: SharedTrunk(value_clip_eps=0.0), "module.critic.value_clip_eps must be > 0 or null, got 0.0"),
    (lambda: ValueAdapter({"r": 0}), "lora.r must be > 0"),
])
def test_critic_config_errors_name_the_key(make, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        make()


def test_value_adapter_head_init_is_config(world, tokenizer):
    zero = _module(world, tokenizer)
    assert not zero.critic.head.linear.weight.any()
    normal = _module(world, tokenizer, critic=ValueAdapter(LoraSpec(r=4), zero_init_head=False))
    assert normal.critic.head.linear.weight.abs().min() > 0
