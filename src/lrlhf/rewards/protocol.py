"""PPO's reward role: one protocol for every source of a response's score, chosen by ``_target_`` like every other
role (``module.reward_model``).

A reward source is any object with two methods (:class:`RewardSource` says them; subclassing it is optional):

- ``build(model, tokenizer) -> nn.Module | None``, called once by :meth:`PPOModule.configure_model` after the
  policy's adapters are on its base (``model``, the peft model that serves policy, reference and value): the source
  loads or attaches what it scores with and returns the frozen module the PPO module holds as ``reward_model`` (its
  weights are the checkpoint's frozen ``reward_model`` part), or None for a program;
- ``score(query_ids, query_mask, response_ids, masks, meta=None) -> RewardScores``: the ``(B,)`` raw scores of
  prompt + response cut at the stop (before any calibration), and the extras the source has: ``disagreement``, an
  ensemble's per-sample std of its members' calibrated scores (None for a single model or a program). ``meta`` is
  each row's prompt record's ``meta`` (the fields of its file beyond the prompt: a GSM8K problem's ``answer``; a
  prompt's k samples share it), passed by every caller that has the records and None where none are at hand; a
  source that ignores it only accepts it (one written before the keyword existed is called without it).

The shipped sources: :class:`FrozenRewardModel` (a reward-model folder, or a :class:`~lrlhf.models.ScalarModel`;
``module.reward_model`` given as a path or a model is read as one), :class:`RewardAdapter` (the RM's ``reward``
adapter on the policy's own base), :class:`RewardEnsemble` (an ensemble folder and its combination rule) and
:class:`FunctionReward` (a program on the decoded texts: ``reward=gold`` is the toy world's verifier,
:func:`lrlhf.data.toy.verifiable_reward`, the exact reward under which PPO's optimiser is measured alone). Any
``fn(prompt, response) -> float`` works: ``module.reward_model={_target_: lrlhf.rewards.protocol.FunctionReward, fn:
{_target_: hydra.utils.get_method, path: my_pkg.my_reward}}``. A program that reads the prompt record's fields (a
reference answer) overrides :meth:`TextReward.score_records` (rules: :meth:`lrlhf.rewards.rules.Rule
.check_record`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor, nn

from lrlhf.functional import ResponseMasks
from lrlhf.models.ensemble import RewardEnsembleModel, load_reward_ensemble
from lrlhf.models.reward import attach_reward_adapter, load_reward_model
from lrlhf.utils.errors import InvariantError

#: what ``score`` is given for ``B`` rows: each row's prompt record's ``meta``, or None where no records are at hand
Meta = Sequence[Mapping] | None


class RewardScores(NamedTuple):
    """What a reward source's ``score`` returns for ``B`` rows.

    Fields:
        scores: ``(B,)`` float32 raw scores (before the run's calibration).
        disagreement: ``(B,)`` float32, an ensemble's per-sample std of its members' calibrated scores; None for a
            single model or a program.
        components: ``name -> (B,)`` the reward's named parts (each rule's pass, each source of a mixture), logged
            per rollout as ``reward/<name>``; None when it has none.
    """

    scores: Tensor
    disagreement: Tensor | None = None
    components: dict[str, Tensor] | None = None


class RewardSource:
    """The reward protocol PPO calls (see the module docstring): :meth:`build` once, then :meth:`score`."""

    def build(self, model: nn.Module, tokenizer) -> nn.Module | None:
        """Load or attach what the source scores with, given the policy's peft model and the tokenizer; the frozen
        module to hold as ``reward_model``, or None."""
        raise NotImplementedError

    def score(self, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor, masks: ResponseMasks,
              meta: Meta = None) -> RewardScores:
        """:class:`RewardScores` of prompts ``(B, P)`` (left-padded) + responses ``(B, R)`` cut at the stop;
        ``meta``: the ``B`` prompt records' ``meta`` (None: not at hand)."""
        raise NotImplementedError


def model_scores(model: nn.Module, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor,
                 masks: ResponseMasks) -> RewardScores:
    """A reward model's :class:`RewardScores`: prompt + response with the attention mask the prompt mask then the
    action mask, so the model reads its score at the EOS, or at the last token of a truncated response. An ensemble
    (:class:`~lrlhf.models.ensemble.RewardEnsembleModel`) gives its members' disagreement with them."""
    input_ids = torch.cat([query_ids, response_ids], dim=1)
    attention_mask = torch.cat([query_mask, masks.action_mask.to(query_mask.dtype)], dim=1)
    if isinstance(model, RewardEnsembleModel):
        scores, spread = model.score_and_disagreement(input_ids, attention_mask)
        return RewardScores(scores.float(), spread.float())
    return RewardScores(model.score(input_ids, attention_mask).float())


