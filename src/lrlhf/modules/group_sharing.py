"""Prefix sharing in the group estimators' forwards (RLOO, GRPO: ``k`` samples per prompt).

A rollout of a group estimator repeats each left-padded prompt in ``k`` adjacent rows, and every forward of the
rollout (the reference's and, where the sampler gave none, the old policy's in the no-grad scoring, the policy's
in every update minibatch) encodes that prompt ``k`` times. Shared, a group is one row of ``P + k R`` columns
(:func:`lrlhf.functional.prefix_sharing.group_layout`) under the prefix-sharing mask, instead of ``k`` rows of
``P + R``:
the response log-probs are those of the unshared rows (``tests/modules/test_group_sharing.py``: to 1e-5 on llama,
qwen2, gpt2 and gpt_neox, left padding and early stops included), and the first-update ratio guard checks them
against the sampler's own on every rollout.

``module.config.prefix_sharing``: ``auto`` shares when the prompts are at least
:data:`~lrlhf.data.shared_batches.AUTO_MIN_SHARE` of the columns the unshared rows compute (``(k - 1) P / (k (P + R))``,
measured per rollout); ``true`` always, ``false`` never. Shared update minibatches hold whole groups (the groups are
shuffled, not the rows), so ``module.config.minibatch_size`` must be a multiple of ``k`` for the update to share.
A critic (the values are read on the unshared rows) or a model that cannot take the mask
(:func:`lrlhf.models.shared_inputs.sharing_blocker`) runs unshared.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from lrlhf.data.shared_batches import AUTO_MIN_SHARE
from lrlhf.functional.prefix_sharing import group_layout, group_response_columns
from lrlhf.models.shared_inputs import shared_inputs, sharing_blocker


def group_prompt_share(prompt_len: int, resp_len: int, k: int) -> float:
    """The fraction of the columns ``k`` unshared rows of ``prompt_len + resp_len`` compute that the shared row
    does not: ``(k - 1) P / (k (P + R))``."""
    return (k - 1) * prompt_len / (k * (prompt_len + resp_len)) if k > 1 and prompt_len + resp_len else 0.0


def whole_groups(query_ids: Tensor, query_mask: Tensor, k: int) -> bool:
    """Whether the rows are whole groups of ``k`` adjacent rows with one prompt (ids and mask) each, every prompt
    with a real last column (an empty prompt's last column is padding: no column predicts the first response token
    the same way in both layouts)."""
    rows = query_ids.shape[0]
    if rows == 0 or rows % k:
        return False
    ids, mask = query_ids.reshape(rows // k, k, -1), query_mask.reshape(rows // k, k, -1)
    return bool(query_mask[:, -1].all() & (ids == ids[:, :1]).all() & (mask == mask[:, :1]).all())  # one sync


class GroupSharing:
    """Which forwards of a rollout run shared, and the shared ones: held by :class:`~lrlhf.modules.PPOModule` as
    ``sharing``, built from its settings, given the model at each call.

    Args:
        prefix_sharing: ``module.config.prefix_sharing``: ``"auto"``, True or False.
        samples_per_prompt: ``k``, the estimator's samples per prompt (adjacent rows).
        minibatch_size: rows per update minibatch (``module.config.minibatch_size``).
        has_critic: a critic reads its values on the unshared rows: the forwards then run unshared.

    ``prefix_sharing=True`` that cannot share is refused here, naming the key.
    """

    def __init__(self, prefix_sharing: bool | str, samples_per_prompt: int, minibatch_size: int, has_critic: bool):
        k = samples_per_prompt
        if prefix_sharing is True and (k < 2 or has_critic):
            raise ValueError("module.config.prefix_sharing=true shares the prompt of k samples without a critic "
                             f"(RLOO, GRPO); this run has k = {k} and "
                             f"{'a critic' if has_critic else 'no critic'}: set it to auto or false")
        if prefix_sharing is True and minibatch_size % k:
            raise ValueError(f"module.config.minibatch_size={minibatch_size} must be a multiple of "
                             f"module.advantage.samples_per_prompt={k} with module.config.prefix_sharing=true "
                             "(a shared minibatch holds whole groups)")
        self.prefix_sharing, self.minibatch_size = prefix_sharing, minibatch_size
        #: The rollout's no-grad scoring chunks hold whole groups of this many rows: ``k`` unless sharing is off.
        #: Fixed by the settings, not by a rollout's widths, so every data-parallel rank runs as many chunks (each
        #: chunk's forwards are collectives under FSDP) even where one rank shares and another does not.
        self.scoring_group_size = k if prefix_sharing is not False and not has_critic else 1
        self._warned = False

    def groups(self, model, prompt_len: int, resp_len: int) -> int:
        """``k`` when the forwards of ``model`` on a rollout with ``prompt_len`` prompt and ``resp_len`` response
        columns run shared, else 1."""
        k = self.scoring_group_size
        if k < 2:
            return 1
        if self.prefix_sharing == "auto" and group_prompt_share(prompt_len, resp_len, k) < AUTO_MIN_SHARE:
            return 1
        blocker = sharing_blocker(model, prompt_len + k * resp_len)
        if blocker is not None:
            if not self._warned:
                self._warned = True
                warnings.warn(f"the rollouts' forwards run unshared: {blocker} (module.config.prefix_sharing=false "
                              "says so without this warning)", stacklevel=2)
            return 1
        return k

    def minibatch_order(self, rows: int, groups: int, device) -> Tensor:
        """A shuffled order of a rollout's ``rows``: of whole groups when the rollout shares (``groups > 1``) and
        a minibatch holds whole groups, else of the rows."""
        if groups > 1 and self.minibatch_size % groups == 0:
            starts = torch.randperm(rows // groups, device=device) * groups
            return (starts[:, None] + torch.arange(groups, device=device)).flatten()
        return torch.randperm(rows, device=device)

    def response_logits(self, model, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor) -> Tensor | None:
        """``(B, R, V)`` the logits of ``model`` predicting each response token from the shared forward, or None
        where these rows do not share (the setting, or not whole groups of one prompt): the caller runs the
        unshared one."""
        resp_len = response_ids.shape[1]
        k = self.groups(model, query_ids.shape[1], resp_len)
        if k < 2 or not whole_groups(query_ids, query_mask, k):
            return None
        input_ids, position_ids, segment_ids = group_layout(query_ids, query_mask, response_ids, k)
        inputs = shared_inputs(model, {"input_ids": input_ids, "position_ids": position_ids,
                                       "segment_ids": segment_ids})
        # the LM head on the response-predicting columns alone, in response order (logits_to_keep as indices)
        columns = group_response_columns(query_ids.shape[1], k, resp_len, query_ids.device)
        logits = model(**inputs, logits_to_keep=columns).logits  # (G, k R, V)
        return logits.reshape(-1, resp_len, logits.shape[-1])


__all__ = ["GroupSharing", "group_prompt_share", "whole_groups"]
