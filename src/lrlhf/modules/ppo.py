"""PPO for language models: one frozen base serving policy, reference and value; a frozen reward model.

Roles (``docs/architecture.md``, "PPO: one base, four roles"):

- **policy** = the base (SFT weights, merged, frozen) + LoRA adapter ``policy``;
- **reference** = the same base under :func:`lrlhf.models.reference_mode` (every adapter disabled, no grad);
- **value** = the same base + LoRA adapter ``value`` + a zero-initialised :class:`ScalarHead`, or a separate
  :class:`ScalarModel` passed as ``value_model`` (e.g. initialised from the reward model), or -- with
  ``ppo.value_from_policy`` -- the head on the policy's own trunk (one trunk pass per minibatch for both);
- **reward** = a frozen :class:`ScalarModel` (``load_reward_model``), or -- when the RM was trained as LoRA on
  the same base -- its ``reward`` adapter loaded onto the policy's base (:class:`RewardAdapter`), so one copy of
  the base serves all four roles; with an optional frozen calibration.

One Trainer batch (a batch of prompts from :class:`lrlhf.data.PromptDataModule`) is one rollout followed by
its update epochs (manual optimisation). The steps of :meth:`PPOModule.training_step`:

1. repeat each prompt ``samples_per_prompt`` times; 2. :meth:`sample` with the policy adapter (plain
temperature sampling with a KV cache, exact ids kept, and the sampled tokens' log-probs = the old logprobs);
3. masks from the sampled ids (:func:`response_masks`); 4. no-grad scoring in micro-batches: reference
logprobs, old values, RM scores (:meth:`score`);
5. :meth:`compute_rewards` (calibration, missing-EOS penalty, clip, ``-beta * KL`` per action, the score once
at the last valid action); 6. :meth:`compute_advantages` (GAE + whitening, or RLOO / GRPO); 7. the rollout is
frozen; ``ppo_epochs`` x shuffled minibatches of :meth:`policy_loss` + :meth:`value_loss` (- entropy bonus),
gradient clipping, one optimiser step each; 8. log, :meth:`update_kl_controller`, discard the rollout.

Alignment: for ``prompt (P columns, left-padded) + response (R)``, the logits and the value of action ``t`` are
read at column ``P + t - 1`` (the state after the prompt and ``response[:t]``). Position ids are
``cumsum(attention_mask) - 1`` over the whole sequence, the positions ``generate`` used for left-padded rows,
so the scoring forward reproduces the sampling distribution. The old logprobs are the sampler's own (its cached
one-token forwards): in fp32 they equal the full forward of the update to ~1e-6 (first-update ratio 1 within
1e-5, tested); in half precision the two kernels differ more, and ``ppo.recompute_old_logprobs`` takes the old
logprobs from a full no-grad forward instead.

Trainer steps: Lightning's ``global_step`` counts optimiser steps (``ppo_epochs x minibatches`` per rollout
here); bound the number of rollouts with ``limit_train_batches`` / ``max_epochs`` (one batch = one rollout), or
set ``max_steps`` to ``rollouts * PPOModule.updates_per_rollout(batch_size)``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from lrlhf.data.records import PromptExample, SFTExample
from lrlhf.functional import (
    KL_ESTIMATORS,
    FixedKLController,
    ResponseMasks,
    ShapedRewards,
    entropy_from_logits,
    explained_variance,
    gae,
    grpo_advantages,
    kl_k1,
    masked_mean,
    masked_sum,
    masked_whiten,
    ppo_policy_loss,
    response_masks,
    rloo_advantages,
    shape_rewards,
    token_logprobs,
    value_loss,
)
from lrlhf.models import (
    LoraSpec,
    ModelConfig,
    ScalarHead,
    ScalarModel,
    add_adapters,
    export_adapter,
    export_merged,
    load_causal_lm,
    load_tokenizer,
)
from lrlhf.models import reference_mode as _reference_mode
from lrlhf.models.generation import SamplingConfig, as_prompt, eos_token_ids, sample_with_logprobs
from lrlhf.models.heads import capture_trunk_output, decoder
from lrlhf.modules.guards import InvariantError, Precision, check_ratio, run_precision, sampler_self_check
from lrlhf.modules.optim import SCHEDULERS, adamw_with_schedule
from lrlhf.modules.reward import RewardCalibration, attach_reward_adapter, load_calibration, load_reward_model
from lrlhf.modules.samples import log_table, sample_table
from lrlhf.strategies import full_params_for_generation
from lrlhf.utils.distributed import (
    any_across_ranks,
    forward_is_collective,
    global_all_reduce,
    global_weighted_mean,
    seed_rank_stream,
)

ADVANTAGE_ESTIMATORS = ("gae", "rloo", "grpo")
WHITEN_SCOPES = ("global", "local")


@dataclass(frozen=True)
class RewardAdapter:
    """The reward role as the ``reward`` adapter of a LoRA :meth:`RewardModule.export` folder (``path``),
    loaded onto the policy's own base (which must be the base the RM was trained on)."""

    path: str
POLICY, VALUE = "policy", "value"


