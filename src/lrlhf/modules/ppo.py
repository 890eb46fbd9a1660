"""PPO for language models: one frozen base serving policy, reference and value; a frozen reward model.

Roles (``docs/architecture.md``): **policy** = the merged SFT base (frozen) + LoRA adapter ``policy``;
**reference** = the same base with every adapter disabled; **value** = the critic (``module.critic``,
:mod:`lrlhf.modules.critic`); **reward** = a reward source (``module.reward_model``, :mod:`lrlhf.rewards.protocol`: a
frozen :class:`ScalarModel`, its ``reward`` adapter on the policy's base, an ensemble, a program), with an optional
frozen calibration. The advantage estimator (``module.advantage``, :mod:`lrlhf.modules.advantages`: GAE = PPO, RLOO,
GRPO), the critic and the KL controller (``module.kl_controller``, owned and checkpointed here) are objects chosen by
``_target_``. Two collaborators built from the config do the plumbing, named at each call: ``guards``
(:class:`~lrlhf.modules.guards.PPOGuards`: precision, sampler self-check, first-update ratio, finite loss) and
``sharing`` (:class:`~lrlhf.modules.group_sharing.GroupSharing`: the group estimators' prefix-shared forwards).

One Trainer batch of prompts is one rollout and its update epochs (manual optimisation), in the numbered steps of
:meth:`training_step` and :meth:`make_rollout`. ``global_step`` counts optimiser steps (``updates_per_rollout``).
The logits and the value of action ``t`` of ``prompt (P columns, left-padded) + response`` are read at column
``P + t - 1``, positions as ``generate``'s (:func:`~lrlhf.models.engines.sequence_inputs`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import Tensor, nn

from lrlhf.functional import (
    ClipPPO,
    FixedKLController,
    KLController,
    KLInReward,
    KLPenalty,
    PolicyLoss,
    ResponseMasks,
    ShapedRewards,
    response_masks,
    shape_rewards,
    token_logprobs,
    value_loss,
)
from lrlhf.functional.off_policy import OffPolicyCorrection
from lrlhf.functional.rewards import Overlong
from lrlhf.models import ModelConfig, ScalarModel, add_adapters, load_adapter_weights, load_causal_lm, load_tokenizer
from lrlhf.models import reference_mode as _reference_mode
from lrlhf.models.engines import LocalEngine, RolloutEngine, sequence_inputs
from lrlhf.models.generation import eos_token_ids
from lrlhf.models.reward import RewardCalibration, load_calibration
from lrlhf.modules.advantages import GAE, AdvantageEstimator, DynamicSampling
from lrlhf.modules.critic import POLICY, Critic, ValueAdapter
from lrlhf.modules.group_sharing import GroupSharing
from lrlhf.modules.guards import PPOGuards, Precision
from lrlhf.modules.ppo_config import PPOConfig, component_settings
from lrlhf.modules.ppo_stage import PPOStage
from lrlhf.modules.ppo_update import PPOUpdate
from lrlhf.modules.rollout import Rollout, Sampled, Scored, check_finite, log_synced, row_chunks, score_rows
from lrlhf.rewards import protocol as reward_protocol
from lrlhf.rewards.protocol import Meta, RewardAdapter, RewardEnsemble, RewardScores, RewardSource, reward_source
from lrlhf.strategies import full_params_for_generation
from lrlhf.utils.distributed import any_across_ranks, forward_is_collective, global_weighted_mean, seed_rank_stream
from lrlhf.utils.errors import InvariantError


class PPOModule(PPOStage, PPOUpdate, pl.LightningModule):
    """PPO with LoRA roles on one frozen base (see the module docstring).

    Args:
        policy: the SFT model: a :class:`ModelConfig` (loaded in :meth:`configure_model`) or a plain causal LM.
        reward_model: a reward source (:mod:`lrlhf.rewards.protocol`: ``build`` and ``score``; a :class:`RewardAdapter`,
            the RM's LoRA adapter on the policy's base; a :class:`RewardEnsemble`, an ensemble folder and its rule; a
            :class:`~lrlhf.rewards.protocol.FunctionReward`), or a frozen :class:`ScalarModel` or the folder of
            :meth:`RewardModule.export` (a :class:`~lrlhf.rewards.protocol.FrozenRewardModel`).
        tokenizer: loaded from the ``ModelConfig`` when None. config: :class:`PPOConfig` or a dict of its fields.
        calibration: frozen ``(r - mean) / std`` of the RM scores, or a path to it, or a :class:`~lrlhf.modules
            .calibration.ReferenceSamples` measured before the first update; None = raw scores.
        advantage: an :class:`~lrlhf.modules.advantages.AdvantageEstimator`; None = ``GAE()``.
        critic: a :class:`~lrlhf.modules.critic.Critic`; None = a ``ValueAdapter()`` if the estimator needs one.
        kl_controller: a :class:`~lrlhf.functional.KLController`; None = ``FixedKLController()`` (beta 0.05).
        policy_loss: the policy objective, a :class:`~lrlhf.functional.PolicyLoss` (``module/policy_loss=ppo_clip|
            clip_higher|dual_clip|gspo``, its aggregation inside); None = ``ClipPPO()`` (clip 0.2, token mean).
        kl_penalty: where the KL goes (``module/kl_penalty=in_reward|in_loss``, :class:`~lrlhf.functional.KLPenalty`);
            None = ``KLInReward()`` (k1 per action in the reward).
        off_policy: the sampler/trainer correction (``module/off_policy=truncated_is|masked_is``,
            :mod:`lrlhf.functional.off_policy`): the old log-probs are then the trainer's forward, and each token's
            policy loss is weighted by ``pi_old / mu`` bounded at a cap; None = off (the sampler's are the old ones).
        overlong: what truncated responses get (``module/overlong=mask|soft_penalty``, :class:`~lrlhf.functional
            .rewards.Overlong`); None = nothing (``module.config.missing_eos_penalty`` still applies).
        group_filter: DAPO's dynamic sampling for RLOO / GRPO (``module/group_filter=dynamic_sampling``,
            :class:`~lrlhf.modules.advantages.DynamicSampling`); None = every group is kept.
        engine: what samples the rollouts (``module/engine=merged``, :mod:`lrlhf.models.engines`); None = a
            :class:`~lrlhf.models.engines.LocalEngine` with ``module.config.decoding``.
        init_adapter: a saved ``policy`` adapter (a PPO stage's ``export/adapter``) the policy starts from instead
            of zero, e.g. the previous round of iterative RLHF; the reference stays the base (adapters off).

    Hooks to override (small, one job each): :meth:`sample`, :meth:`score`, :meth:`compute_rewards`,
    :meth:`compute_advantages`, :meth:`policy_loss`, :meth:`value_loss`, :meth:`update_kl_controller`.
    """

    def __init__(
        self,
        policy: ModelConfig | nn.Module,
        reward_model: RewardSource | ScalarModel | str | Path,
        tokenizer=None,
        config: PPOConfig | dict | None = None,
        calibration: RewardCalibration | str | Path | None = None,
        advantage: AdvantageEstimator | None = None,
        critic: Critic | None = None,
        kl_controller: KLController | None = None,
        init_adapter: str | Path | None = None,
        policy_loss: PolicyLoss | None = None,
        kl_penalty: KLPenalty | None = None,
        off_policy: OffPolicyCorrection | None = None,
        overlong: Overlong | None = None,
        group_filter: DynamicSampling | None = None,
        engine: RolloutEngine | None = None,
    ):
        super().__init__()
        self.automatic_optimization = False
        self.config = config if isinstance(config, PPOConfig) else PPOConfig(**(config or {}))
        self.advantage = advantage if advantage is not None else GAE()
        if critic is not None and not self.advantage.needs_critic:
            raise ValueError(f"module.critic must be null with {type(self.advantage).__name__} (module.advantage): "
                             "it uses no critic")
        self.model_config = policy if isinstance(policy, ModelConfig) else None
        self.model: nn.Module | None = None
        self._policy_module = None if self.model_config is not None else policy
        #: the reward source (:mod:`lrlhf.rewards.protocol`), built in :meth:`configure_model`, called by :meth:`score`
        self.reward: RewardSource = reward_source(reward_model)
        #: the frozen module it scores with (None for a program), registered here: the checkpoint's frozen part
        self.reward_model: nn.Module | None = reward_model if isinstance(reward_model, nn.Module) else None
        self._reward_source = None if self.reward_model is not None else reward_model  # (the checkpoint's record)
        self.calibration = load_calibration(calibration) if isinstance(calibration, (str, Path)) else calibration
        self.calibration_spec = calibration if hasattr(calibration, "measure") else None  # measured in the run
        self.critic = critic if critic is not None or not self.advantage.needs_critic else ValueAdapter()
        self.kl_controller = kl_controller if kl_controller is not None else FixedKLController()
        #: the policy objective :meth:`policy_loss` calls (``module.policy_loss``)
        self.surrogate: PolicyLoss = policy_loss if policy_loss is not None else ClipPPO()
        if not isinstance(self.surrogate, PolicyLoss):
            raise ValueError(f"module.policy_loss must be a PolicyLoss (lrlhf.functional), got "
                             f"{type(self.surrogate).__name__}")
        #: where the KL goes (``module.kl_penalty``), the sampler/trainer correction, the truncated responses' lot
        self.kl_penalty: KLPenalty = kl_penalty if kl_penalty is not None else KLInReward()
        self.off_policy: OffPolicyCorrection | None = off_policy
        self.overlong: Overlong = overlong if overlong is not None else Overlong()
        #: DAPO's dynamic sampling (``module.group_filter``): a group estimator's degenerate groups left out
        self.group_filter = group_filter
        self.empty_in_a_row = 0  # rollouts in a row it left empty
        if group_filter is not None and self.advantage.samples_per_prompt < 2:
            raise ValueError("module.group_filter needs a group estimator (module/advantage=rloo|grpo, k >= 2 "
                             "samples per prompt)")
        cfg = self.config
        if off_policy is not None and cfg.recompute_old_logprobs is False:
            raise ValueError("module.off_policy corrects the sampler's log-probs against the trainer's forward: it "
                             "needs module.config.recompute_old_logprobs=null or true, got false")
        k = self.advantage.samples_per_prompt
        if cfg.micro_batch_size and cfg.prefix_sharing is True and cfg.micro_batch_size % k:
            raise ValueError(f"module.config.micro_batch_size={cfg.micro_batch_size} must be a multiple of "
                             f"module.advantage.samples_per_prompt={k} with module.config.prefix_sharing=true (a "
                             "shared forward holds whole groups)")
        self.sharing = GroupSharing(cfg.prefix_sharing, self.advantage.samples_per_prompt, cfg.minibatch_size,
                                    has_critic=self.critic is not None)
        self.guards = PPOGuards(cfg.check_invariants, cfg.first_ratio_tolerance, cfg.recompute_old_logprobs)
        #: what samples the rollouts (:mod:`lrlhf.models.engines`), synced and checked against the policy each rollout
        self.engine: RolloutEngine = engine if engine is not None else LocalEngine(cfg.decoding, cfg.decoding_bucket)
        if getattr(self.engine, "decoding", "") is None:  # an engine that samples with the module's decoding
            self.engine.decoding, self.engine.bucket = cfg.decoding, cfg.decoding_bucket
        if tokenizer is None and self.model_config is not None:
            tokenizer = load_tokenizer(self.model_config)
        self.tokenizer = tokenizer
        self.init_adapter = init_adapter
        self.rollouts_done = 0
        self._adapter_names: set[str] = set()
        hparams = {"ppo": asdict(self.config), "sampling": asdict(self.config.sampling),
                   **{k: component_settings(getattr(self, k))
                      for k in ("advantage", "critic", "kl_controller", "kl_penalty", "off_policy", "overlong",
                                "group_filter", "engine")},
                   "policy_loss": component_settings(self.surrogate)}
        if self.model_config is not None:
            hparams["model"] = asdict(self.model_config)
        self.save_hyperparameters(hparams)

    # ---------------------------------------------------------------------------------- model setup
    def configure_model(self) -> None:
        """Load the roles (idempotent; called by the Trainer, or by hand to use the module outside one)."""
        if self.model is not None:
            return
        base = self._policy_module if self._policy_module is not None else load_causal_lm(self.model_config)
        self._policy_module = None
        adapters = {POLICY: self.config.policy_lora, **(self.critic.adapters() if self.critic is not None else {})}
        if self.critic is not None:
            self.critic.build(base)  # before the adapters: the head's init draws from the RNG first
        self.model = add_adapters(base, adapters)
        if self.init_adapter is not None:
            load_adapter_weights(self.model, self.init_adapter, POLICY)
        # peft's set_adapter leaves only the active adapter trainable; all train here, so remember them (by
        # name: a sharding strategy such as FSDP2 replaces the parameter objects, not their names).
        self._adapter_names = {n for n, _ in self.model.named_parameters() if "lora_" in n}
        self.use_adapter(POLICY)
        if self.tokenizer is None:
            raise ValueError("PPOModule needs a tokenizer (pass one with a ready model)")
        self.reward_model = self.reward.build(self.model, self.tokenizer)
        if self.reward_model is not None:
            self.reward_model.requires_grad_(False).eval()
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else self.tokenizer.eos_token_id
        self.eos_token_ids = sorted(eos_token_ids(self.model, self.tokenizer))
        self.engine.sync(self.model)

    def use_adapter(self, name: str) -> None:
        """Make ``name`` the active adapter, every adapter trainable (peft's ``set_adapter`` freezes the rest)."""
        if self.model.active_adapter != name:
            self.model.set_adapter(name)
        for n, p in self.model.named_parameters():
            if n in self._adapter_names:
                p.requires_grad_(True)

    @property
    def compute_precision(self) -> Precision:
        """The precision the policy computes in, resolved once per fit by the guards."""
        return self.guards.resolve_precision(self._trainer, self.model)

    def updates_per_rollout(self, n_prompts: int) -> int:
        """Optimiser steps one rollout of ``n_prompts`` prompts makes."""
        rows = n_prompts * self.advantage.samples_per_prompt
        return self.config.ppo_epochs * math.ceil(rows / self.config.minibatch_size)

    # ------------------------------------------------------------------------------------- forwards
    _sequence = staticmethod(sequence_inputs)

    def _response_logits(self, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor) -> Tensor:
        """``(B, R, V)`` logits predicting each response token: columns ``P - 1 .. P + R - 2`` (or a group
        estimator's prompt encoded once for its k samples, :mod:`lrlhf.modules.group_sharing`)."""
        shared = self.sharing.response_logits(self.model, query_ids, query_mask, response_ids)
        if shared is not None:
            return shared
        input_ids, attention_mask, position_ids = self._sequence(query_ids, query_mask, response_ids)
        resp_len = response_ids.shape[1]
        # the LM head runs on the last R + 1 columns only (the prompt's logits are never used)
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            logits_to_keep=resp_len + 1).logits
        return logits[:, :resp_len]

    def policy_forward(self, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor) -> tuple[Tensor, Tensor]:
        """``(logprobs, logits)``: ``(B, R)`` log-probs of the response under the policy at the sampling
        temperature, and the ``(B, R, V)`` raw logits they came from (differentiable)."""
        self.use_adapter(POLICY)
        logits = self._response_logits(query_ids, query_mask, response_ids)
        return token_logprobs(logits, response_ids, self.config.temperature), logits

    @torch.no_grad()
    def reference_logprobs(self, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor) -> Tensor:
        """``(B, R)`` log-probs of the response under the reference (the base, every adapter disabled)."""
        with _reference_mode(self.model):
            logits = self._response_logits(query_ids, query_mask, response_ids)
        assert not logits.requires_grad, "the reference must not build a graph"
        return token_logprobs(logits, response_ids, self.config.temperature)

    def value_forward(self, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor) -> Tensor:
        """``(B, R)`` the critic's value of the state each action is chosen in (column ``P + t - 1``); 0 without one."""
        if self.critic is None:
            return torch.zeros(response_ids.shape, device=response_ids.device)
        prompt_len, resp_len = query_ids.shape[1], response_ids.shape[1]
        return self.critic.values(self.model, self.use_adapter, *self._sequence(query_ids, query_mask, response_ids),
                                  slice(prompt_len - 1, prompt_len + resp_len - 1))

    def policy_value_forward(self, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor):
        """``(logprobs, logits, values)`` of a minibatch (values None without a critic), as the critic runs them."""
        if self.critic is None:
            return (*self.policy_forward(query_ids, query_mask, response_ids), None)
        return self.critic.with_policy_pass(self.model, self.policy_forward, self.value_forward, query_ids, query_mask,
                                            response_ids)

    # ------------------------------------------------------------------------------ hooks to override
    @torch.no_grad()
    def sample(self, query_ids: Tensor, query_mask: Tensor, max_new_tokens: int | None = None) -> Sampled:
        """Step 2, the one sampling hook: :class:`Sampled` ``(response_ids, logprobs, values)``, ``(B, R)`` each,
        ``R <= max_new_tokens`` (None = ``module.config.max_new_tokens``), the policy adapter active, no dropout.

        Here the rollout engine's (``self.engine``, :class:`~lrlhf.models.engines.LocalEngine`:
        :func:`~lrlhf.models.generation.sample_with_logprobs`): temperature sampling (top-k 0, top-p 1) with a KV cache
        (``module.config.decoding``: eager, static or compiled) and the global torch RNG, with each token's
        log-prob under the distribution it was drawn from (the old logprobs) and a shared-trunk critic's values.
        A subclass returning ``Sampled(ids)`` gets them from scoring forwards.
        """
        self.use_adapter(POLICY)
        fsdp_root = self._trainer.strategy.model if self._trainer is not None else None
        with full_params_for_generation(fsdp_root):  # FSDP1 outside the root's forward: unshard the root unit
            out = self.engine.generate(
                query_ids, query_mask, max_new_tokens=max_new_tokens or self.config.max_new_tokens,
                temperature=self.config.temperature, eos_token_ids=self.eos_token_ids, pad_token_id=self.pad_token_id,
                value_head=self.critic.sampling_head if self.critic is not None else None,
                synced=forward_is_collective(self.model))
        return Sampled(*out)

    def generate(self, query_ids: Tensor, query_mask: Tensor) -> Tensor:
        """``(B, R)`` the response ids of :meth:`sample` (for evaluations; a subclass overrides :meth:`sample`)."""
        return self.sample(query_ids, query_mask).response_ids

    @torch.no_grad()
    def score(self, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor, masks: ResponseMasks,
              meta: Meta = None) -> Tensor:
        """``(B,)`` raw scores of prompt + response cut at the stop by the reward source (``self.reward``), given each
        row's prompt record ``meta`` (None: not at hand); a reward model reads its score at the EOS (or last token)."""
        self.prepare_reward()
        raw = self.reward.score(query_ids, query_mask, response_ids, masks, meta=meta)
        return reward_protocol.checked_scores(self.reward, raw, len(response_ids)).scores

    @torch.no_grad()
    def reward_scores(self, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor, masks: ResponseMasks,
                      meta: Meta = None) -> RewardScores:
        """:meth:`score` with the reward source's extras (``disagreement``: an ensemble's members' std per sample),
        what the rollout, the calibration and the held-out evaluation read. A subclass's :meth:`score` scores alone."""
        if type(self).score is not PPOModule.score:
            return RewardScores(self.score(query_ids, query_mask, response_ids, masks))
        self.prepare_reward()
        raw = self.reward.score(query_ids, query_mask, response_ids, masks, meta=meta)
        return reward_protocol.checked_scores(self.reward, raw, len(response_ids))

    def prepare_reward(self) -> None:
        """A reward source that measures something on the reference's samples before its first score (a mixture's
        scales: ``prepare(module, datamodule)``) does it here, once, in a fit."""
        if hasattr(self.reward, "prepare") and self._trainer is not None and self.trainer.datamodule is not None:
            self.reward.prepare(self, self.trainer.datamodule)

    def compute_rewards(self, raw_scores: Tensor, logprobs: Tensor, ref_logprobs: Tensor,
                        masks: ResponseMasks) -> tuple[Tensor, ShapedRewards]:
        """``(calibrated scores, shaped rewards)``: the frozen calibration, the overlong penalty, then
        :func:`shape_rewards` (missing-EOS penalty, clip, ``-beta * KL`` per action unless the KL is in the loss,
        the score once at the terminal index)."""
        calibration = self.reward_calibration()
        scores = calibration.normalise(raw_scores) if calibration is not None else raw_scores
        cfg = self.config
        scores = scores - self.overlong.penalty(masks.lengths, masks.has_eos, cfg.max_new_tokens)
        beta = 0.0 if self.kl_penalty.in_loss else self.kl_controller.value  # in the loss: the rewards carry none
        shaped = shape_rewards(
            scores, logprobs, ref_logprobs, masks.action_mask, masks.terminal_index, beta,
            self.kl_penalty.measure, has_eos=masks.has_eos, missing_eos_penalty=cfg.missing_eos_penalty,
            score_clip=cfg.score_clip,
        )
        return scores, shaped

    def reward_calibration(self) -> RewardCalibration | None:
        """The frozen calibration; one to measure (:class:`~lrlhf.rewards.calibration.ReferenceSamples`) is measured
        at its first use, before any update (a resumed run restores the measured one from its checkpoint)."""
        if hasattr(self.calibration, "measure"):
            if self.rollouts_done:
                raise InvariantError("module.calibration: a resumed run has no measured calibration in its checkpoint")
            self.calibration = self.calibration.measure(self, self.trainer.datamodule)
            if self.trainer.is_global_zero:
                c = self.calibration
                print(f"reward calibration on {c.reference}: mean {c.mean:.4f}, std {c.std:.4f}", flush=True)
        return self.calibration

    def compute_advantages(self, rewards: Tensor, values: Tensor, action_mask: Tensor) -> tuple[Tensor, Tensor]:
        """``(advantages, returns)``, ``(B, R)`` each: the estimator (``module.advantage``)."""
        return self.advantage(rewards, values, action_mask)

    def policy_loss(self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, action_mask: Tensor, **terms):
        """The policy objective (``self.surrogate``: PPO's clip, clip-higher, dual clip, GSPO): ``(loss,
        PolicyLossStats)``; ``terms``: its ``weights``, ``extra`` and ``denominator`` (:class:`PolicyLoss`)."""
        return self.surrogate(logprobs, old_logprobs, advantages, action_mask, **terms)

    def value_loss(self, values: Tensor, old_values: Tensor, returns: Tensor, action_mask: Tensor):
        """Clipped value loss (:func:`value_loss`, ``module.critic.value_clip_eps``): ``(loss, ValueLossStats)``."""
        return value_loss(values, old_values, returns, action_mask, self.critic.value_clip_eps)

    def update_kl_controller(self, stats: dict[str, float]) -> dict[str, float]:
        """Feed the global rollout's mean per-sequence KL to the controller (beta stays equal on every rank); returns
        ``kl/beta_next`` (the next rollout's beta), the KL fed ``kl/seq_sum_<estimator>``, ``kl/<controller stat>``."""
        kl_seq, size = global_weighted_mean(stats["rollout/kl_seq"], stats["rollout/size"])
        self.kl_controller.update(kl_seq, n_steps=int(size))
        return {"kl/beta_next": self.kl_controller.value, f"kl/seq_sum_{self.kl_penalty.measure}": kl_seq,
                **{f"kl/{k}": v for k, v in self.kl_controller.stats().items()}}

    # ------------------------------------------------------------------------------------- rollout
    @torch.no_grad()
    def make_rollout(self, batch: dict) -> Rollout:
        """Steps 1-6: prompts -> a frozen :class:`Rollout`."""
        k = self.advantage.samples_per_prompt
        # 1. prompts, each repeated k times (the k samples of a prompt are adjacent rows), with their records' meta
        query_ids = batch["input_ids"].repeat_interleave(k, dim=0)  # (B, P)
        query_mask = batch["attention_mask"].repeat_interleave(k, dim=0)
        meta = [m for m in batch["meta"] for _ in range(k)] if "meta" in batch else None
        prompt_index = torch.arange(batch["input_ids"].shape[0]).repeat_interleave(k)  # each row's prompt in batch
        # 2. sample (exact ids kept; the sampling log-probs, and a shared trunk's values, with them)
        response_ids, sampled_logprobs, sampled_values = self.sample(query_ids, query_mask)  # (B, R) each
        sampler_logprobs = sampled_logprobs  # mu: what the tokens were drawn from
        if self.off_policy is not None and sampler_logprobs is None:
            raise ValueError(f"module.off_policy needs the sampler's log-probs: {type(self).__name__}.sample "
                             "returned none (Sampled(ids) alone)")
        if self.off_policy is not None or self.guards.recompute_old_logprobs(self.compute_precision, self.engine):
            sampled_logprobs = sampled_values = None  # the old log-probs (and values) from the trainer's forwards
        # 3. masks from the sampled ids
        masks = response_masks(response_ids, self.eos_token_ids, self.pad_token_id)
        # 4. the reward of every row, in micro-batches of whole groups (where sharing may apply, as many per rank)
        k = self.sharing.scoring_group_size
        chunk = max(k, self.config.forward_batch_size // k * k)
        reward = score_rows(self.reward_scores, query_ids, query_mask, response_ids, masks, meta, chunk)
        rows = Scored(query_ids, query_mask, response_ids, masks, reward, sampled_logprobs, sampled_values,
                      sampler_logprobs, prompt_index=prompt_index)
        if self.group_filter is not None:  # dynamic sampling: groups of equal scores leave before the forwards
            zeros = response_ids.new_zeros(response_ids.shape, dtype=torch.float32)  # the scores need no log-prob
            scores = self.compute_rewards(reward.scores, zeros, zeros, masks)[1].scores
            keep, stats = self.group_filter.rows(scores, self.advantage.samples_per_prompt)
            rows = dataclasses.replace(rows.select(keep), filter_stats=stats)
        # 5. no-grad forwards of the rows kept: the reference, and the policy and values where sampling gave none
        parts: dict[str, list[Tensor]] = {"logprobs": [], "ref_logprobs": [], "values": []}
        for chunk_rows in row_chunks(len(rows.query_ids), chunk):
            q, qm, r = rows.query_ids[chunk_rows], rows.query_mask[chunk_rows], rows.response_ids[chunk_rows]
            parts["logprobs"].append(self.policy_forward(q, qm, r)[0] if rows.logprobs is None
                                     else rows.logprobs[chunk_rows].float())
            parts["ref_logprobs"].append(self.reference_logprobs(q, qm, r))
            values = self.value_forward(q, qm, r) if rows.values is None else rows.values[chunk_rows]
            parts["values"].append(values.float())
        empty = rows.response_ids.new_zeros(rows.response_ids.shape, dtype=torch.float32)  # no row kept: (0, R)
        scored = {name: torch.cat(chunks) if chunks else empty for name, chunks in parts.items()}
        masks = rows.masks
        values = scored["values"] * masks.action_mask
        # rewards: the calibrated scores, the KL
        scores, shaped = self.compute_rewards(rows.reward.scores, scored["logprobs"], scored["ref_logprobs"], masks)
        rollout = Rollout(
            query_ids=rows.query_ids, query_mask=rows.query_mask, response_ids=rows.response_ids, masks=masks,
            logprobs=scored["logprobs"], ref_logprobs=scored["ref_logprobs"], values=values,
            raw_scores=rows.reward.scores, scores=scores, rewards=shaped.rewards, kl=shaped.kl,
            advantages=values.new_zeros(values.shape), returns=values.new_zeros(values.shape),  # step 6
            policy_mask=masks.action_mask & self.overlong.keep(masks.lengths, masks.has_eos)[:, None],
            sampler_logprobs=(scored["logprobs"] if rows.sampler_logprobs is None else rows.sampler_logprobs.float()),
            disagreement=rows.reward.disagreement, components=rows.reward.components, filter_stats=rows.filter_stats,
            prompt_index=rows.prompt_index,
        )
        # 6. advantages
        advantages, returns = self.compute_advantages(rollout.rewards, rollout.values, rollout.action_mask)
        rollout = dataclasses.replace(rollout, advantages=advantages, returns=returns)
        check_finite(rollout, self.rollouts_done)
        return rollout

    # ------------------------------------------------------------------------------------- training
    def on_train_start(self) -> None:
        self.model.eval()  # dropout off in rollouts and updates: the first ratio is 1 (up to kernel rounding)
        seed_rank_stream()  # several ranks: each samples its own stream (a no-op in one process)
        self.guards.start_fit()
        self.compute_precision  # noqa: B018 -- resolved (and announced) under the Trainer's precision

    def training_step(self, batch: dict, batch_idx: int) -> dict | None:
        self.model.eval()  # Lightning switches to train mode before each epoch (the critic stays in eval mode)
        if batch["input_ids"].shape[0] == 0:
            self.log("rollout/empty_batches", 1.0, batch_size=1)
            return None
        self.engine.sync(self.model)  # the weights the update left; the engine checked against the policy on them
        if self.guards.self_check_pending:  # once per fit, before the first rollout
            self.guards.check_sampler(self.sample, self.policy_forward, self.eos_token_ids, self.pad_token_id, batch,
                                      self.compute_precision, self.engine)
        engine_gap = self.guards.check_engine(self.engine, self.policy_forward, batch, self.config.temperature,
                                              self.compute_precision, self.rollouts_done)
        # 1-6. rollout
        rollout = self.make_rollout(batch)
        if len(rollout) == 0:  # dynamic sampling found no group to learn from on some rank: no update
            log_synced(self, {**rollout.filter_stats, "rollout/skipped_update": 1.0}, batch_size=1)
            self.rollouts_done += 1
            self.empty_in_a_row += 1  # no optimiser step: trainer.max_steps alone would never end the run
            self.group_filter.check_empty(self.empty_in_a_row, self.rollouts_done)
            return None
        self.empty_in_a_row = 0
        stats = {**self.rollout_stats(rollout), **engine_gap}
        # 7. update epochs on the frozen rollout
        stats["rollout/skipped_update"] = 0.0
        if any_across_ranks(bool(rollout.action_mask.any())):  # ranks step together (DDP/FSDP collectives)
            stats.update(self.update(rollout))
            self.engine.sync(self.model)  # the callbacks after the step sample the updated policy
        else:
            stats["rollout/skipped_update"] = 1.0  # no action to learn from (every response empty)
        # 8. log, drive the KL controller; the rollout is dropped on return
        stats["lr"] = self.optimizers().param_groups[0]["lr"]
        stats["kl/beta"] = float(self.kl_controller.value)
        log_synced(self, stats, batch_size=len(rollout))  # means averaged across ranks, counts summed, maxima maxed
        if not self.in_value_warmup():  # a warm-up rollout's KL is 0 by construction: it says nothing of beta
            self.log_dict(self.update_kl_controller(stats), batch_size=len(rollout))  # the same on every rank
        self.rollouts_done += 1
        return {"rollout": rollout}  # the callbacks' ``outputs`` (lrlhf.callbacks.HighRewardAudit reads it)

    def in_value_warmup(self) -> bool:
        """True while the critic trains alone (``module.critic.warmup_rollouts``, the first N rollouts)."""
        return self.critic is not None and self.rollouts_done < self.critic.warmup_rollouts

    def rollout_stats(self, rollout: Rollout) -> dict[str, float]:
        """Per-rollout statistics (:meth:`lrlhf.modules.rollout.Rollout.stats`), an off-policy correction's
        ``offpolicy/*`` and an overlong rule's ``rollout/policy_token_frac``."""
        stats = rollout.stats(self.kl_controller.value, with_values=self.critic is not None)
        if self.off_policy is not None:  # how far the sampler is from the trainer, and what the correction did
            stats.update(self.off_policy.stats(rollout.logprobs, rollout.sampler_logprobs, rollout.action_mask))
        if type(self.overlong) is not Overlong:  # the share of tokens the policy loss learns from
            stats["rollout/policy_token_frac"] = float(rollout.policy_mask.sum() / rollout.action_mask.sum().clamp(1))
        return stats


__all__ = ["PPOConfig", "PPOModule", "RewardAdapter", "RewardEnsemble", "Rollout", "Sampled",
           "check_finite"]
