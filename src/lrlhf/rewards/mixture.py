"""A reward mixed from several sources (``reward=mixture``): a reward model and rules, or several models,
each normalised by its own scale before the weights apply.

Without normalisation the weights mean nothing: a ``[0, 1]`` rule beside a reward model whose scores spread over
several units is drowned, and a rule on a larger scale than the model teaches format instead of content. So each
source's ``(mean, std)`` is measured once, before the first update, on the reference policy's own responses to the
run's prompts (:class:`~lrlhf.rewards.calibration.ReferenceSamples`, the measurement PPO's own calibration makes), and
the reward is ``sum_i w_i (s_i - mean_i) / std_i``. A source that gives every reference response the same score (a
rule the reference never or always passes) has no scale there: it is centred only (std 1), and said so.

The statistics are frozen for the run, kept in its checkpoints (a resumed run uses the same) and printed. Each
source's raw score is a component of the reward (``reward/<name>`` per rollout), and so are a rule source's own
components (``reward/<name>/<rule>``: each rule's pass rate).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from lrlhf.functional import ResponseMasks
from lrlhf.rewards.calibration import reference_chunks
from lrlhf.rewards.protocol import Meta, RewardScores, RewardSource, reward_source


class Mixture(RewardSource):
    """``sum_i weight_i * (score_i - mean_i) / std_i`` over named sources (see the module docstring).

    Args:
        parts: ``name -> {"source": a reward source (or a reward-model folder), "weight": float}``.
        calibrate: a :class:`~lrlhf.rewards.calibration.ReferenceSamples` (how many reference responses measure each
            source's scale), or None: the raw scores are mixed (the weights then carry the scales).
    """

    def __init__(self, parts: Mapping[str, Mapping], calibrate=None):
        if not parts:
            raise ValueError("module.reward_model.parts must name at least one source")
        self.sources: dict[str, RewardSource] = {}
        self.weights: dict[str, float] = {}
        for name, part in parts.items():
            if "source" not in part:
                raise ValueError(f"module.reward_model.parts.{name} needs a source (and a weight)")
            self.sources[name] = reward_source(part["source"])
            self.weights[name] = float(part.get("weight", 1.0))
        self.calibrate = calibrate
        self.stats: dict[str, tuple[float, float]] | None = None

    @property
    def needs_preparation(self) -> bool:
        """Whether the scales are still to be measured (:meth:`prepare`) before a score: ``recipe=eval``, which has
        no PPO run's reference samples, refuses such a mixture when planning."""
        return self.calibrate is not None and self.stats is None

    # -------------------------------------------------------------------------------- the protocol
    def build(self, model: nn.Module, tokenizer) -> nn.Module | None:
        modules = {name: m for name, s in self.sources.items() if (m := s.build(model, tokenizer)) is not None}
        return nn.ModuleDict(modules) if modules else None

    def parts_scores(self, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor, masks: ResponseMasks,
                     meta: Meta = None) -> dict[str, RewardScores]:
        return {name: s.score(query_ids, query_mask, response_ids, masks, meta=meta)
                for name, s in self.sources.items()}

    @torch.no_grad()
    def score(self, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor, masks: ResponseMasks,
              meta: Meta = None) -> RewardScores:
        if self.calibrate is not None and self.stats is None:
            raise RuntimeError("module.reward_model: the mixture's scales are measured by prepare(module, datamodule) "
                               "before its first score (PPOModule does it)")
        total, components = None, {}
        for name, scored in self.parts_scores(query_ids, query_mask, response_ids, masks, meta).items():
            mean, std = self.stats[name] if self.stats is not None else (0.0, 1.0)
            term = self.weights[name] * (scored.scores.float() - mean) / std
            total = term if total is None else total + term
            components[name] = scored.scores.float()
            components.update({f"{name}/{k}": v for k, v in (scored.components or {}).items()})
        return RewardScores(total, components=components)

    # --------------------------------------------------------------------------- the calibration
    @torch.no_grad()
    def prepare(self, module, datamodule) -> None:
        """Measure each source's ``(mean, std)`` on reference responses, once (a resumed run keeps its own)."""
        if self.calibrate is None or self.stats is not None:
            return
        batch = self.calibrate.reference_batch(module, datamodule)
        chunks: dict[str, list[Tensor]] = {name: [] for name in self.sources}
        for chunk in reference_chunks(batch, module.config.forward_batch_size):
            for name, scored in self.parts_scores(*chunk).items():  # (query_ids, ..., masks, meta)
                chunks[name].append(scored.scores.double())
        self.stats = {}
        for name, values in chunks.items():
            scores = torch.cat(values)
            mean, std = scores.mean().item(), scores.std().item()
            note = ""
            if not std > 0:
                std, note = 1.0, " (every reference response scored the same: centred only)"
            self.stats[name] = (mean, std)
            print(f"reward mixture: {name} on {len(scores)} reference responses: mean {mean:.4f}, std {std:.4f}"
                  f"{note}; weight {self.weights[name]}", flush=True)

    def calibration_state(self) -> dict | None:
        """The measured scales, for the checkpoint."""
        return {name: list(v) for name, v in self.stats.items()} if self.stats is not None else None

    def load_calibration_state(self, state: dict | None) -> None:
        self.stats = {name: (float(v[0]), float(v[1])) for name, v in state.items()} if state else None

    def settings(self) -> dict:
        return {"parts": {n: {"source": type(s).__name__, "weight": self.weights[n]} for n, s in self.sources.items()},
                "calibrate": repr(self.calibrate)}


__all__ = ["Mixture"]
