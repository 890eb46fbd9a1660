"""Step 7 of :class:`~lrlhf.modules.PPOModule`: the update epochs on a frozen rollout, the base class
:class:`PPOUpdate`.

``ppo_epochs`` passes over the rollout in shuffled minibatches (whole groups for a prefix-shared group estimator),
one optimiser step per minibatch, its gradient accumulated over micro-batches (``module.config.micro_batch_size``).
Each micro-batch's loss is: the policy objective (``module.policy_loss``) with the off-policy correction's weights
(``module.off_policy``) and the KL term when it is in the loss (``module.kl_penalty``), over the rows the overlong
rule keeps (``module.overlong``), normalised by the *whole minibatch's* denominator; minus the entropy bonus; plus the
critic's value loss. The hooks it calls (``policy_loss``, ``value_loss``, ``policy_value_forward``) are the module's.
"""

from __future__ import annotations

import torch

from lrlhf.functional import entropy_from_logits, masked_mean
from lrlhf.modules.rollout import Rollout, row_chunks
from lrlhf.utils.distributed import any_across_ranks


class PPOUpdate:
    """The update epochs (see the module docstring), read from the module's ``config``, ``surrogate``,
    ``kl_penalty``, ``kl_controller``, ``off_policy``, ``critic`` and ``guards``."""

    def update(self, rollout: Rollout) -> dict[str, float]:
        """Step 7: ``ppo_epochs`` x shuffled minibatches, one optimiser step each; returns the mean of each
        statistic."""
        cfg = self.config
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        sums: dict[str, float] = {}
        count, stopped_early, first_deviation = 0, False, None
        groups = self.sharing.groups(self.model, rollout.query_ids.shape[1], rollout.response_ids.shape[1])
        for epoch in range(cfg.ppo_epochs):
            order = self.sharing.minibatch_order(len(rollout), groups, rollout.query_ids.device)  # whole groups
            for start in range(0, len(rollout), cfg.minibatch_size):
                optimizer.zero_grad()
                step = self.minibatch_backward(rollout.select(order[start:start + cfg.minibatch_size]),
                                               first=epoch == 0 and start == 0)
                first_deviation = step.pop("guard/first_ratio_deviation", first_deviation)
                # the epoch early stop: the policy moved too far from the sampling one (every rank stops together)
                if cfg.target_kl is not None and any_across_ranks(step["ppo/approx_kl"] > cfg.target_kl):
                    optimizer.zero_grad()
                    stopped_early = True
                    break
                if cfg.max_grad_norm is not None:
                    self.clip_gradients(optimizer, gradient_clip_val=cfg.max_grad_norm, gradient_clip_algorithm="norm")
                optimizer.step()
                scheduler.step()
                for key, value in step.items():
                    sums[key] = max(sums.get(key, 0.0), value) if key == "ppo/ratio_max" else sums.get(key, 0.0) + value
                count += 1
            if stopped_early:
                break
        out = {k: (v if k == "ppo/ratio_max" else v / count) for k, v in sums.items()} if count else {}
        out["ppo/optimizer_steps"] = float(count)
        out["ppo/stopped_early"] = float(stopped_early)  # target_kl reached (the rest of the update skipped)
        out["ppo/value_warmup"] = float(self.in_value_warmup())
        if first_deviation is not None:
            out["guard/first_ratio_deviation"] = first_deviation  # mean |ratio - 1| before the first step
        return out

    def minibatch_backward(self, mb: Rollout, first: bool) -> dict[str, float]:
        """The gradient of one minibatch's loss, accumulated over micro-batches of ``module.config.micro_batch_size``
        rows; every term normalised over the whole minibatch (the policy loss by its aggregation's denominator, the
        token means by its token count), so the step is the same however it is cut. Returns its statistics."""
        cfg = self.config
        critic_only = self.in_value_warmup()  # the critic's warm-up: the policy does not move
        denominator = self.surrogate.aggregation.denominator(mb.policy_mask)
        tokens = mb.action_mask.sum().clamp(min=1)  # the value loss's token mean
        policy_tokens = mb.policy_mask.sum().clamp(min=1)  # the entropy's and the statistics' (overlong rows out)
        step: dict[str, float] = {}
        for rows in row_chunks(len(mb), cfg.micro_batch_size or cfg.minibatch_size):
            part = mb.select(rows)
            share = part.action_mask.sum() / tokens  # this micro-batch's part of the minibatch's token means
            pshare = part.policy_mask.sum() / policy_tokens
            logprobs, logits, values = self.policy_value_forward(part.query_ids, part.query_mask, part.response_ids)
            if first and rows.start == 0:  # the weights have not moved yet: the ratio must be 1
                deviation = self.guards.first_ratio(logprobs, part.logprobs, part.action_mask, self.compute_precision,
                                                    self.rollouts_done)
                if deviation is not None:
                    step["guard/first_ratio_deviation"] = deviation
            # only the terms in use reach the hook: a subclass's policy_loss(logprobs, old, adv, mask) works as long as
            # micro-batches, the off-policy correction and the KL in the loss are off
            terms = {"denominator": denominator} if len(part) < len(mb) else {}
            if self.off_policy is not None:
                terms["weights"] = self.off_policy(part.logprobs, part.sampler_logprobs, part.action_mask)
            if self.kl_penalty.in_loss:
                kl = self.kl_controller.value * self.kl_penalty.per_token(logprobs, part.ref_logprobs)
                terms["extra"] = kl
                parts = {"ppo/kl_loss": self.surrogate.aggregation.numerator(kl.detach(), part.policy_mask)
                         / denominator}
            else:
                parts = {}
            loss, pstats = self.policy_loss(logprobs, part.logprobs, part.advantages, part.policy_mask, **terms)
            parts.update({"ppo/policy_loss": loss.detach(), "ppo/approx_kl": pstats.approx_kl * pshare,
                          "ppo/clipfrac": pstats.clipfrac * pshare, "ppo/ratio_mean": pstats.ratio_mean * pshare})
            with torch.set_grad_enabled(cfg.entropy_coef > 0 and not critic_only):
                entropy = masked_mean(entropy_from_logits(logits, cfg.temperature), part.policy_mask) * pshare
            parts["ppo/entropy"] = entropy.detach()
            if cfg.entropy_coef > 0 and not critic_only:
                loss = loss - cfg.entropy_coef * entropy
            if critic_only:
                loss = loss.new_zeros(())
            if values is not None:
                vloss, vstats = self.value_loss(values, part.values, part.returns, part.action_mask)
                loss = loss + self.critic.vf_coef * vloss * share
                parts.update({"ppo/value_loss": vloss.detach() * share, "ppo/value_clipfrac": vstats.clipfrac * share,
                              "ppo/value_mean": vstats.value_mean * share})
            self.guards.check_loss(loss, self.rollouts_done, rows.start)
            self.manual_backward(loss)
            for key, value in parts.items():
                step[key] = step.get(key, 0.0) + float(value)
            step["ppo/ratio_max"] = max(step.get("ppo/ratio_max", 0.0), float(pstats.ratio_max))
        return step


__all__ = ["PPOUpdate"]
