"""More input formats, registered in :mod:`lrlhf.data.formats`' registry on import (it imports this module):

- ``preference``: ``chosen_rejected_messages`` ``{chosen_messages: [...], rejected_messages: [...]}``
  (LLaMA-Factory v1's DPO/RM files; contents may be typed parts, ``loss_weight`` is not needed: the continuation is
  the last assistant turn, by the shared-prefix rule).
- ``kto``: ``kto_messages`` ``{messages, label: bool}`` (LLaMA-Factory's KTO files: the last assistant turn is the
  labelled answer) and ``kto`` ``{prompt, completion, label: bool}`` (TRL's unpaired format), read into
  :class:`~lrlhf.data.records.UnpairedExample` for an unpaired loss. An SFT reader refuses such a row by name.
- ``prompt``: every preference format: a pair's prompt (HH-RLHF pairs serve as RL prompts).
"""

from __future__ import annotations

from lrlhf.data.conversations import (
    check_continuation,
    check_prompt,
    conversation,
    last_assistant,
    split_shared_prompt,
)
from lrlhf.data.formats import FORMATS, LABEL_KEYS, Format, _Ctx, _pair, _register
from lrlhf.data.records import PromptExample, UnpairedExample


@_register("preference", "chosen_rejected_messages", ("chosen_messages", "rejected_messages"), LABEL_KEYS)
def read_chosen_rejected_messages(row, ctx):
    chosen = conversation(ctx.get(row, "chosen_messages", list, "a list of messages"), ctx, "chosen_messages",
                          "assistant")
    rejected = conversation(ctx.get(row, "rejected_messages", list, "a list of messages"), ctx,
                            "rejected_messages", "assistant")
    return _pair(*split_shared_prompt(chosen, rejected, ctx), row, ctx)


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


def _prompt_from_pair(pair_format: Format):
    def read(row, ctx):
        pair = pair_format.read(row, _Ctx(ctx.where, pair_format, ctx.source))
        return PromptExample(prompt=pair.prompt, source=pair.source, meta=pair.meta)

    return read


for _pair_format in list(FORMATS["preference"].values()):
    _register("prompt", _pair_format.name, _pair_format.required, _pair_format.optional, _pair_format.detect)(
        _prompt_from_pair(_pair_format))