class _ModelSource(RewardSource):
    """A source that scores with one frozen module, the one :meth:`build` returned."""

    scorer: nn.Module | None = None

    def score(self, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor, masks: ResponseMasks,
              meta: Meta = None) -> RewardScores:
        if self.scorer is None:
            raise RuntimeError(f"{type(self).__name__}: call build(model, tokenizer) before scoring")
        return model_scores(self.scorer, query_ids, query_mask, response_ids, masks)


class FrozenRewardModel(_ModelSource):
    """A frozen reward model: the folder of :meth:`RewardModule.export` (loaded in :meth:`build`; an ensemble's
    folder loads as its :class:`~lrlhf.models.ensemble.RewardEnsembleModel` with its default rule), or a ready
    :class:`~lrlhf.models.ScalarModel`."""

    def __init__(self, model: str | Path | nn.Module):
        self.scorer = model if isinstance(model, nn.Module) else None
        self.path = None if self.scorer is not None else model

    def build(self, model: nn.Module, tokenizer) -> nn.Module:
        if self.scorer is None:
            self.scorer = load_reward_model(self.path)
        return self.scorer


@dataclass
class RewardAdapter(_ModelSource):
    """The reward role as the ``reward`` adapter of a LoRA :meth:`RewardModule.export` folder (``path``), loaded
    onto the policy's own base (which must be the base the RM was trained on): one copy of the base weights serves
    policy, reference, value and reward; the reward role owns only its head."""

    path: str
    scorer: nn.Module | None = field(default=None, init=False, repr=False, compare=False)

    def build(self, model: nn.Module, tokenizer) -> nn.Module:
        self.scorer = attach_reward_adapter(model, self.path)
        return self.scorer


@dataclass
class RewardEnsemble(_ModelSource):
    """The reward role as a reward-model ensemble (``recipe=rm_ensemble``'s ``model`` folder, ``path``): its members
    each calibrated, combined by ``combine`` (:mod:`lrlhf.functional.ensemble_rules`: ``EnsembleMean``,
    ``MeanMinusStd``, ``WorstCase``; None = the folder's default). Its scores carry the members' disagreement, logged
    per rollout."""

    path: str
    combine: object = None
    scorer: nn.Module | None = field(default=None, init=False, repr=False, compare=False)

    def build(self, model: nn.Module, tokenizer) -> nn.Module:
        self.scorer = load_reward_ensemble(self.path, self.combine)
        return self.scorer


class TextReward(RewardSource):
    """A reward computed from the decoded texts (a program, rules, a judge's prompt): :meth:`build` keeps the
    tokenizer, :meth:`texts` decodes a batch (the prompt from its attended ids, the response from its valid actions,
    cut at the stop, EOS dropped, both without special tokens); subclasses write :meth:`score_texts`, or
    :meth:`score_records` when they read the prompt records' fields too."""

    name: str = "text"
    tokenizer: object = None

    def build(self, model: nn.Module, tokenizer) -> None:
        """Keep the tokenizer (decoding is all a program needs)."""
        self.tokenizer = tokenizer
        return None

    def texts(self, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor,
              masks: ResponseMasks) -> tuple[list[str], list[str]]:
        """The decoded prompts and responses of a batch (see the class docstring)."""
        decode = self.tokenizer.batch_decode
        prompts = decode([q[m.bool()].tolist() for q, m in zip(query_ids, query_mask, strict=True)],
                         skip_special_tokens=True)
        responses = decode([r[a.bool()].tolist() for r, a in zip(response_ids, masks.action_mask, strict=True)],
                           skip_special_tokens=True)
        return prompts, [r.strip() for r in responses]

    def score_texts(self, prompts: list[str], responses: list[str]) -> tuple[list[float], dict[str, list[float]]]:
        """``(scores, components)`` of the decoded pairs."""
        raise NotImplementedError

    def score_records(self, prompts: list[str], responses: list[str],
                      meta: Meta) -> tuple[list[float], dict[str, list[float]]]:
        """``(scores, components)`` of the decoded pairs given their prompt records' ``meta`` (None: not at hand);
        here the texts alone (:meth:`score_texts`). A reward that reads a record's fields overrides this."""
        return self.score_texts(prompts, responses)

    @torch.no_grad()
    def score(self, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor, masks: ResponseMasks,
              meta: Meta = None) -> RewardScores:
        if self.tokenizer is None:
            raise RuntimeError(f"reward {self.name!r}: call build(model, tokenizer) before scoring")
        prompts, responses = self.texts(query_ids, query_mask, response_ids, masks)
        if meta is not None and len(meta) != len(prompts):
            raise ValueError(f"reward {self.name!r}: {len(meta)} prompt records for {len(prompts)} responses")
        scores, components = _text_scores(self, self.score_records(prompts, responses, meta), len(prompts))
        for prompt, response, score in zip(prompts, responses, scores, strict=True):
            if not math.isfinite(score):
                raise InvariantError(f"reward {self.name!r} returned {score} for the response {response[:80]!r} "
                                     f"to the prompt {prompt[-80:]!r}: a reward must be finite")
        device = query_ids.device
        return RewardScores(torch.tensor(scores, dtype=torch.float32, device=device), components={
            name: torch.tensor(values, dtype=torch.float32, device=device) for name, values in components.items()
        } or None)