# ---------------------------------------------------------------------------------------------- config
@dataclass
class PPOConfig:
    """Hyperparameters of PPO (``ppo.*`` in configs)."""

    # sampling
    max_new_tokens: int = 32
    """Most tokens generated per response; a response without EOS by then is truncated (and counted)."""
    temperature: float = 1.0
    """Sampling temperature (> 0). Top-k 0 and top-p 1: logprobs are those of ``softmax(logits / T)``."""
    samples_per_prompt: int = 1
    """k responses per prompt (adjacent rows); RLOO and GRPO need k >= 2."""
    # rewards
    kl_coef: float = 0.05
    """Initial beta of the per-token KL penalty (a :class:`FixedKLController` unless one is passed)."""
    kl_estimator: str = "k1"
    """Per-token KL estimator in the reward: a name in :data:`KL_ESTIMATORS`."""
    missing_eos_penalty: float | None = None
    """Subtracted from the score of a response that hit ``max_new_tokens`` without EOS; None = off."""
    score_clip: float | None = None
    """Clamp the (calibrated, penalised) score to ``[-score_clip, score_clip]``; None = off."""
    # advantages
    advantage_estimator: str = "gae"
    """``gae`` (critic: value adapter + head), ``rloo`` or ``grpo`` (no critic; k samples per prompt)."""
    gamma: float = 1.0
    """Discount of GAE."""
    lam: float = 0.95
    """GAE lambda."""
    whiten_advantages: bool = True
    """Whiten GAE advantages over the rollout's valid actions (RLOO/GRPO advantages are used as they are)."""
    whiten_scope: str = "global"
    """Statistics of the whitening across data-parallel ranks: ``global`` (all-reduced: the mean and variance
    of the whole global rollout, as one process would compute them) or ``local`` (each rank its own rows)."""
    # update
    ppo_epochs: int = 4
    """Passes over each rollout."""
    minibatch_size: int = 8
    """Rows per optimiser step."""
    forward_batch_size: int = 32
    """Rows per no-grad scoring forward of the rollout."""
    clip_eps: float = 0.2
    """Epsilon of the clipped policy ratio."""
    value_clip_eps: float | None = 0.2
    """Clip of the value update around the old values; None = unclipped value loss."""
    vf_coef: float = 0.1
    """Weight of the value loss."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (0 = none; the entropy is logged either way)."""
    max_grad_norm: float | None = 1.0
    """Gradient-norm clip per optimiser step; None = off."""
    # optimiser
    lr: float = 1e-4
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay (matrices only)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    warmup_steps: int = 0
    """Optimiser steps of linear warmup."""
    scheduler: str = "constant"
    """LR schedule after warmup: a name in :data:`SCHEDULERS`, over ``total_steps`` optimiser steps."""
    total_steps: int | None = None
    """Schedule length in optimiser steps; None = Trainer batches x updates per rollout."""
    # roles
    policy_lora: LoraSpec = dataclasses.field(default_factory=LoraSpec)
    """The ``policy`` adapter (full-parameter PPO is not implemented: the reference is the adapter-free base)."""
    value_lora: LoraSpec = dataclasses.field(default_factory=LoraSpec)
    """The ``value`` adapter on the same base (GAE without a separate ``value_model``)."""
    value_from_policy: bool = False
    """The critic's head reads the policy's own last hidden states (no ``value`` adapter): one trunk pass per
    minibatch yields both log-probs and values, and the value loss also trains the policy adapter (a shared
    trunk, as TRL's old ``AutoModelForCausalLMWithValueHead``). False = the ``value`` adapter: the critic
    cannot move the policy, at the cost of a second trunk pass (forward and backward) per minibatch."""
    recompute_old_logprobs: bool | None = None
    """Take the old logprobs (and, with ``value_from_policy``, the old values) from full no-grad forwards of the
    sampled sequences, as the update computes them, instead of the sampler's cached one-token forwards. None =
    by precision: on under reduced precision (half weights or autocast, TF32, k-bit), where the two kernels
    round differently (max |ratio - 1| 5.7e-3 under CPU bf16 autocast) and the first update would start
    off-policy; off in full precision, where they agree to ~1e-6 (one policy forward saved)."""
    # run-time guards (lrlhf.modules.guards)
    check_invariants: bool = True
    """Stop the run when the first-update ratio is not 1 (every rollout) or the sampler's log-probs disagree with
    a teacher-forced forward (once per fit, before the first rollout), naming the measured value and the cause."""
    first_ratio_tolerance: float | None = None
    """Bound on the mean |ratio - 1| of the first minibatch of each rollout; None = by precision
    (:data:`lrlhf.modules.guards.RATIO_TOLERANCE`: 1e-3 full, 0.1 reduced)."""
    # logging
    sample_every_n_rollouts: int = 0
    """Log the fixed-prompt sample table every N rollouts; 0 = never."""
    sample_seed: int = 0
    """Seed of the sample table's generation (the training RNG is left alone)."""

    def __post_init__(self):
        for name in ("policy_lora", "value_lora"):
            if isinstance(getattr(self, name), dict):  # from a YAML/Hydra config
                setattr(self, name, LoraSpec(**getattr(self, name)))
        self.betas = tuple(self.betas)
        k = self.samples_per_prompt
        checks = [
            ("max_new_tokens", self.max_new_tokens >= 1, "must be >= 1"),
            ("temperature", self.temperature > 0, "must be > 0 (PPO samples; greedy has no logprobs)"),
            ("samples_per_prompt", k >= 1, "must be >= 1"),
            ("kl_coef", self.kl_coef >= 0, "must be >= 0"),
            ("kl_estimator", self.kl_estimator in KL_ESTIMATORS, f"must be one of {sorted(KL_ESTIMATORS)}"),
            ("score_clip", self.score_clip is None or self.score_clip > 0, "must be > 0 or None"),
            ("advantage_estimator", self.advantage_estimator in ADVANTAGE_ESTIMATORS,
             f"must be one of {list(ADVANTAGE_ESTIMATORS)}"),
            ("samples_per_prompt", self.advantage_estimator == "gae" or k >= 2,
             f"must be >= 2 for advantage_estimator={self.advantage_estimator!r}"),
            ("value_from_policy", not self.value_from_policy or self.advantage_estimator == "gae",
             "needs advantage_estimator='gae' (a critic)"),
            ("gamma", 0 <= self.gamma <= 1, "must be in [0, 1]"),
            ("lam", 0 <= self.lam <= 1, "must be in [0, 1]"),
            ("whiten_scope", self.whiten_scope in WHITEN_SCOPES, f"must be one of {list(WHITEN_SCOPES)}"),
            ("ppo_epochs", self.ppo_epochs >= 1, "must be >= 1"),
            ("minibatch_size", self.minibatch_size >= 1, "must be >= 1"),
            ("forward_batch_size", self.forward_batch_size >= 1, "must be >= 1"),
            ("clip_eps", 0 < self.clip_eps < 1, "must be in (0, 1)"),
            ("value_clip_eps", self.value_clip_eps is None or self.value_clip_eps > 0, "must be > 0 or None"),
            ("vf_coef", self.vf_coef >= 0, "must be >= 0"),
            ("entropy_coef", self.entropy_coef >= 0, "must be >= 0"),
            ("max_grad_norm", self.max_grad_norm is None or self.max_grad_norm > 0, "must be > 0 or None"),
            ("lr", self.lr > 0, "must be > 0"),
            ("weight_decay", self.weight_decay >= 0, "must be >= 0"),
            ("warmup_steps", self.warmup_steps >= 0, "must be >= 0"),
            ("scheduler", self.scheduler in SCHEDULERS, f"must be one of {sorted(SCHEDULERS)}"),
            ("total_steps", self.total_steps is None or self.total_steps > 0, "must be > 0 or None"),
            ("sample_every_n_rollouts", self.sample_every_n_rollouts >= 0, "must be >= 0 (0 = never)"),
            ("first_ratio_tolerance", self.first_ratio_tolerance is None or self.first_ratio_tolerance > 0,
             "must be > 0 or None (by precision)"),
        ]
        for key, ok, rule in checks:
            if not ok:
                raise ValueError(f"ppo.{key} {rule}, got {getattr(self, key)!r}")

    @property
    def sampling(self) -> SamplingConfig:
        """The recorded sampling config of the rollouts (its seed is only used by the sample table)."""
        return SamplingConfig(self.max_new_tokens, self.temperature, self.sample_seed)


