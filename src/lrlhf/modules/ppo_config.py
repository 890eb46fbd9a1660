"""Hyperparameters of PPO (``module.config``); the estimator, the critic, the KL controller, the policy loss and the
KL penalty are objects of their own (``module.advantage``, ``module.critic``, ``module.kl_controller``,
``module.policy_loss``, ``module.kl_penalty``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from lrlhf.models import LoraSpec
from lrlhf.models.decoding import DECODING
from lrlhf.models.generation import SamplingConfig
from lrlhf.modules.optim import OptimConfig


@dataclass
class PPOConfig(OptimConfig):
    """Hyperparameters of PPO (``module.config.*``); the estimator, critic and KL controller have their own."""

    max_new_tokens: int = 32
    """Most tokens generated per response; a response without EOS by then is truncated (and counted)."""
    temperature: float = 1.0
    """Sampling temperature (> 0). Top-k 0 and top-p 1: logprobs are those of ``softmax(logits / T)``."""
    decoding: str = "auto"
    """The rollout sampler's decoding (:mod:`lrlhf.models.decoding`): ``eager`` (a growing KV cache), ``static``
    (a preallocated one, fixed-shape steps), ``compiled`` (those steps ``torch.compile``-d: CUDA graphs on CUDA),
    ``auto`` (:data:`lrlhf.models.decoding.AUTO`: eager until a GPU run has measured compiled; always eager
    under FSDP)."""
    decoding_bucket: int = 64
    """Static/compiled decoding: the cache holds prompt + ``max_new_tokens`` columns rounded up to a multiple of
    this, so a few compiled shapes serve every rollout."""
    prefix_sharing: bool | str = "auto"
    """Group estimators (k samples per prompt, no critic): encode each prompt once in the rollout's scoring and
    update forwards (:mod:`lrlhf.modules.group_sharing`); ``auto`` where the prompts are at least a tenth of the
    columns, ``true``, ``false``. Shared update minibatches hold whole groups."""
    missing_eos_penalty: float | None = None
    """Subtracted from the score of a response that hit ``max_new_tokens`` without EOS; None = off."""
    score_clip: float | None = None
    """Clamp the (calibrated, penalised) score to ``[-score_clip, score_clip]``; None = off."""
    ppo_epochs: int = 4
    """Passes over each rollout."""
    minibatch_size: int = 8
    """Rows per optimiser step."""
    micro_batch_size: int | None = None
    """Rows per forward/backward within a minibatch (gradient accumulation: less memory, the same step); None = the
    whole minibatch at once. Every loss is normalised over the whole minibatch (the policy loss by its
    aggregation's denominator), so the step does not depend on the cut."""
    forward_batch_size: int = 32
    """Rows per no-grad scoring forward of the rollout."""
    target_kl: float | None = None
    """Early stop of a rollout's update (as OpenAI's baselines do): before each optimiser step, the minibatch's
    approximate KL between the old and the current policy (``mean(ratio - 1 - log ratio)`` over its tokens) is
    measured, and above ``target_kl`` the rollout's remaining minibatches and epochs are skipped. None = off."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (0 = none; the entropy is logged either way)."""
    max_grad_norm: float | None = 1.0
    """Gradient-norm clip per optimiser step; None = off."""
    scheduler: str = "constant"
    """LR schedule after warmup: a name in :data:`SCHEDULERS`, over ``total_steps`` optimiser steps."""
    policy_lora: LoraSpec = dataclasses.field(default_factory=LoraSpec)
    """The ``policy`` adapter (full-parameter PPO is not implemented: the reference is the adapter-free base)."""
    recompute_old_logprobs: bool | None = None
    """Take the old logprobs (and a shared-trunk critic's old values) from full no-grad forwards instead of the
    sampler's cached one-token forwards. None = by precision: on under reduced precision (half weights or autocast,
    TF32, k-bit), where the two kernels round differently (max |ratio - 1| 5.7e-3 under CPU bf16 autocast); off in
    full precision, where they agree to ~1e-6 (one policy forward saved)."""
    check_invariants: bool = True
    """Stop the run when the first-update ratio is not 1 (every rollout) or the sampler's log-probs disagree with
    a teacher-forced forward (once per fit, before the first rollout), naming the measured value and the cause."""
    first_ratio_tolerance: float | None = None
    """Bound on the mean |ratio - 1| of the first minibatch of each rollout; None = by precision
    (:data:`lrlhf.modules.guards.RATIO_TOLERANCE`: 1e-3 full, 0.1 reduced)."""
    def __post_init__(self):
        if isinstance(self.policy_lora, dict):  # from a YAML/Hydra config
            self.policy_lora = LoraSpec(**self.policy_lora)
        self.check_optim()
        checks = [
            ("max_new_tokens", self.max_new_tokens >= 1, "must be >= 1"),
            ("temperature", self.temperature > 0, "must be > 0 (PPO samples; greedy has no logprobs)"),
            ("decoding", self.decoding in DECODING, f"must be one of {', '.join(DECODING)}"),
            ("decoding_bucket", self.decoding_bucket >= 1, "must be >= 1"),
            ("prefix_sharing", isinstance(self.prefix_sharing, bool) or self.prefix_sharing == "auto",
             "must be auto, true or false"),
            ("score_clip", self.score_clip is None or self.score_clip > 0, "must be > 0 or None"),
            ("ppo_epochs", self.ppo_epochs >= 1, "must be >= 1"),
            ("minibatch_size", self.minibatch_size >= 1, "must be >= 1"),
            ("micro_batch_size", self.micro_batch_size is None or 1 <= self.micro_batch_size <= self.minibatch_size,
             "must be in [1, module.config.minibatch_size] or None"),
            ("forward_batch_size", self.forward_batch_size >= 1, "must be >= 1"),
            ("target_kl", self.target_kl is None or self.target_kl > 0, "must be > 0 or None (off)"),
            ("entropy_coef", self.entropy_coef >= 0, "must be >= 0"),
            ("max_grad_norm", self.max_grad_norm is None or self.max_grad_norm > 0, "must be > 0 or None"),
            ("first_ratio_tolerance", self.first_ratio_tolerance is None or self.first_ratio_tolerance > 0,
             "must be > 0 or None (by precision)"),
        ]
        for key, ok, rule in checks:
            if not ok:
                raise ValueError(f"module.config.{key} {rule}, got {getattr(self, key)!r}")

    @property
    def sampling(self) -> SamplingConfig:
        """The sampling config of the rollouts, as the hyperparameters record it (the rollouts draw from the run's RNG
        stream: its seed is unused)."""
        return SamplingConfig(self.max_new_tokens, self.temperature)


def component_settings(component) -> dict | None:
    """The hyperparameters of a component built by ``_target_`` (estimator, critic, KL controller): its class and
    its settings (a dataclass's constructor fields, or its ``settings()``), as the module's hparams record them."""
    if component is None:
        return None
    cls = type(component)
    if dataclasses.is_dataclass(component):
        settings = {f.name: getattr(component, f.name) for f in dataclasses.fields(component) if f.init}
        settings = {k: component_settings(v) if dataclasses.is_dataclass(v) and not isinstance(v, type) else v
                    for k, v in settings.items()}  # a nested component (a policy loss's aggregation)
    else:
        settings = component.settings() if hasattr(component, "settings") else {}
    return {"_target_": f"{cls.__module__}.{cls.__qualname__}", **settings}


__all__ = ["PPOConfig", "component_settings"]