TEXT_CONTRACT = ("score_texts / score_records return (scores, components): one float per response, and a dict of "
                 "named lists of one float per response ({} for none)")


def _text_scores(reward: TextReward, result, n: int) -> tuple[list[float], dict[str, list[float]]]:
    """``result`` of ``reward.score_records`` for ``n`` responses, checked against :data:`TEXT_CONTRACT`; a
    mismatch names the reward, the contract and what came back."""
    who = f"reward {reward.name!r} ({type(reward).__name__})"
    if not (isinstance(result, tuple) and len(result) == 2):
        shape = f"a {type(result).__name__}" + (f" of {len(result)}" if hasattr(result, "__len__") else "")
        raise TypeError(f"{who} returned {shape} for {n} responses: {TEXT_CONTRACT}")
    scores, components = result
    if isinstance(scores, Tensor):
        scores = scores.tolist()
    if not isinstance(scores, Sequence) or isinstance(scores, str) or len(scores) != n:
        got = f"{len(scores)} scores" if isinstance(scores, Sequence) else f"a {type(scores).__name__}"
        raise ValueError(f"{who} returned {got} for {n} responses: {TEXT_CONTRACT}")
    bad = next((s for s in scores if isinstance(s, bool) or not isinstance(s, (int, float))), None)
    if bad is not None:
        raise TypeError(f"{who} returned the score {bad!r} ({type(bad).__name__}): {TEXT_CONTRACT}")
    if not isinstance(components, Mapping) or any(len(v) != n for v in components.values()):
        raise ValueError(f"{who} returned components {type(components).__name__} not of {n} values each: "
                         f"{TEXT_CONTRACT}")
    return [float(s) for s in scores], dict(components)


SOURCE_CONTRACT = ("a reward source's score(query_ids, query_mask, response_ids, masks, meta) returns RewardScores("
                   "scores=(B,) tensor, disagreement=None or (B,), components=None or name -> (B,)) "
                   "(lrlhf.rewards.protocol)")


def checked_scores(source, result, n: int) -> RewardScores:
    """``result`` of ``source.score`` for ``n`` rows, checked against :data:`SOURCE_CONTRACT` (a bare tensor of
    ``n`` scores is taken as the scores); a mismatch names the source and the contract."""
    who = f"module.reward_model ({type(getattr(source, 'source', source)).__name__})"
    if isinstance(result, Tensor):
        result = RewardScores(result)
    if not isinstance(result, tuple) or not result or not isinstance(result[0], Tensor):
        raise TypeError(f"{who} returned a {type(result).__name__}: {SOURCE_CONTRACT}")
    result = RewardScores(*result)
    if result.scores.shape != (n,):
        raise ValueError(f"{who} returned scores of shape {tuple(result.scores.shape)} for {n} responses: "
                         f"{SOURCE_CONTRACT}")
    return result


@dataclass
class FunctionReward(TextReward):
    """``fn(prompt_text, response_text) -> float`` as PPO's reward, on the texts :meth:`TextReward.texts` decodes;
    no module is built."""

    fn: Callable[[str, str], float]
    """The reward of one (prompt, response) pair of texts."""
    name: str = "function"
    """What summaries and errors call it."""
    tokenizer: object = field(default=None, init=False, repr=False)

    def score_texts(self, prompts, responses):
        return [float(self.fn(p, r)) for p, r in zip(prompts, responses, strict=True)], {}


def _takes_meta(score) -> bool:
    try:
        parameters = inspect.signature(score).parameters.values()
    except (TypeError, ValueError):  # no signature to read: assume the current protocol
        return True
    return any(p.name == "meta" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def reward_source(reward_model) -> RewardSource:
    """``module.reward_model`` as a reward source: a path or a model is a :class:`FrozenRewardModel`; an object
    with ``build`` and ``score`` is one already (its ``score`` takes the ``meta`` keyword, the protocol's)."""
    if isinstance(reward_model, (str, Path, nn.Module)):
        return FrozenRewardModel(reward_model)
    if callable(getattr(reward_model, "build", None)) and callable(getattr(reward_model, "score", None)):
        if not _takes_meta(reward_model.score):
            raise TypeError(f"module.reward_model: {type(reward_model).__name__}.score must take the prompts' records "
                            "as `meta` (score(query_ids, query_mask, response_ids, masks, meta=None), "
                            "lrlhf.rewards.protocol.RewardSource)")
        return reward_model
    raise TypeError(f"module.reward_model must be a reward-model folder, a ScalarModel or a reward source (build and "
                    f"score, lrlhf.rewards.protocol), got {type(reward_model).__name__}")


__all__ = ["FrozenRewardModel", "FunctionReward", "Meta", "RewardAdapter", "RewardEnsemble", "RewardScores",
           "RewardSource", "TextReward", "checked_scores", "model_scores", "reward_source"]
