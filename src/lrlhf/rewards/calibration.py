"""The reward scale PPO sees, measured where PPO samples: on the reference policy's own responses to the run's
prompts (a calibration fitted on preference completions gave 3.77 on SmolLM2's first rollout, where the
raw score was -0.62, so the KL penalty and the clipping saw a scale that fitted nothing).

``module.calibration`` of the PPO recipes is either a saved :class:`~lrlhf.models.reward.RewardCalibration`
(``${deps.rm}/model``: measured by the RM stage on held-out preference completions, the toy world's default) or a
:class:`ReferenceSamples` that PPO measures once before its first update. The measured calibration is frozen for
the run, saved in its checkpoints (a resume keeps it) and reported in summary.json.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from lrlhf.functional import ResponseMasks
from lrlhf.functional.masks import response_masks
from lrlhf.models import reference_mode
from lrlhf.models.reward import RewardCalibration


class ReferenceBatch(NamedTuple):
    """One reference response per prompt, as a reward source scores them: ``query_ids``, ``query_mask`` ``(B, P)``
    (left-padded), ``response_ids`` ``(B, R)``, their ``masks``, and each prompt record's ``meta`` (``B`` dicts)."""

    query_ids: Tensor
    query_mask: Tensor
    response_ids: Tensor
    masks: ResponseMasks
    meta: Sequence[Mapping] | None = None


@dataclass
class ReferenceSamples:
    """Measure ``(mean, std)`` of the raw RM scores of one response per prompt, sampled from the reference (every
    adapter off: the policy's start, unless ``module.init_adapter`` continues a saved policy) for the first
    ``n_prompts`` training prompts, with ``seed`` (the run's RNG is left untouched, so the rollouts are those of a
    run without it)."""

    n_prompts: int = 64
    seed: int = 0

    def __post_init__(self):
        if self.n_prompts < 2:
            raise ValueError(f"module.calibration.n_prompts must be >= 2 (a standard deviation), got {self.n_prompts}")

    @torch.no_grad()
    def reference_batch(self, module, datamodule) -> ReferenceBatch:
        """One response per prompt of the first ``n_prompts`` training prompts, sampled from the reference with
        ``seed`` (the run's RNG untouched)."""
        items = datamodule.datasets["train"][:self.n_prompts]
        batch = datamodule.collate(items)
        device = module.device
        query_ids, query_mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(self.seed)
            with reference_mode(module.model):  # the reference, also when the policy starts from a saved adapter
                response_ids = module.sample(query_ids, query_mask).response_ids
        masks = response_masks(response_ids, module.eos_token_ids, module.pad_token_id)
        return ReferenceBatch(query_ids, query_mask, response_ids, masks, batch["meta"])

    @torch.no_grad()
    def measure(self, module, datamodule) -> RewardCalibration:
        chunks = reference_chunks(self.reference_batch(module, datamodule), module.config.forward_batch_size)
        scores = torch.cat([module.reward_scores(*chunk[:4], meta=chunk.meta).scores for chunk in chunks]).double()
        std = scores.std().item()
        if not std > 0:
            raise ValueError(f"module.calibration: the reward (module.reward_model) gave every one of {len(scores)} "
                             f"reference responses the score {scores[0].item():.4g}; a constant reward has no scale "
                             "to measure (a rule the reference always passes or always fails: set "
                             "module.calibration=null, or mix it with reward=mixture)")
        return RewardCalibration(mean=scores.mean().item(), std=std, count=len(scores),
                                 reference=f"the reference policy's samples on {len(scores)} RL prompts")


def reference_chunks(batch: ReferenceBatch, size: int):
    """The :class:`ReferenceBatch` of :meth:`ReferenceSamples.reference_batch` in chunks of ``size`` rows (a scoring
    forward's batch)."""
    query_ids, query_mask, response_ids, masks, meta = batch
    for start in range(0, query_ids.shape[0], size):
        rows = slice(start, start + size)
        yield ReferenceBatch(query_ids[rows], query_mask[rows], response_ids[rows],
                             type(masks)(*(m[rows] for m in masks)), None if meta is None else meta[rows])


__all__ = ["ReferenceBatch", "ReferenceSamples", "reference_chunks"]
