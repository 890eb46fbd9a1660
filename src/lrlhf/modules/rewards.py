"""Rewards computed by a program from the texts: PPO's reward role as a function of the prompt's and the response's
text (a verifier, a rule), chosen by ``_target_`` like every other role (``module.reward_model``).

``reward=gold`` is the toy world's verifier (:func:`lrlhf.data.toy.verifiable_reward`: the gold utility itself), the
exact reward under which PPO's optimiser is measured alone (bench/RESULTS.md, #31). Any ``fn(prompt, response) ->
float`` works: ``module.reward_model={_target_: lrlhf.modules.FunctionReward, fn: {_target_:
hydra.utils.get_method, path: my_pkg.my_reward}}``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lrlhf.functional import ResponseMasks
from lrlhf.utils.errors import InvariantError


@dataclass
class FunctionReward:
    """``fn(prompt_text, response_text) -> float`` as PPO's reward: the prompt decoded from its attended ids, the
    response from its valid actions (cut at the stop, EOS dropped), both without special tokens.

    The reward protocol PPO calls: :meth:`build` once with the module (it reads the tokenizer), then
    ``reward(query_ids, query_mask, response_ids, masks) -> (B,) scores``.
    """

    fn: Callable[[str, str], float]
    """The reward of one (prompt, response) pair of texts."""
    name: str = "function"
    """What summaries and errors call it."""
    tokenizer: object = field(default=None, init=False, repr=False)

    def build(self, module) -> None:
        """Take what decoding needs from the module (its tokenizer)."""
        self.tokenizer = module.tokenizer

    def texts(self, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor,
              masks: ResponseMasks) -> tuple[list[str], list[str]]:
        """The decoded prompts and responses of a batch (see the class docstring)."""
        decode = self.tokenizer.batch_decode
        prompts = decode([q[m.bool()].tolist() for q, m in zip(query_ids, query_mask, strict=True)],
                         skip_special_tokens=True)
        responses = decode([r[a.bool()].tolist() for r, a in zip(response_ids, masks.action_mask, strict=True)],
                           skip_special_tokens=True)
        return prompts, [r.strip() for r in responses]

    @torch.no_grad()
    def __call__(self, query_ids: Tensor, query_mask: Tensor, response_ids: Tensor, masks: ResponseMasks) -> Tensor:
        if self.tokenizer is None:
            raise RuntimeError(f"reward {self.name!r}: call build(module) before scoring")
        prompts, responses = self.texts(query_ids, query_mask, response_ids, masks)
        scores = [float(self.fn(p, r)) for p, r in zip(prompts, responses, strict=True)]
        for prompt, response, score in zip(prompts, responses, scores, strict=True):
            if not math.isfinite(score):
                raise InvariantError(f"reward {self.name!r} returned {score} for the response {response[:80]!r} "
                                     f"to the prompt {prompt[-80:]!r}: a reward must be finite")
        return torch.tensor(scores, dtype=torch.float32, device=query_ids.device)


__all__ = ["FunctionReward"]