# --------------------------------------------------------------------------------------------- rollout
@dataclass(frozen=True)
class Rollout:
    """One rollout, frozen for the update epochs. ``B`` rows, ``P`` prompt columns, ``R`` response columns.

    Fields:
        query_ids, query_mask: ``(B, P)`` left-padded prompts (exact ids) and their attention mask.
        response_ids: ``(B, R)`` sampled ids (after the first EOS: whatever ``generate`` wrote, masked).
        masks: :class:`ResponseMasks` of ``response_ids`` (action / done masks, terminal index, EOS, lengths).
        logprobs, ref_logprobs: ``(B, R)`` of the sampled actions under the sampling policy and the reference.
        values: ``(B, R)`` old values of each action's state (0 without a critic).
        raw_scores: ``(B,)`` reward-model scores; ``scores``: as added (calibrated, penalised, clipped).
        rewards, kl: ``(B, R)`` shaped per-action rewards and the per-token KL estimate (valid actions).
        advantages, returns: ``(B, R)``.
    """

    query_ids: Tensor
    query_mask: Tensor
    response_ids: Tensor
    masks: ResponseMasks
    logprobs: Tensor
    ref_logprobs: Tensor
    values: Tensor
    raw_scores: Tensor
    scores: Tensor
    rewards: Tensor
    kl: Tensor
    advantages: Tensor
    returns: Tensor

    def __len__(self) -> int:
        return self.query_ids.shape[0]

    @property
    def action_mask(self) -> Tensor:
        return self.masks.action_mask

    def tensors(self) -> dict[str, Tensor]:
        """Every tensor by name (mask fields as ``masks.<field>``)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "masks"}
        out.update({f"masks.{k}": v for k, v in self.masks._asdict().items()})
        return out

    def select(self, rows: Tensor) -> Rollout:
        """The rows ``rows`` (a minibatch)."""
        fields = {f.name: getattr(self, f.name)[rows] for f in dataclasses.fields(self) if f.name != "masks"}
        return Rollout(masks=ResponseMasks(*(m[rows] for m in self.masks)), **fields)


# ---------------------------------------------------------------------------------------------- module
class PPOModule(pl.LightningModule):
    """PPO with LoRA roles on one frozen base (see the module docstring).

    Args:
        policy: the SFT model: a :class:`ModelConfig` (loaded and merged in :meth:`configure_model`) or a
            plain causal LM module (no adapters yet).
        reward_model: a frozen :class:`ScalarModel`, the folder of :meth:`RewardModule.export` (a separate
            model), or a :class:`RewardAdapter` (the RM's LoRA adapter on the policy's base). It must
            share the policy's tokenizer: it scores the policy's token ids as they are.
        tokenizer: loaded from the ``ModelConfig`` when None.
        config: :class:`PPOConfig` or a dict of its fields.
        calibration: frozen ``(r - mean) / std`` of the RM scores (a :class:`RewardCalibration`, or a path to
            ``reward_calibration.json`` / its folder); None = raw scores.
        value_model: a separate :class:`ScalarModel` trained as the critic (all its parameters); None = the
            ``value`` adapter + a zero-initialised head on the policy's base.
        kl_controller: an object with ``value``, ``update(current_kl, n_steps)`` and ``state_dict``; None =
            ``FixedKLController(config.kl_coef)``.
        sample_prompts: fixed prompts of the sample table.

    Hooks to override (small, one job each): :meth:`generate` (or :meth:`sample`), :meth:`score`,
    :meth:`compute_rewards`, :meth:`compute_advantages`, :meth:`policy_loss`, :meth:`value_loss`,
    :meth:`update_kl_controller`.
    """

    def __init__(
        self,
        policy: ModelConfig | nn.Module,
        reward_model: ScalarModel | RewardAdapter | str | Path,
        tokenizer=None,
        config: PPOConfig | dict | None = None,
        calibration: RewardCalibration | str | Path | None = None,
        value_model: ScalarModel | None = None,
        kl_controller=None,
        sample_prompts: Sequence[PromptExample | SFTExample] | None = None,
    ):
        super().__init__()
        self.automatic_optimization = False
        self.config = config if isinstance(config, PPOConfig) else PPOConfig(**(config or {}))
        if self.config.value_from_policy and value_model is not None:
            raise ValueError("ppo.value_from_policy=True puts the value head on the policy's trunk: pass no "
                             "value_model, or set ppo.value_from_policy=False")
        self.model_config = policy if isinstance(policy, ModelConfig) else None
        self.model: nn.Module | None = None
        self._policy_module = None if self.model_config is not None else policy
        self.reward_model: ScalarModel | None = reward_model if isinstance(reward_model, nn.Module) else None
        self._reward_source = None if self.reward_model is not None else reward_model
        if isinstance(calibration, (str, Path)):
            calibration = load_calibration(calibration)
        self.calibration = calibration
        self.value_model = value_model
        self.value_head: ScalarHead | None = None
        self.kl_controller = kl_controller if kl_controller is not None else FixedKLController(self.config.kl_coef)
        if tokenizer is None and self.model_config is not None:
            tokenizer = load_tokenizer(self.model_config)
        self.tokenizer = tokenizer
        self.sample_prompts = [as_prompt(p) for p in (sample_prompts or [])]
        self.rollouts_done = 0
        self._adapter_names: set[str] = set()
        self._precision: Precision | None = None
        self._self_check_pending = True
        hparams = {"ppo": asdict(self.config), "sampling": asdict(self.config.sampling)}
        if self.model_config is not None:
            hparams["model"] = asdict(self.model_config)
        self.save_hyperparameters(hparams)

    # ---------------------------------------------------------------------------------- model setup
    @property
    def uses_critic(self) -> bool:
        return self.config.advantage_estimator == "gae"

    def configure_model(self) -> None:
        """Load the roles (idempotent; called by the Trainer, or by hand to use the module outside one)."""
        if self.model is not None:
            return
        base = self._policy_module if self._policy_module is not None else load_causal_lm(self.model_config)
        self._policy_module = None
        adapters = {POLICY: self.config.policy_lora}
        if self.uses_critic and self.value_model is None:
            if not self.config.value_from_policy:
                adapters[VALUE] = self.config.value_lora
            self.value_head = ScalarHead(base.config.hidden_size, zero_init=True)
        self.model = add_adapters(base, adapters)
        # peft's set_adapter leaves only the active adapter trainable; both train here, so remember them (by
        # name: a sharding strategy such as FSDP2 replaces the parameter objects, not their names).
        self._adapter_names = {n for n, _ in self.model.named_parameters() if "lora_" in n}
        self._use_adapter(POLICY)
        if isinstance(self._reward_source, RewardAdapter):
            self.reward_model = attach_reward_adapter(self.model, self._reward_source.path)
        elif self.reward_model is None:
            self.reward_model = load_reward_model(self._reward_source)
        self.reward_model.requires_grad_(False).eval()
        if self.tokenizer is None:
            raise ValueError("PPOModule needs a tokenizer (pass one with a ready model)")
        self.pad_token_id = self.tokenizer.pad_token_id
        if self.pad_token_id is None:
            self.pad_token_id = self.tokenizer.eos_token_id
        self.eos_token_ids = sorted(eos_token_ids(self.model, self.tokenizer))

    def _use_adapter(self, name: str) -> None:
        """Make ``name`` the active adapter, keeping every adapter trainable.

        ``PeftModel.set_adapter`` also turns ``requires_grad`` off for the other adapters (peft 0.21.2); a
        minibatch runs the policy forward then the value forward and back-propagates once, so both must stay
        trainable: they are switched back on here.
        """
        if self.model.active_adapter != name:
            self.model.set_adapter(name)
        for n, p in self.model.named_parameters():
            if n in self._adapter_names:
                p.requires_grad_(True)

    def updates_per_rollout(self, n_prompts: int) -> int:
        """Optimiser steps one rollout of ``n_prompts`` prompts makes."""
        rows = n_prompts * self.config.samples_per_prompt
        return self.config.ppo_epochs * math.ceil(rows / self.config.minibatch_size)

    # ------------------------------------------------------------------------------------- forwards
    @staticmethod
    def _sequence(query_ids: Tensor, query_mask: Tensor, response_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(input_ids, attention_mask, position_ids)`` of prompt + response, all ``(B, P + R)``.

        Every response column is attended (as in ``generate``; columns after a stop are masked out of the
        losses, and causal attention keeps them from changing the earlier ones); positions count attended
        tokens, so a left-padded row gets the positions ``generate`` gave it.
        """
        input_ids = torch.cat([query_ids, response_ids], dim=1)
        attention_mask = torch.cat([query_mask, torch.ones_like(response_ids, dtype=query_mask.dtype)], dim=1)
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        return input_ids, attention_mask, position_ids

    def _response_logits(self, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor) -> Tensor:
        """``(B, R, V)`` logits predicting each response token: columns ``P - 1 .. P + R - 2``."""
        input_ids, attention_mask, position_ids = self._sequence(query_ids, query_mask, response_ids)
        resp_len = response_ids.shape[1]
        # the LM head runs on the last R + 1 columns only (the prompt's logits are never used)
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            logits_to_keep=resp_len + 1).logits
        return logits[:, :resp_len]

    def policy_forward(self, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor) -> tuple[Tensor, Tensor]:
        """``(logprobs, logits)``: ``(B, R)`` log-probs of the response under the policy at the sampling
        temperature, and the ``(B, R, V)`` raw logits they came from (differentiable)."""
        self._use_adapter(POLICY)
        logits = self._response_logits(query_ids, query_mask, response_ids)
        return token_logprobs(logits, response_ids, self.config.temperature), logits

    def policy_value_forward(self, query_ids: Tensor, query_mask: Tensor,
                             response_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(logprobs, logits, values)`` from one policy pass (``ppo.value_from_policy``): the value head reads
        the trunk's last hidden states of that same forward at the columns of :meth:`value_forward`."""
        with capture_trunk_output(self.model) as trunk:
            logprobs, logits = self.policy_forward(query_ids, query_mask, response_ids)
        prompt_len, resp_len = query_ids.shape[1], response_ids.shape[1]
        return logprobs, logits, self.value_head(trunk["hidden"][:, prompt_len - 1:prompt_len + resp_len - 1])

    @torch.no_grad()
    def reference_logprobs(self, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor) -> Tensor:
        """``(B, R)`` log-probs of the response under the reference (the base, every adapter disabled)."""
        with _reference_mode(self.model):
            logits = self._response_logits(query_ids, query_mask, response_ids)
        assert not logits.requires_grad, "the reference must not build a graph"
        return token_logprobs(logits, response_ids, self.config.temperature)

    def value_forward(self, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor) -> Tensor:
        """``(B, R)`` value of the state in which each response token is chosen (column ``P + t - 1``)."""
        input_ids, attention_mask, position_ids = self._sequence(query_ids, query_mask, response_ids)
        prompt_len, resp_len = query_ids.shape[1], response_ids.shape[1]
        cols = slice(prompt_len - 1, prompt_len + resp_len - 1)
        if self.value_model is not None:
            return self.value_model(input_ids, attention_mask, position_ids=position_ids)[:, cols]
        self._use_adapter(POLICY if self.config.value_from_policy else VALUE)
        try:
            hidden = decoder(self.model)(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
            ).last_hidden_state
        finally:
            self._use_adapter(POLICY)
        return self.value_head(hidden[:, cols])

    # ------------------------------------------------------------------------------ hooks to override
    @torch.no_grad()
    def generate(self, query_ids: Tensor, query_mask: Tensor) -> Tensor:
        """``(B, R)`` sampled response ids (``R <= max_new_tokens``), the policy adapter active, no dropout.

        Plain temperature sampling (top-k 0, top-p 1, no repetition penalty): the distribution
        :meth:`policy_forward` scores, drawn by :meth:`sample`. Uses the global torch RNG (seeded by
        ``seed_everything``).
        """
        return self._sample(query_ids, query_mask)[0]

    @torch.no_grad()
    def sample(self, query_ids: Tensor, query_mask: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Step 2: ``(response_ids, old_logprobs, old_values)``, ``(B, R)`` each.

        :func:`sample_with_logprobs` (a KV-cache loop making ``generate``'s model calls) returns each sampled
        token's log-prob under the distribution it was drawn from: the rollout's old logprobs, so no separate
        policy forward runs for them; with ``ppo.value_from_policy`` the value head reads the sampling steps'
        own hidden states (the old values), otherwise ``old_values`` is None (a value forward follows). When a
        subclass overrides :meth:`generate`, or with ``ppo.recompute_old_logprobs``, both are None (no-grad
        forwards follow).
        """
        if type(self).generate is not PPOModule.generate:
            return self.generate(query_ids, query_mask), None, None
        out = self._sample(query_ids, query_mask)
        if self.recompute_old_logprobs:
            return out[0], None, None
        return out[0], out[1], out[2] if len(out) == 3 else None

    def _sample(self, query_ids: Tensor, query_mask: Tensor, max_new_tokens: int | None = None) -> tuple[Tensor, ...]:
        shared_value = self.uses_critic and self.config.value_from_policy
        self._use_adapter(POLICY)
        fsdp_root = self._trainer.strategy.model if self._trainer is not None else None
        with full_params_for_generation(fsdp_root):  # FSDP1 outside the root's forward: unshard the root unit
            return sample_with_logprobs(
                self.model, query_ids, query_mask, max_new_tokens=max_new_tokens or self.config.max_new_tokens,
                temperature=self.config.temperature, eos_token_ids=self.eos_token_ids,
                pad_token_id=self.pad_token_id, value_head=self.value_head if shared_value else None,
                synced=forward_is_collective(self.model),
            )

    def sample_for_check(self, query_ids: Tensor, query_mask: Tensor, max_new_tokens: int):
        """``(response_ids, logprobs)`` of the rollout's own sampler for :func:`sampler_self_check`, or None when a
        subclass's :meth:`generate` samples (its old logprobs then come from a scoring forward)."""
        if type(self).generate is not PPOModule.generate:
            return None
        return self._sample(query_ids, query_mask, max_new_tokens)[:2]

    # ------------------------------------------------------------------------------------------ guards
    @property
    def compute_precision(self) -> Precision:
        """The precision the policy computes in (:func:`run_precision`), resolved once per fit."""
        if self._precision is None:
            self._precision = run_precision(self._trainer, self.model)
            if self.config.recompute_old_logprobs is None and self._precision.reduced:
                rank_zero_info(f"PPO: reduced precision ({self._precision.label}): the old log-probs are recomputed "
                               "by a full forward (module.config.recompute_old_logprobs=null means on here)")
        return self._precision

    @property
    def recompute_old_logprobs(self) -> bool:
        """``ppo.recompute_old_logprobs``, or by precision when None (on under reduced precision)."""
        setting = self.config.recompute_old_logprobs
        return self.compute_precision.reduced if setting is None else setting

    def _guard(self, check, *args) -> dict | None:
        """``check(*args)`` (raising :class:`InvariantError`) on every rank; when it fails on any, every rank stops
        (a rank left running would wait for the others in a collective)."""
        error, stats = None, None
        try:
            stats = check(*args)
        except InvariantError as exc:
            error = exc
        if any_across_ranks(error is not None):
            raise error or InvariantError("PPO invariant broken on another rank (see its error); every rank stops")
        return stats

    def _self_check(self, batch: dict) -> None:
        """Once per fit, before the first rollout: :func:`sampler_self_check` on the batch's first prompts."""
        self._self_check_pending = False
        if self.config.check_invariants:
            self._guard(sampler_self_check, self, batch["input_ids"], batch["attention_mask"],
                        self.compute_precision, self.config.first_ratio_tolerance)

    @torch.no_grad()
    def score(self, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor, masks: ResponseMasks) -> Tensor:
        """``(B,)`` raw RM scores of prompt + response cut at the stop.

        The attention mask is the prompt mask followed by the action mask, so the RM reads its score at the
        last attended token: the EOS, or the last token of a truncated response (the prompt's last token
        for an empty one).
        """
        input_ids = torch.cat([query_ids, response_ids], dim=1)
        attention_mask = torch.cat([query_mask, masks.action_mask.to(query_mask.dtype)], dim=1)
        return self.reward_model.score(input_ids, attention_mask).float()

    def compute_rewards(self, raw_scores: Tensor, logprobs: Tensor, ref_logprobs: Tensor,
                        masks: ResponseMasks) -> tuple[Tensor, ShapedRewards]:
        """``(calibrated scores, shaped rewards)``: the frozen calibration, then :func:`shape_rewards`
        (missing-EOS penalty, clip, ``-beta * KL`` per action, the score once at the terminal index)."""
        scores = self.calibration.normalise(raw_scores) if self.calibration is not None else raw_scores
        cfg = self.config
        shaped = shape_rewards(
            scores, logprobs, ref_logprobs, masks.action_mask, masks.terminal_index, self.kl_controller.value,
            cfg.kl_estimator, has_eos=masks.has_eos, missing_eos_penalty=cfg.missing_eos_penalty,
            score_clip=cfg.score_clip,
        )
        return scores, shaped

    def compute_advantages(self, rewards: Tensor, values: Tensor, action_mask: Tensor) -> tuple[Tensor, Tensor]:
        """``(advantages, returns)``, ``(B, R)`` each.

        ``gae``: masked GAE, advantages whitened over valid actions when configured (and at least two exist),
        with the statistics of every rank's rollout (``whiten_scope="global"``, a collective) or this rank's.
        ``rloo`` / ``grpo``: the sequence reward (sum of the shaped rewards: score - beta * KL) of each sample
        against its prompt's group, broadcast to every valid action; returns are then 0 (no critic).
        """
        cfg = self.config
        if cfg.advantage_estimator == "gae":
            advantages, returns = gae(rewards, values, action_mask, cfg.gamma, cfg.lam)
            if cfg.whiten_advantages:
                all_reduce = global_all_reduce() if cfg.whiten_scope == "global" else None
                count = action_mask.sum().to(advantages.dtype).reshape(1)
                if (all_reduce(count) if all_reduce is not None else count) >= 2:  # the same answer on every rank
                    advantages = masked_whiten(advantages, action_mask, all_reduce=all_reduce)
            return advantages, returns
        estimator = rloo_advantages if cfg.advantage_estimator == "rloo" else grpo_advantages
        sequence = estimator(masked_sum(rewards, action_mask, dim=1), cfg.samples_per_prompt)  # (B,)
        advantages = sequence[:, None] * action_mask.to(sequence.dtype)
        return advantages, torch.zeros_like(advantages)

    def policy_loss(self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, action_mask: Tensor):
        """Clipped surrogate (:func:`ppo_policy_loss`): ``(loss, PolicyLossStats)``."""
        return ppo_policy_loss(logprobs, old_logprobs, advantages, action_mask, self.config.clip_eps)

    def value_loss(self, values: Tensor, old_values: Tensor, returns: Tensor, action_mask: Tensor):
        """Clipped value loss (:func:`value_loss`): ``(loss, ValueLossStats)``."""
        return value_loss(values, old_values, returns, action_mask, self.config.value_clip_eps)

    def update_kl_controller(self, stats: dict[str, float]) -> None:
        """Feed the mean per-sequence KL of the global rollout (every rank's rows) to the controller, so that
        beta stays identical on every rank (a no-op for the fixed controller)."""
        kl_seq, size = global_weighted_mean(stats["rollout/kl_seq"], stats["rollout/size"])
        self.kl_controller.update(kl_seq, n_steps=int(size))

    # ------------------------------------------------------------------------------------- rollout
    @torch.no_grad()
    def make_rollout(self, batch: dict) -> Rollout:
        """Steps 1-6: prompts -> a frozen :class:`Rollout`."""
        k = self.config.samples_per_prompt
        # 1. prompts, each repeated k times (the k samples of a prompt are adjacent rows)
        query_ids = batch["input_ids"].repeat_interleave(k, dim=0)  # (B, P)
        query_mask = batch["attention_mask"].repeat_interleave(k, dim=0)
        # 2. sample (exact ids kept; the sampling log-probs with them)
        response_ids, sampled_logprobs, sampled_values = self.sample(query_ids, query_mask)  # (B, R) each
        # 3. masks from the sampled ids
        masks = response_masks(response_ids, self.eos_token_ids, self.pad_token_id)
        # 4. no-grad scoring in micro-batches (policy and value only when sampling gave none)
        parts: dict[str, list[Tensor]] = {"logprobs": [], "ref_logprobs": [], "values": [], "raw_scores": []}
        for rows in _chunks(query_ids.shape[0], self.config.forward_batch_size):
            q, qm, r = query_ids[rows], query_mask[rows], response_ids[rows]
            if sampled_logprobs is None:
                parts["logprobs"].append(self.policy_forward(q, qm, r)[0])
            else:
                parts["logprobs"].append(sampled_logprobs[rows].float())
            parts["ref_logprobs"].append(self.reference_logprobs(q, qm, r))
            if sampled_values is not None:
                values = sampled_values[rows].float()
            elif self.uses_critic:
                values = self.value_forward(q, qm, r).float()
            else:
                values = torch.zeros(r.shape, device=r.device)
            parts["values"].append(values)
            parts["raw_scores"].append(self.score(q, qm, r, ResponseMasks(*(m[rows] for m in masks))))
        scored = {name: torch.cat(chunks) for name, chunks in parts.items()}
        values = scored["values"] * masks.action_mask
        # 5. rewards
        scores, shaped = self.compute_rewards(scored["raw_scores"], scored["logprobs"], scored["ref_logprobs"], masks)
        # 6. advantages
        advantages, returns = self.compute_advantages(shaped.rewards, values, masks.action_mask)
        rollout = Rollout(
            query_ids=query_ids, query_mask=query_mask, response_ids=response_ids, masks=masks,
            logprobs=scored["logprobs"], ref_logprobs=scored["ref_logprobs"], values=values,
            raw_scores=scored["raw_scores"], scores=scores, rewards=shaped.rewards, kl=shaped.kl,
            advantages=advantages, returns=returns,
        )
        check_finite(rollout, self.rollouts_done)
        return rollout

    # ------------------------------------------------------------------------------------- training
    def on_train_start(self) -> None:
        self.model.eval()  # dropout off in rollouts and updates: the first ratio is 1 (up to kernel rounding)
        seed_rank_stream()  # several ranks: each samples its own stream (a no-op in one process)
        self._precision, self._self_check_pending = None, True
        self.compute_precision  # noqa: B018 -- resolved (and announced) under the Trainer's precision

    def training_step(self, batch: dict, batch_idx: int) -> None:
        self.model.eval()  # Lightning switches to train mode before each epoch
        if batch["input_ids"].shape[0] == 0:
            self.log("rollout/empty_batches", 1.0, batch_size=1)
            return None
        if self._self_check_pending:
            self._self_check(batch)
        # 1-6. rollout
        rollout = self.make_rollout(batch)
        stats = self.rollout_stats(rollout)
        # 7. update epochs on the frozen rollout
        if any_across_ranks(bool(rollout.action_mask.any())):  # ranks step together (DDP/FSDP collectives)
            stats.update(self.update(rollout))
        else:
            stats["rollout/skipped_update"] = 1.0  # no action to learn from (every response empty)
        # 8. log, drive the KL controller, sample table; the rollout is dropped on return
        optimizer = self.optimizers()
        stats["lr"] = optimizer.param_groups[0]["lr"]
        stats["kl/beta"] = float(self.kl_controller.value)
        self.log_stats(stats, batch_size=len(rollout))
        self.update_kl_controller(stats)
        self.rollouts_done += 1
        every = self.config.sample_every_n_rollouts
        if every and self.sample_prompts and self.rollouts_done % every == 0:
            self._use_adapter(POLICY)
            step = self.rollouts_done
            log_table(self, "samples", *sample_table(self.model, self.tokenizer, self.sample_prompts,
                                                     self.config.sampling, step))
        return None

    def update(self, rollout: Rollout) -> dict[str, float]:
        """Step 7: ``ppo_epochs`` x shuffled minibatches; returns the mean of each statistic."""
        cfg = self.config
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        sums: dict[str, float] = {}
        count, first_deviation = 0, None
        for epoch in range(cfg.ppo_epochs):
            order = torch.randperm(len(rollout), device=rollout.query_ids.device)
            for start in range(0, len(rollout), cfg.minibatch_size):
                mb = rollout.select(order[start:start + cfg.minibatch_size])
                if self.uses_critic and cfg.value_from_policy:  # one trunk pass for both
                    logprobs, logits, values = self.policy_value_forward(mb.query_ids, mb.query_mask,
                                                                         mb.response_ids)
                else:
                    logprobs, logits = self.policy_forward(mb.query_ids, mb.query_mask, mb.response_ids)
                if epoch == 0 and start == 0 and cfg.check_invariants:  # the weights have not moved yet
                    first = self._guard(
                        check_ratio, logprobs, mb.logprobs, mb.action_mask, self.compute_precision,
                        cfg.first_ratio_tolerance,
                        f"at rollout {self.rollouts_done} (first minibatch, before its first optimiser step)")
                    first_deviation = first.get("mean")
                loss, pstats = self.policy_loss(logprobs, mb.logprobs, mb.advantages, mb.action_mask)
                step = {"ppo/policy_loss": loss.detach(), "ppo/approx_kl": pstats.approx_kl,
                        "ppo/clipfrac": pstats.clipfrac, "ppo/ratio_mean": pstats.ratio_mean}
                with torch.set_grad_enabled(cfg.entropy_coef > 0):
                    entropy = masked_mean(entropy_from_logits(logits, cfg.temperature), mb.action_mask)
                step["ppo/entropy"] = entropy.detach()
                if cfg.entropy_coef > 0:
                    loss = loss - cfg.entropy_coef * entropy
                if self.uses_critic:
                    if not cfg.value_from_policy:
                        values = self.value_forward(mb.query_ids, mb.query_mask, mb.response_ids)
                    vloss, vstats = self.value_loss(values, mb.values, mb.returns, mb.action_mask)
                    loss = loss + cfg.vf_coef * vloss
                    step.update({"ppo/value_loss": vloss.detach(), "ppo/value_clipfrac": vstats.clipfrac,
                                 "ppo/value_mean": vstats.value_mean})
                if not torch.isfinite(loss):
                    raise FloatingPointError(
                        f"ppo: non-finite loss ({loss.item()}) at rollout {self.rollouts_done}, minibatch "
                        f"{count}; stopping before the optimiser step (no poisoned weights are kept)"
                    )
                optimizer.zero_grad()
                self.manual_backward(loss)
                if cfg.max_grad_norm is not None:
                    self.clip_gradients(optimizer, gradient_clip_val=cfg.max_grad_norm, gradient_clip_algorithm="norm")
                optimizer.step()
                scheduler.step()
                for key, value in step.items():
                    sums[key] = sums.get(key, 0.0) + float(value)
                sums["ppo/ratio_max"] = max(sums.get("ppo/ratio_max", 0.0), float(pstats.ratio_max))
                count += 1
        out = {k: (v if k == "ppo/ratio_max" else v / count) for k, v in sums.items()}
        out["ppo/optimizer_steps"] = float(count)
        if first_deviation is not None:
            out["guard/first_ratio_deviation"] = first_deviation  # mean |ratio - 1| before the first step
        return out

    #: Statistics that are not means: reduced across ranks with their own operation when logged.
    STAT_REDUCTIONS = {"rollout/size": "sum", "rollout/truncated": "sum", "ppo/ratio_max": "max"}

    def log_stats(self, stats: dict[str, float], batch_size: int) -> None:
        """Log ``stats`` synced across ranks: means averaged (``sync_dist``), counts summed, maxima maxed."""
        for op in ("mean", *sorted(set(self.STAT_REDUCTIONS.values()))):
            part = {k: v for k, v in stats.items() if self.STAT_REDUCTIONS.get(k, "mean") == op}
            if part:
                self.log_dict(part, batch_size=batch_size, sync_dist=True, reduce_fx=op)

    def rollout_stats(self, rollout: Rollout) -> dict[str, float]:
        """Per-rollout statistics: scores, KL, rewards, lengths, EOS rate, explained variance."""
        masks, mask = rollout.masks, rollout.action_mask
        lengths = masks.lengths.float()
        kl_seq = masked_sum(rollout.kl, mask, dim=1)
        stats = {
            "rollout/size": float(len(rollout)),
            "rollout/score_raw": rollout.raw_scores.mean(),
            "rollout/score": rollout.scores.mean(),
            "rollout/kl_seq": kl_seq.mean(),
            "rollout/kl_token": masked_mean(rollout.kl, mask),
            "rollout/kl_k1": masked_mean(kl_k1(rollout.logprobs, rollout.ref_logprobs), mask),
            "rollout/kl_cost": self.kl_controller.value * kl_seq.mean(),
            "rollout/reward_total": masked_sum(rollout.rewards, mask, dim=1).mean(),
            "rollout/length_mean": lengths.mean(),
            "rollout/length_p95": torch.quantile(lengths, 0.95),
            "rollout/eos_rate": masks.has_eos.float().mean(),
            "rollout/truncated": (~masks.has_eos & (masks.lengths > 0)).float().sum(),
            "rollout/advantage_mean": masked_mean(rollout.advantages, mask),
        }
        if self.uses_critic and mask.any():
            stats["ppo/explained_variance"] = explained_variance(rollout.values, rollout.returns, mask)
        return {k: float(v) for k, v in stats.items()}

    # ----------------------------------------------------------------------------------- optimiser
    def configure_optimizers(self):
        cfg = self.config
        total = cfg.total_steps
        if total is None:
            if cfg.scheduler != "constant" or cfg.warmup_steps:
                raise ValueError(f"ppo.total_steps must be set (in optimiser steps) for scheduler {cfg.scheduler!r}"
                                 " with warmup; see PPOModule.updates_per_rollout")
            total = 1
        return adamw_with_schedule(
            self, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=cfg.betas, scheduler=cfg.scheduler,
            warmup_steps=cfg.warmup_steps, total_steps=total,
        )

    # -------------------------------------------------------------------------------------- export
    def export(self, out_dir: str | Path) -> dict[str, Path]:
        """Write the trained policy: ``out_dir/merged`` (the ``policy`` adapter merged into a copy of the base,
        loadable by plain transformers, tokenizer alongside) and ``out_dir/adapter`` (the adapter alone, for
        ``PeftModel.from_pretrained(sft_base, out_dir/adapter)``). The live model keeps its adapters."""
        out_dir = Path(out_dir)
        return {
            "merged": export_merged(self.model, out_dir / "merged", self.tokenizer, adapter=POLICY),
            "adapter": export_adapter(self.model, out_dir / "adapter", POLICY, self.tokenizer),
        }

    # ---------------------------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["kl_controller"] = self.kl_controller.state_dict()
        checkpoint["rollouts_done"] = self.rollouts_done

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "kl_controller" in checkpoint:
            self.kl_controller.load_state_dict(checkpoint["kl_controller"])
        self.rollouts_done = checkpoint.get("rollouts_done", 0)


# ---------------------------------------------------------------------------------------------- helpers
def _chunks(n: int, size: int):
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def check_finite(rollout: Rollout, index: int) -> None:
    """Raise before any update when a score, reward, value or advantage is NaN or infinite."""
    mask = rollout.action_mask
    for name in ("raw_scores", "scores", "logprobs", "ref_logprobs", "values", "rewards", "advantages", "returns"):
        tensor = getattr(rollout, name)
        if tensor.dim() == 2:  # per action: only valid actions count (after a stop anything may sit there)
            tensor = torch.where(mask, tensor, 0.0)
        if not torch.isfinite(tensor).all():
            raise FloatingPointError(
                f"ppo: non-finite {name} in rollout {index}; stopping before any optimiser step on it "
                "(no poisoned weights are kept)"
            )


__all__ = ["ADVANTAGE_ESTIMATORS", "WHITEN_SCOPES", "PPOConfig", "PPOModule", "Rollout", "check_finite"]
