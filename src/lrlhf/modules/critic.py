"""The critic of :class:`~lrlhf.modules.PPOModule`: one role object, chosen by ``_target_`` (``module.critic``;
``module/critic=value_adapter|shared_trunk`` picks a shipped one, ``null`` = none, as RLOO / GRPO need).

Three kinds, one interface (:class:`Critic`), so the module has no per-kind branches:

- :class:`ValueAdapter`: the policy's base + LoRA adapter ``value`` + a scalar head. The critic cannot move the
  policy, at the cost of a second trunk pass (forward and backward) per minibatch.
- :class:`SharedTrunk`: the head reads the policy's own last hidden states (no ``value`` adapter): one trunk pass
  per minibatch yields both log-probs and values, and the value loss also trains the policy adapter (a shared
  trunk, as TRL's old ``AutoModelForCausalLMWithValueHead``). The sampler reads the old values from its own steps.
- :class:`ValueModel`: a separate :class:`ScalarModel` trained whole (e.g. initialised from the reward model).

The settings that mean something only with a critic live here: ``vf_coef``, ``value_clip_eps``, the head's init.
A critic is given what it reads at each call: the policy's peft model and ``use_adapter`` (the module's adapter
switch, ``use_adapter(name)`` makes ``name`` the active adapter), or the module's own forwards (``policy_forward``,
``value_forward``) where it runs them.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from torch import Tensor, nn

from lrlhf.models import LoraSpec, ScalarHead, ScalarModel
from lrlhf.models.heads import capture_trunk_output, decoder

POLICY, VALUE = "policy", "value"


class Critic(nn.Module):
    """The value role of PPO (see the module docstring).

    Args:
        vf_coef: weight of the value loss in the minibatch loss.
        value_clip_eps: clip of the value update around the old values; None = unclipped value loss.
        warmup_rollouts: the first N rollouts train the critic alone (no policy loss, the policy does not move, the
            KL controller is not fed), so the first policy updates see values fitted to the policy's returns
            instead of the zero-initialised head's.
    """

    #: constructing one is cheap (weights come in :meth:`build`): :func:`lrlhf.planning.validate` builds the config
    #: node before any stage is built, so a bad value fails at once
    built_when_planning = True

    def __init__(self, vf_coef: float = 0.1, value_clip_eps: float | None = 0.2, warmup_rollouts: int = 0):
        super().__init__()
        if not vf_coef >= 0:
            raise ValueError(f"module.critic.vf_coef must be >= 0, got {vf_coef!r}")
        if value_clip_eps is not None and not value_clip_eps > 0:
            raise ValueError(f"module.critic.value_clip_eps must be > 0 or null, got {value_clip_eps!r}")
        if not (isinstance(warmup_rollouts, int) and warmup_rollouts >= 0):
            raise ValueError(f"module.critic.warmup_rollouts must be an integer >= 0, got {warmup_rollouts!r}")
        self.vf_coef, self.value_clip_eps, self.warmup_rollouts = vf_coef, value_clip_eps, warmup_rollouts

    def train(self, mode: bool = True) -> Critic:
        """Always eval mode (no dropout), whatever Lightning asks: the values of a rollout and of its update must come
        from the same function, as the policy's log-probs do (PPOModule keeps its model in eval mode too)."""
        return super().train(False)

    def adapters(self) -> dict[str, LoraSpec]:
        """The LoRA adapters this critic adds to the policy's base, by name (none by default)."""
        return {}

    def build(self, base: nn.Module) -> None:
        """Create the weights, given the policy's base (called once, before the adapters are added to it)."""

    @property
    def sampling_head(self) -> ScalarHead | None:
        """A head the sampler applies to its own hidden states (the old values come with the sampling), or None."""
        return None

    def values(self, model: nn.Module, use_adapter, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
               cols: slice) -> Tensor:
        """``(B, R)`` values at the columns ``cols`` of the sequences (the states in which the actions are chosen);
        ``model`` is the policy's peft model, ``use_adapter(name)`` its adapter switch."""
        raise NotImplementedError

    def with_policy_pass(self, model: nn.Module, policy_forward, value_forward, query_ids: Tensor,
                         query_mask: Tensor, response_ids: Tensor):
        """``(logprobs, logits, values)`` of a minibatch: ``policy_forward`` (:meth:`PPOModule.policy_forward`),
        then ``value_forward`` (:meth:`PPOModule.value_forward`)."""
        logprobs, logits = policy_forward(query_ids, query_mask, response_ids)
        return logprobs, logits, value_forward(query_ids, query_mask, response_ids)

    def settings(self) -> dict:
        """The constructor's arguments, as the module's hyperparameters record them."""
        return {"vf_coef": self.vf_coef, "value_clip_eps": self.value_clip_eps, "warmup_rollouts": self.warmup_rollouts}

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.settings().items())


