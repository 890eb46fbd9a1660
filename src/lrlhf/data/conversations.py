"""Conversation building blocks for the format readers (:mod:`lrlhf.data.formats`).

Turning a field into messages (plain ``{role, content}`` lists, ShareGPT turns, HH-RLHF transcripts), the role
checks every reader applies (a prompt ends with a user turn, a continuation starts with an assistant turn,
``system`` only first) and the shared-prefix rule. Each takes the reader's context, whose ``error`` builds a
:class:`~lrlhf.data.format_errors.DataFormatError` naming the record, so every message names where it happened.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from lrlhf.data.format_errors import DataFormatError
from lrlhf.data.records import ROLES, Conversation
from lrlhf.data.summary import NO_SHARED_PREFIX


class ErrorContext(Protocol):
    def error(self, message: str) -> DataFormatError:
        """An error for the current record: ``<where>: <message>`` and the formats accepted."""
        ...


SHAREGPT_ROLES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system",
    # LLaMA-Factory's tool use: the model's call is an assistant turn, the tool's answer a ``tool`` turn
    "function_call": "assistant", "observation": "tool",
}
HH_MARKER = re.compile(r"\n\n(Human|Assistant):")
HH_ROLES = {"Human": "user", "Assistant": "assistant"}


class SkipRecord(Exception):
    """Raised by a reader for a record that is dropped and counted under ``reason``, not an error."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def content_text(content: Any, ctx: ErrorContext, where: str) -> str:
    """A message's content as text: a string, or a list of typed parts (``{"type": "text", "value"|"text": ...}``,
    LLaMA-Factory v1 and OpenAI style) whose text parts are joined; any other part type is refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ctx.error(f"{where} must be a string or a list of {{type, value}} parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            raise ctx.error(f"{where}[{j}].type is {kind!r}; only text parts are read (multimodal parts such as "
                            "image_url are not supported)")
        text = part.get("value", part.get("text"))
        if not isinstance(text, str):
            raise ctx.error(f"{where}[{j}] must hold its text as a string under 'value' (or 'text')")
        texts.append(text)
    return "".join(texts)


def conversation(value: Any, ctx: ErrorContext, field: str, string_role: str) -> Conversation:
    """A string (one ``string_role`` message) or a list of ``{role, content}`` dicts, as a conversation; a content
    may be a list of typed text parts (:func:`content_text`)."""
    if isinstance(value, str):
        return [{"role": string_role, "content": value}]
    if not isinstance(value, list):
        raise ctx.error(f"field {field!r} must be a string or a list of {{role, content}} messages")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str | list):
            raise ctx.error(f"{field}[{i}] must be a {{role, content}} message with string content")
        if message.get("role") not in ROLES:
            allowed = ", ".join(ROLES)
            raise ctx.error(f"{field}[{i}].role is {message.get('role')!r}; allowed roles: {allowed}")
        messages.append({"role": message["role"], "content": content_text(message["content"], ctx,
                                                                          f"{field}[{i}].content")})
    check_system_first(messages, ctx, field)
    return messages


def sharegpt_conversation(value: Any, ctx: ErrorContext, field: str) -> Conversation:
    """ShareGPT ``[{from, value}]`` (or one such dict) -> messages, mapping human/gpt to user/assistant."""
    turns = [value] if isinstance(value, dict) else value
    if not isinstance(turns, list):
        raise ctx.error(f"field {field!r} must be a list of {{from, value}} turns")
    messages = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise ctx.error(f"{field}[{i}] must be a {{from, value}} turn with string value")
        role = SHAREGPT_ROLES.get(turn.get("from"))
        if role is None:
            allowed = ", ".join(SHAREGPT_ROLES)
            raise ctx.error(f"{field}[{i}].from is {turn.get('from')!r}; allowed values: {allowed}")
        messages.append({"role": role, "content": turn["value"]})
    check_system_first(messages, ctx, field)
    return messages


def with_system(system: str | None, messages: Conversation) -> Conversation:
    return ([{"role": "system", "content": system}] if system else []) + messages


def check_system_first(messages: Conversation, ctx: ErrorContext, field: str) -> None:
    for i, message in enumerate(messages[1:], start=1):
        if message["role"] == "system":
            raise ctx.error(f"role sequence invalid: {field}[{i}] is a system turn (only first)")


def check_prompt(prompt: Conversation, ctx: ErrorContext, field: str) -> None:
    if not prompt or prompt[-1]["role"] not in ("user", "tool"):
        last = prompt[-1]["role"] if prompt else "nothing"
        raise ctx.error(f"role sequence invalid: {field} must end with a user turn (or a tool's answer), ends with "
                        f"{last}")
    check_system_first(prompt, ctx, field)


def check_continuation(continuation: Conversation, ctx: ErrorContext, field: str) -> None:
    if not continuation or continuation[0]["role"] != "assistant":
        first = continuation[0]["role"] if continuation else "nothing"
        raise ctx.error(f"role sequence invalid: {field} must start with an assistant turn, not {first}")


def last_assistant(messages: Conversation) -> int | None:
    indices = [i for i, message in enumerate(messages) if message["role"] == "assistant"]
    return indices[-1] if indices else None


def split_shared_prompt(chosen: Conversation, rejected: Conversation, ctx: ErrorContext):
    """The shared-prefix rule (:mod:`lrlhf.data.formats`): (prompt, chosen tail, rejected tail) or SkipRecord."""
    cut_chosen, cut_rejected = last_assistant(chosen), last_assistant(rejected)
    if cut_chosen is None or cut_rejected is None:
        raise ctx.error("role sequence invalid: chosen and rejected must each contain an assistant turn")
    if chosen[:cut_chosen] != rejected[:cut_rejected]:
        raise SkipRecord(NO_SHARED_PREFIX)
    return chosen[:cut_chosen], chosen[cut_chosen:], rejected[cut_rejected:]


def hh_transcript(text: str, ctx: ErrorContext, field: str) -> Conversation:
    parts = HH_MARKER.split(text)
    if parts[0].strip() or len(parts) < 3:
        raise ctx.error(f"field {field!r} is not an HH transcript: it must start with '\\n\\nHuman:' "
                        "and alternate '\\n\\nHuman:' / '\\n\\nAssistant:' turns")
    return [{"role": HH_ROLES[parts[i]], "content": parts[i + 1].strip()} for i in range(1, len(parts), 2)]


def strip_prompt(prompt: Conversation, side: Conversation) -> Conversation:
    """A side given as a full conversation starting with the prompt keeps only what follows it."""
    return side[len(prompt):] if len(side) > len(prompt) and side[: len(prompt)] == prompt else side
