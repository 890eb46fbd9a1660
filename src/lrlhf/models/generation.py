"""Generate responses to chat prompts with a recorded sampling config, decoding only the new tokens.

Shared by the SFT module's sample table and by ``lrlhf.eval`` (which sits above ``lrlhf.modules``, so the
helper lives here, below both). Prompts go through the data path's own encoder (:func:`encode_prompt`, chat
template with the generation prompt) and are left-padded (:func:`collate_prompts`), so every row's new tokens
start at the same column.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lrlhf.data.collate import collate_prompts
from lrlhf.data.records import PromptExample, SFTExample
from lrlhf.data.tokenize import encode_prompt, split_last_turn


@dataclass(frozen=True)
class SamplingConfig:
    """How responses are drawn; recorded with every table or figure built from them."""

    max_new_tokens: int = 32
    """The most tokens generated per response."""
    temperature: float = 0.0
    """0 = greedy; > 0 samples from ``softmax(logits / temperature)`` with top-k 0 and top-p 1 (the plain
    distribution, whose log-probs :func:`lrlhf.functional.token_logprobs` reproduces)."""
    seed: int = 0
    """Seed of the sampling RNG (forked: the caller's RNG state is left as it was)."""

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")

    def generate_kwargs(self) -> dict:
        if self.temperature == 0:
            return {"do_sample": False, "max_new_tokens": self.max_new_tokens}
        return {
            "do_sample": True, "temperature": self.temperature, "top_k": 0, "top_p": 1.0,
            "max_new_tokens": self.max_new_tokens,
        }


def as_prompt(example: PromptExample | SFTExample) -> PromptExample:
    """A prompt record; an SFT conversation becomes its messages before the last assistant turn."""
    if isinstance(example, SFTExample):
        prompt, _ = split_last_turn(example.messages)
        return PromptExample(prompt=prompt, source=example.source, meta=dict(example.meta))
    return example


def eos_token_ids(model, tokenizer) -> set[int]:
    """The stop ids: the tokenizer's EOS plus any EOS ids in the model's generation config."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    return {i for i in ids if i is not None}


def cut_at_eos(tokens: Sequence[int], eos_ids: set[int]) -> list[int]:
    """The tokens before the first EOS (the EOS itself dropped); all of them when there is none."""
    out = []
    for token in tokens:
        if token in eos_ids:
            break
        out.append(token)
    return out


@contextlib.contextmanager
def _eval_mode(model):
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def generate_responses(
    model,
    tokenizer,
    prompts: Sequence[PromptExample | SFTExample],
    sampling: SamplingConfig,
    *,
    batch_size: int = 64,
    max_prompt_length: int = 1024,
) -> list[str]:
    """One decoded response per prompt, in order.

    Each row is generated from the exact ids of its prompt (chat template + generation prompt); only the
    generated tokens are decoded, cut at the first EOS (``tokenizer.eos_token_id`` or the model's generation
    EOS ids), special tokens skipped. Runs in eval mode under ``no_grad`` and restores the training mode; the
    sampling RNG is forked from ``sampling.seed`` so the caller's RNG stream is unchanged.
    """
    prompts = [as_prompt(p) for p in prompts]
    encoded = [encode_prompt(tokenizer, p, max_length=max_prompt_length, truncation="left", special_text="error")
               for p in prompts]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos_ids = eos_token_ids(model, tokenizer)
    device = next(model.parameters()).device
    responses: list[str] = []
    devices = [device] if device.type == "cuda" else []
    with _eval_mode(model), torch.random.fork_rng(devices=devices):
        torch.manual_seed(sampling.seed)
        for start in range(0, len(encoded), batch_size):
            batch = collate_prompts(encoded[start:start + batch_size], pad_id)
            input_ids = batch["input_ids"].to(device)  # (B, T), left-padded
            out = model.generate(
                input_ids=input_ids,
                attention_mask=batch["attention_mask"].to(device),
                pad_token_id=pad_id,
                **sampling.generate_kwargs(),
            )  # (B, T + new)
            for row in out[:, input_ids.shape[1]:].tolist():
                responses.append(tokenizer.decode(cut_at_eos(row, eos_ids), skip_special_tokens=True))
    return responses