class _HeadOnBase(Critic):
    """A scalar head on the policy's base, read with the adapter ``trunk_adapter`` active."""

    trunk_adapter = VALUE

    def __init__(self, vf_coef: float = 0.1, value_clip_eps: float | None = 0.2, zero_init_head: bool = True,
                 warmup_rollouts: int = 0):
        super().__init__(vf_coef, value_clip_eps, warmup_rollouts)
        self.zero_init_head = zero_init_head
        self.head: ScalarHead | None = None

    def build(self, base: nn.Module) -> None:
        # zero_init_head: every value starts at 0, so the first advantages are just the returns
        self.head = ScalarHead(base.config.hidden_size, zero_init=self.zero_init_head)

    def settings(self) -> dict:
        return {**super().settings(), "zero_init_head": self.zero_init_head}

    def values(self, model: nn.Module, use_adapter, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
               cols: slice) -> Tensor:
        use_adapter(self.trunk_adapter)
        try:
            hidden = decoder(model)(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
            ).last_hidden_state
        finally:
            use_adapter(POLICY)
        return self.head(hidden[:, cols])


class ValueAdapter(_HeadOnBase):
    """The ``value`` LoRA adapter on the policy's base + a scalar head.

    Args:
        lora: the ``value`` adapter.
        vf_coef, value_clip_eps: see :class:`Critic`.
        zero_init_head: start the head at 0 (every value 0); False = a normal init.
    """

    def __init__(self, lora: LoraSpec | dict | None = None, vf_coef: float = 0.1,
                 value_clip_eps: float | None = 0.2, zero_init_head: bool = True, warmup_rollouts: int = 0):
        super().__init__(vf_coef, value_clip_eps, zero_init_head, warmup_rollouts)
        self.lora = LoraSpec(**lora) if isinstance(lora, dict) else (lora or LoraSpec())

    def adapters(self) -> dict[str, LoraSpec]:
        return {VALUE: self.lora}

    def settings(self) -> dict:
        return {"lora": asdict(self.lora), **super().settings()}


class SharedTrunk(_HeadOnBase):
    """A scalar head on the policy's own trunk (no adapter of its own); arguments as :class:`ValueAdapter`'s,
    without ``lora``."""

    trunk_adapter = POLICY

    def __init__(self, vf_coef: float = 0.1, value_clip_eps: float | None = 0.2, zero_init_head: bool = True,
                 warmup_rollouts: int = 0):
        super().__init__(vf_coef, value_clip_eps, zero_init_head, warmup_rollouts)
        if warmup_rollouts:
            raise ValueError("module.critic.warmup_rollouts must be 0 with SharedTrunk: its value loss trains the "
                             "policy's own adapter, so a critic-only warm-up would move the policy")

    @property
    def sampling_head(self) -> ScalarHead | None:
        return self.head

    def with_policy_pass(self, model: nn.Module, policy_forward, value_forward, query_ids: Tensor,
                         query_mask: Tensor, response_ids: Tensor):
        """One trunk pass: the head reads the policy forward's last hidden states at the value columns."""
        with capture_trunk_output(model) as trunk:
            logprobs, logits = policy_forward(query_ids, query_mask, response_ids)
        prompt_len, resp_len = query_ids.shape[1], response_ids.shape[1]
        return logprobs, logits, self.head(trunk["hidden"][:, prompt_len - 1:prompt_len + resp_len - 1])


class ValueModel(Critic):
    """A separate value model, trained whole: a :class:`ScalarModel`, or the folder of a reward model's export
    (:func:`lrlhf.models.reward.load_reward_model`; its head is then the starting value head).

    Args:
        model: the model or the folder (loaded in :meth:`build`).
        vf_coef, value_clip_eps: see :class:`Critic`.
    """

    def __init__(self, model: ScalarModel | str | Path, vf_coef: float = 0.1, value_clip_eps: float | None = 0.2,
                 warmup_rollouts: int = 0):
        super().__init__(vf_coef, value_clip_eps, warmup_rollouts)
        self.source = None if isinstance(model, nn.Module) else str(model)
        self.model: ScalarModel | None = model if isinstance(model, nn.Module) else None

    def build(self, base: nn.Module) -> None:
        if self.model is None:
            from lrlhf.models.reward import load_reward_model

            self.model = load_reward_model(self.source).requires_grad_(True)

    def values(self, model: nn.Module, use_adapter, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
               cols: slice) -> Tensor:
        return self.model(input_ids, attention_mask, position_ids=position_ids)[:, cols]

    def settings(self) -> dict:
        return {"model": self.source, **super().settings()}  # (None: a model object was passed)


__all__ = ["POLICY", "VALUE", "Critic", "SharedTrunk", "ValueAdapter", "ValueModel"]
