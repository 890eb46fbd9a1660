"""The one adapter from a built reward source to a scorer of texts: how best-of-N, ``recipe=eval``, the judges and
the audits score a (prompt, response) pair exactly as PPO scores a sample of its rollout (the prompt as the policy
sees it, the response's tokens then an EOS, the prompt's record beside it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from lrlhf.data.collate import collate_prompts, collate_responses
from lrlhf.data.records import PromptExample
from lrlhf.data.tokenize import encode_prompt
from lrlhf.functional import response_masks
from lrlhf.models.generation import as_prompt

#: ``(prompts, responses) -> scores``: one float per (prompt, response), in order.
Scorer = Callable[[Sequence[PromptExample], Sequence[str]], list[float]]


def _device(reward) -> torch.device:
    """Where the source's module lives (a reward model's), else the CPU (a program)."""
    module = getattr(reward, "scorer", None)
    parameter = next(module.parameters(), None) if isinstance(module, torch.nn.Module) else None
    return parameter.device if parameter is not None else torch.device("cpu")


def text_scorer(reward, tokenizer, max_length: int = 1024, batch_size: int = 64) -> Scorer:
    """A scorer of texts, ``(prompt records, response texts) -> scores``, from a built reward source (the protocol
    of :mod:`lrlhf.rewards.protocol`: ``score(query_ids,
    query_mask, response_ids, masks, meta) -> RewardScores``; rules, a mixture, a judge, a reward model): each pair
    is scored as PPO scores a sample, the prompt as the policy sees it (generation prompt, left truncation), the
    response's tokens then an EOS, the prompt record's ``meta`` beside it (a rule may read its reference). The raw
    scores (before any calibration)."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos_id = tokenizer.eos_token_id

    @torch.no_grad()
    def score(prompts: Sequence[PromptExample], responses: Sequence[str]) -> list[float]:
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts and {len(responses)} responses; need one each")
        device = _device(reward)
        scores: list[float] = []
        for start in range(0, len(prompts), batch_size):
            records = [as_prompt(p) for p in prompts[start:start + batch_size]]
            encoded = [encode_prompt(tokenizer, p, max_length=max_length, truncation="left", special_text="keep")
                       for p in records]
            queries = collate_prompts(encoded, pad_id)  # (b, P), left-padded
            response_ids = collate_responses(tokenizer, responses[start:start + batch_size], eos_id, pad_id)
            response_ids = response_ids.to(device)
            masks = response_masks(response_ids, eos_id, pad_id)
            out = reward.score(queries["input_ids"].to(device), queries["attention_mask"].to(device), response_ids,
                               masks, meta=[p.meta for p in records])
            scores += out.scores.float().cpu().tolist()
        return scores

    return score


def reward_model_scorer(reward_model, tokenizer, max_length: int = 1024, batch_size: int = 64):
    """:func:`text_scorer` of a frozen reward model (a :class:`~lrlhf.models.ScalarModel`, an ensemble, or the folder
    of ``RewardModule.export``): its raw scores."""
    from lrlhf.rewards.protocol import FrozenRewardModel

    source = FrozenRewardModel(reward_model)
    source.build(None, tokenizer)
    return text_scorer(source, tokenizer, max_length, batch_size)


__all__ = ["Scorer", "reward_model_scorer", "text_scorer"]
