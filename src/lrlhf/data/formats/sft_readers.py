"""SFT formats: ``messages``, ``sharegpt``, ``alpaca``, ``self_instruct``, ``prompt_completion``."""

from __future__ import annotations

from typing import Any

from lrlhf.data.conversations import (
    check_continuation,
    check_prompt,
    check_system_first,
    conversation,
    sharegpt_conversation,
    with_system,
)
from lrlhf.data.formats.registry import _Ctx, _register
from lrlhf.data.records import Conversation, SFTExample

# --- SFT -----------------------------------------------------------------------------------------------


def _sft(messages: Conversation, row: dict[str, Any], ctx: _Ctx, field: str) -> SFTExample:
    if not messages or messages[-1]["role"] != "assistant":
        raise ctx.error(f"role sequence invalid: {field} must end with an assistant turn (the target)")
    check_system_first(messages, ctx, field)
    return SFTExample(messages=messages, source=ctx.source, meta=ctx.meta(row))


@_register("sft", "messages", ("messages",))
def read_messages(row, ctx):
    if isinstance(row.get("label"), bool):  # KTO: as SFT its undesirable answers would be imitated
        raise ctx.error("this is a KTO record (a boolean 'label' marks its answer desirable or not): read it as "
                        "kind 'kto'; as SFT data its undesirable answers would become targets")
    raw = ctx.get(row, "messages", list, "a list of messages")
    messages = conversation(raw, ctx, "messages", "user")
    weights = [m.get("loss_weight") if isinstance(m, dict) else None for m in raw]
    if all(w is None for w in weights):
        return _sft(messages, row, ctx, "messages")
    # LLaMA-Factory v1: loss_weight marks the supervised turns; kept per message in meta["loss_weights"], which the
    # encoder honours as the target mask (lrlhf.data.tokenize.encode_sft); turns after the last supervised one go
    if not all(w is None or isinstance(w, int | float) and not isinstance(w, bool) and w >= 0 for w in weights):
        raise ctx.error(f"loss_weight values {weights}: each must be a number >= 0 (0 = not a target)")
    supervised = [i for i, (m, w) in enumerate(zip(messages, weights, strict=True))
                  if m["role"] == "assistant" and w]
    if not supervised:
        raise ctx.error("no assistant turn has loss_weight > 0: nothing to imitate")
    example = _sft(messages[:supervised[-1] + 1], row, ctx, "messages")
    example.meta["loss_weights"] = [float(w or 0) for w in weights[:supervised[-1] + 1]]
    return example


@_register("sft", "sharegpt", ("conversations",), ("system",))
def read_sharegpt(row, ctx):
    turns = sharegpt_conversation(ctx.get(row, "conversations", list, "a list of turns"), ctx,
                                   "conversations")
    system = ctx.get(row, "system", str, "a string", optional=True)
    return _sft(with_system(system, turns), row, ctx, "conversations")


def _alpaca_user_turn(instruction: str, input_text: str | None) -> str:
    return f"{instruction}\n{input_text}" if input_text and input_text.strip() else instruction


@_register("sft", "alpaca", ("instruction", "output"), ("input", "system", "history"))
def read_alpaca(row, ctx):
    instruction = ctx.get(row, "instruction", str, "a string")
    input_text = ctx.get(row, "input", str, "a string", optional=True)
    output = ctx.get(row, "output", str, "a string")
    system = ctx.get(row, "system", str, "a string", optional=True)
    history = ctx.get(row, "history", list, "a list of [instruction, response] pairs", optional=True) or []
    messages = []
    for i, turn in enumerate(history):
        if not (isinstance(turn, list) and len(turn) == 2 and all(isinstance(t, str) for t in turn)):
            raise ctx.error(f"history[{i}] must be an [instruction, response] pair of strings")
        messages += [{"role": "user", "content": turn[0]}, {"role": "assistant", "content": turn[1]}]
    messages += [{"role": "user", "content": _alpaca_user_turn(instruction, input_text)},
                 {"role": "assistant", "content": output}]
    return _sft(with_system(system, messages), row, ctx, "output")


@_register("sft", "self_instruct", ("instruction", "instances"))
def read_self_instruct(row, ctx):
    instruction = ctx.get(row, "instruction", str, "a string")
    instances = ctx.get(row, "instances", list, "a non-empty list of {input, output}")
    first = instances[0] if instances else None
    if not (isinstance(first, dict) and isinstance(first.get("output"), str)
            and isinstance(first.get("input", ""), str)):
        raise ctx.error("field 'instances' must be a non-empty list of {input, output} with string values")
    messages = [{"role": "user", "content": _alpaca_user_turn(instruction, first.get("input"))},
                {"role": "assistant", "content": first["output"]}]
    return _sft(messages, row, ctx, "instances")


@_register("sft", "prompt_completion", ("prompt", "completion"))
def read_prompt_completion(row, ctx):
    prompt = conversation(ctx.get(row, "prompt", (str, list), "a string or messages"), ctx, "prompt", "user")
    completion = conversation(ctx.get(row, "completion", (str, list), "a string or messages"), ctx,
                               "completion", "assistant")
    check_prompt(prompt, ctx, "prompt")
    check_continuation(completion, ctx, "completion")
    return _sft(prompt + completion, row, ctx, "completion")


