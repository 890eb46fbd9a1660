"""Unpaired formats (KTO): ``kto_messages`` ``{messages, label: bool}`` (LLaMA-Factory's KTO files: the last
assistant turn is the labelled answer) and ``kto`` ``{prompt, completion, label: bool}`` (TRL's unpaired format), read
into :class:`~lrlhf.data.records.UnpairedExample`."""

from __future__ import annotations

from lrlhf.data.conversations import (
    check_continuation,
    check_prompt,
    conversation,
    last_assistant,
)
from lrlhf.data.formats.registry import _register
from lrlhf.data.records import (
    UnpairedExample,
)


def _label(row, ctx) -> bool:
    return ctx.get(row, "label", bool, "true (desirable) or false (undesirable)")


def _unpaired(prompt, completion, row, ctx) -> UnpairedExample:
    check_prompt(prompt, ctx, "prompt")
    check_continuation(completion, ctx, "completion")
    return UnpairedExample(prompt, completion, _label(row, ctx), ctx.source, ctx.meta(row))


@_register("kto", "kto_messages", ("messages", "label"))
def read_kto_messages(row, ctx):
    messages = conversation(ctx.get(row, "messages", list, "a list of messages"), ctx, "messages", "user")
    cut = last_assistant(messages)
    if cut is None:
        raise ctx.error("role sequence invalid: messages must contain an assistant turn (the labelled answer)")
    return _unpaired(messages[:cut], messages[cut:], row, ctx)


@_register("kto", "kto", ("prompt", "completion", "label"))
def read_kto(row, ctx):
    prompt = conversation(ctx.get(row, "prompt", (str, list), "a string or messages"), ctx, "prompt", "user")
    completion = conversation(ctx.get(row, "completion", (str, list), "a string or messages"), ctx, "completion",
                              "assistant")
    return _unpaired(prompt, completion, row, ctx)

