"""RL prompt formats: ``prompt``, and every SFT and preference format read as its prompt (everything before the
last assistant turn; a pair's prompt: HH-RLHF pairs serve as RL prompts)."""

from __future__ import annotations

from lrlhf.data.conversations import (
    check_prompt,
    conversation,
    last_assistant,
)
from lrlhf.data.formats.registry import FORMATS, Format, _Ctx, _register
from lrlhf.data.records import PromptExample

# --- RL prompts ----------------------------------------------------------------------------------------


@_register("prompt", "prompt", ("prompt",),
           detect=lambda row: not {"completion", "chosen", "rejected", "completions"} & row.keys())
def read_prompt(row, ctx):
    prompt = conversation(ctx.get(row, "prompt", (str, list), "a string or messages"), ctx, "prompt", "user")
    check_prompt(prompt, ctx, "prompt")
    return PromptExample(prompt=prompt, source=ctx.source, meta=ctx.meta(row))


def _prompt_from_sft(sft_format: Format):
    def read(row, ctx):
        example = sft_format.read(row, _Ctx(ctx.where, sft_format, ctx.source))
        prompt = example.messages[: last_assistant(example.messages)]
        check_prompt(prompt, ctx, "the turns before the last assistant turn")
        return PromptExample(prompt=prompt, source=example.source, meta=example.meta)

    return read


def _prompt_from_pair(pair_format: Format):
    def read(row, ctx):
        pair = pair_format.read(row, _Ctx(ctx.where, pair_format, ctx.source))
        return PromptExample(prompt=pair.prompt, source=pair.source, meta=pair.meta)

    return read


def register_prompt_forms() -> None:
    """Register every SFT and preference format as a prompt format too (after those: detection order)."""
    for fmt in list(FORMATS["sft"].values()):
        _register("prompt", fmt.name, fmt.required, fmt.optional, fmt.detect)(
            _prompt_from_sft(fmt))
    for fmt in list(FORMATS["preference"].values()):
        _register("prompt", fmt.name, fmt.required, fmt.optional, fmt.detect)(
            _prompt_from_pair(fmt))
