"""Held-out sampling: the one path by which the early-stopping callback and ``recipe=eval`` measure a policy.

:func:`sample_held_out` samples ``n`` responses per prompt (adjacent rows) from a fixed seed in a forked RNG (the
caller's random stream is untouched) and measures, on the same samples:

- ``lengths``: the actions, up to and including the first EOS (``response_masks``);
- ``proxy``: the reward model's score of prompt + response cut at the stop (a program's may read the prompt
  record's ``meta``: a reference answer), calibrated when a calibration is given (no penalty, no clip);
- ``kl``: the per-sequence sum of k1 (``log pi - log pi_ref``) over the actions; 0 without a reference.

A policy is anything with the hooks of :class:`HeldOutPolicy`: :class:`ModelPolicy` wraps plain models (a causal
LM, its reference and a reward model; ``recipe=eval``), :class:`ModuleHooks` a PPO LightningModule through its own
hooks (sampling config, adapters, reward; the early-stopping callback).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

from lrlhf.data.collate import collate_prompts
from lrlhf.data.records import PromptExample
from lrlhf.data.tokenize import encode_prompt
from lrlhf.functional import ResponseMasks, kl_k1, masked_sum, response_masks, token_logprobs
from lrlhf.models.generation import SamplingConfig, cut_at_eos, eos_token_ids


class HeldOutPolicy(Protocol):
    """What :func:`sample_held_out` needs of a policy. Shapes: ``q``, ``qm`` ``(B, P)`` left-padded prompt ids and
    attention mask; ``r`` ``(B, R)`` sampled response ids."""

    tokenizer: Any
    pad_token_id: int
    eos_token_ids: list[int]
    device: torch.device
    calibration: Any
    """Something with ``normalise(raw_scores)``, or None (raw scores)."""

    def generate(self, q: Tensor, qm: Tensor) -> Tensor:
        """``(B, R)`` sampled response ids."""

    def logprobs_and_reference(self, q: Tensor, qm: Tensor, r: Tensor) -> tuple[Tensor, Tensor] | None:
        """``(B, R)`` log-probs of the response tokens under the policy and under the reference, in that order;
        None without a reference (the KL is then 0)."""

    def score(self, q: Tensor, qm: Tensor, r: Tensor, masks: ResponseMasks,
              meta: Sequence[Mapping] | None = None) -> Tensor | None:
        """``(B,)`` raw proxy scores (before calibration); None without a reward (``proxy`` is then NaN). ``meta``:
        each row's prompt record's ``meta``."""


class HeldOutSamples(NamedTuple):
    """``N = prompts x n`` sampled responses (sample ``i`` of prompt ``p`` is row ``p * n + i``) and their figures.

    Fields:
        records: ``N`` prompt records, each prompt repeated ``n`` times.
        texts: ``N`` decoded responses, cut at the first EOS, special tokens skipped.
        ids: ``N`` response token-id lists (the actions: up to and including the first EOS).
        lengths: ``(N,)`` long, actions per response.
        proxy: ``(N,)`` float32, the calibrated proxy score (NaN for a policy without a reward).
        kl: ``(N,)`` float32, the per-sequence sum of k1 against the reference (0 without one).
    """

    records: list[PromptExample]
    texts: list[str]
    ids: list[list[int]]
    lengths: Tensor
    proxy: Tensor
    kl: Tensor


@torch.no_grad()
def sample_held_out(policy: HeldOutPolicy, prompts: list[PromptExample], n: int, seed: int, batch_size: int,
                    max_prompt_length: int = 1024, label: str | None = None) -> HeldOutSamples:
    """Sample and measure ``n`` responses per prompt (see the module docstring), ``batch_size`` rows per
    generation batch, prompts cut from the left to ``max_prompt_length`` tokens; deterministic for a given seed
    and batch size. A prompt holding a special token's text is refused (``special_text="error"``).

    ``label``: a progress bar ``eval: <label> <samples done>/<total> | ETA ...`` on stdout over the batches, when
    there is more than one (a best-of-N pool of 4,096 samples of SmolLM2 took ~30 minutes on a CPU, silent before);
    None (the early-stopping callback's evaluations, under the run's own bar): none."""
    records = [p for p in prompts for _ in range(n)]
    encoded = [encode_prompt(policy.tokenizer, p, max_length=max_prompt_length, truncation="left",
                             special_text="error") for p in records]
    device = policy.device
    eos_ids = set(policy.eos_token_ids)
    texts: list[str] = []
    ids: list[list[int]] = []
    kls, proxies, lengths = [], [], []
    bar = _progress(label, len(encoded), batch_size)
    with bar, torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for start in range(0, len(encoded), batch_size):
            batch = collate_prompts(encoded[start:start + batch_size], policy.pad_token_id)
            q, qm = batch["input_ids"].to(device), batch["attention_mask"].to(device)  # (B, P), left-padded
            r = policy.generate(q, qm)  # (B, R)
            masks = response_masks(r, policy.eos_token_ids, policy.pad_token_id)
            both = policy.logprobs_and_reference(q, qm, r)
            if both is None:
                kls.append(torch.zeros(r.shape[0]))
            else:
                kls.append(masked_sum(kl_k1(*both), masks.action_mask, dim=1).float().cpu())
            raw = policy.score(q, qm, r, masks, meta=[p.meta for p in records[start:start + batch_size]])
            calibration = policy.calibration
            if raw is None:  # a policy without a reward (an SFT model): NaN
                proxies.append(torch.full((r.shape[0],), float("nan")))
            else:
                proxies.append((calibration.normalise(raw) if calibration is not None else raw).float().cpu())
            lengths.append(masks.lengths.cpu())
            rows = r.tolist()
            ids += [row[:k] for row, k in zip(rows, masks.lengths.tolist(), strict=True)]
            texts += [policy.tokenizer.decode(cut_at_eos(row, eos_ids), skip_special_tokens=True) for row in rows]
            bar.update(len(rows))
    return HeldOutSamples(records, texts, ids, torch.cat(lengths), torch.cat(proxies), torch.cat(kls))


def _progress(label: str | None, total: int, batch_size: int):
    """The bar of :func:`sample_held_out` (disabled without a label or with one batch); redrawn at most every 30 s
    when stdout is not a terminal (a log file gets a line per redraw, not per batch)."""
    from tqdm import tqdm

    from lrlhf.utils.console import stdout_is_terminal

    return tqdm(total=total, desc=f"eval: {label}", unit="sample", file=sys.stdout, dynamic_ncols=True,
                disable=label is None or total <= batch_size, mininterval=1.0 if stdout_is_terminal() else 30.0,
                bar_format="{desc} {n_fmt}/{total_fmt} |{bar:20}| ETA {remaining} [{elapsed}, {rate_fmt}]")


def response_logprobs(model, q: Tensor, qm: Tensor, r: Tensor, temperature: float) -> Tensor:
    """``(B, R)`` log-probs of the response tokens (positions counted over attended tokens, as in PPO)."""
    ids = torch.cat([q, r], 1)
    mask = torch.cat([qm, torch.ones_like(r, dtype=qm.dtype)], 1)
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    return token_logprobs(logits[:, q.shape[1] - 1:-1], r, temperature)


class ModelPolicy:
    """Plain models as a :class:`HeldOutPolicy`: a causal LM sampled with ``sampling`` (plain temperature
    sampling), an optional reference for the KL, and the proxy: a reward model with ``score(input_ids,
    attention_mask)``, or ``reward``, a built reward source (the protocol of :mod:`lrlhf.rewards.protocol`: rules, a
    mixture, a judge; it sees each row's prompt record ``meta``) in its place. Call it with every model in eval mode
    (no dropout: the forwards then draw no random numbers)."""

    def __init__(self, model, tokenizer, reward_model, sampling: SamplingConfig, reference=None, calibration=None,
                 reward=None):
        if reward is not None and reward_model is not None:
            raise ValueError("ModelPolicy: give a reward model or a reward source as the proxy, not both")
        if reward_model is not None:  # one place computes a reward model's score: its reward source
            from lrlhf.rewards import FrozenRewardModel

            reward = FrozenRewardModel(reward_model)
            reward.build(None, tokenizer)
        self.model, self.tokenizer, self.reward_model, self.reward = model, tokenizer, reward_model, reward
        self.sampling, self.reference, self.calibration = sampling, reference, calibration
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_token_ids = sorted(eos_token_ids(model, tokenizer))
        self.device = getattr(model, "device", torch.device("cpu"))

    def generate(self, q: Tensor, qm: Tensor) -> Tensor:
        out = self.model.generate(input_ids=q, attention_mask=qm, pad_token_id=self.pad_token_id,
                                  eos_token_id=self.eos_token_ids, repetition_penalty=1.0,
                                  **self.sampling.generate_kwargs())
        return out[:, q.shape[1]:]

    def logprobs_and_reference(self, q: Tensor, qm: Tensor, r: Tensor) -> tuple[Tensor, Tensor] | None:
        if self.reference is None:
            return None
        temperature = self.sampling.temperature
        return (response_logprobs(self.model, q, qm, r, temperature),
                response_logprobs(self.reference, q, qm, r, temperature))

    def score(self, q: Tensor, qm: Tensor, r: Tensor, masks: ResponseMasks, meta=None) -> Tensor | None:
        if self.reward is None:
            return None
        return self.reward.score(q, qm, r, masks, meta=meta).scores


class AdaptersOff:
    """A peft model called with every adapter disabled: the reference of a LoRA policy, as a model
    :class:`ModelPolicy` can call."""

    def __init__(self, model):
        self.model = model

    def __call__(self, **inputs):
        from lrlhf.models import reference_mode

        with reference_mode(self.model):
            return self.model(**inputs)


class ModuleHooks:
    """A PPO LightningModule as a :class:`HeldOutPolicy`, through its hooks: ``generate`` (the ids of its one
    sampling hook, ``sample``), ``policy_forward``, ``reference_logprobs``, ``score``, and its ``calibration``,
    ``tokenizer``, ``pad_token_id``, ``eos_token_ids``, ``device``."""

    def __init__(self, module):
        self.module = module
        self.tokenizer, self.pad_token_id = module.tokenizer, module.pad_token_id
        self.eos_token_ids, self.device = module.eos_token_ids, module.device
        measure = getattr(module, "reward_calibration", None)  # PPOModule: measured at its first use
        self.calibration = measure() if measure is not None else getattr(module, "calibration", None)

    def generate(self, q: Tensor, qm: Tensor) -> Tensor:
        return self.module.generate(q, qm)  # PPOModule.generate: the response ids of its one sampling hook

    def logprobs_and_reference(self, q: Tensor, qm: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
        logprobs, _ = self.module.policy_forward(q, qm, r)
        return logprobs, self.module.reference_logprobs(q, qm, r)

    def reward(self, q: Tensor, qm: Tensor, r: Tensor, masks: ResponseMasks,
               meta=None) -> tuple[Tensor, Tensor | None]:
        """``(scores, disagreement)``: ``PPOModule.reward_scores`` given the records (an ensemble's per-sample
        disagreement with it), or a module's plain ``score`` (disagreement None)."""
        reward_scores = getattr(self.module, "reward_scores", None)
        if reward_scores is None:
            return self.module.score(q, qm, r, masks), None
        scored = reward_scores(q, qm, r, masks, meta)
        return scored.scores, scored.disagreement

    def score(self, q: Tensor, qm: Tensor, r: Tensor, masks: ResponseMasks, meta=None) -> Tensor:
        return self.reward(q, qm, r, masks, meta)[0]


class ImplicitRewardPolicy(ModelPolicy):
    """A DPO policy (a LoRA adapter on its reference) as a :class:`HeldOutPolicy`: the reference is the same model
    with its adapters off, and the reward is DPO's implicit one, ``beta * sum(log pi - log pi_ref)`` over the
    actions, at temperature 1 as DPO's loss computes it."""

    def __init__(self, model, tokenizer, sampling: SamplingConfig, beta: float):
        super().__init__(model, tokenizer, None, sampling, reference=AdaptersOff(model))
        self.beta = beta
        self._last: tuple[Tensor, tuple[Tensor, Tensor]] | None = None  # (r, its log-probs at temperature 1)

    def logprobs_and_reference(self, q: Tensor, qm: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
        both = super().logprobs_and_reference(q, qm, r)
        self._last = (r, both) if self.sampling.temperature == 1.0 else None
        return both

    def score(self, q: Tensor, qm: Tensor, r: Tensor, masks: ResponseMasks, meta=None) -> Tensor:
        if self._last is not None and self._last[0] is r:  # the KL's forwards were at temperature 1: reuse them
            logprobs, reference = self._last[1]
        else:
            logprobs = response_logprobs(self.model, q, qm, r, 1.0)
            reference = response_logprobs(self.reference, q, qm, r, 1.0)
        return self.beta * masked_sum(logprobs - reference, masks.action_mask, dim=1)

