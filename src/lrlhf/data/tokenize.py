"""Conversations -> token ids + loss masks, with the tokenizer's own chat template.

One function, :func:`encode_chat`, serves SFT, reward models and PPO; the ``encode_*`` wrappers only say
which part of a record is the prompt and which the completion.

How assistant spans are found (works for any template, no ``{% generation %}`` markers needed): for each
assistant message ``i`` the conversation is rendered up to it with ``add_generation_prompt=True`` (where its
tokens start) and through it (where they end). Both renderings must be text prefixes of the full rendering,
and their tokenisations token prefixes of the full tokenisation; otherwise a :class:`ChatTemplateError` names
the message and the problem. The token-prefix property is also what makes the PPO prompt encoding (prompt +
generation prompt) exactly the first ``prompt_length`` tokens of the RM/SFT encoding of the same prompt.

EOS rule: the target of an assistant turn runs from the end of the generation prompt through the first
``tokenizer.eos_token_id`` the template emits for that turn (ChatML's ``<|im_end|>``); template glue after it
(ChatML's trailing newline) is context, not target. When the template emits no EOS in the turn, one EOS id is
appended right after the turn's tokens and is part of the target. The rule applies to *every* assistant turn,
also those inside a prompt, so prompt encodings stay prefixes of full encodings.

End rule: a completion that ends with an assistant turn ends at that turn's EOS; the template's glue after it
(ChatML's trailing newline) is dropped. A policy's sampled response ends at the EOS too, so a reward model reads
its score (at the last attended token) at the same token in RM training as in PPO, best-of-N and the judges; with
the glue kept it was trained at the newline and read at the EOS (:data:`RENDERING` 2). The glue was never a
target, so SFT and DPO lose nothing by it.

Special-token text rule: a chat template renders messages to text that is then tokenised, so a message whose
*content* contains the text of a special token (``"<|im_end|>"`` in a user turn) would be read as that control
token, and forge turn boundaries. Such an example is dropped and counted in
``stats.dropped["special_token_in_content"]`` (``special_text="drop"``, the default), refused with an error
naming the message (``"error"``), or tokenised as transformers would (``"keep"``).

Truncation rule: a completion is never cut. When prompt + completion is longer than ``max_length``, either
the *prompt* is cut from the left (``truncation="left"``; the example is dropped when the completion alone
leaves no room for at least one prompt token) or the example is dropped (``truncation="drop"``). Every cut is
counted in ``stats.truncated``, every drop in ``stats.dropped["too_long"]``. With ``loss_on="all"`` a cut
through an earlier assistant turn leaves that turn's remainder as context, not target.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from lrlhf.data.records import Conversation, PreferencePair, PromptExample, Ranking, SFTExample

TRUNCATION_POLICIES = ("left", "drop")
LOSS_ON = ("all", "last")
SPECIAL_TEXT_POLICIES = ("drop", "error", "keep")
SPECIAL_TEXT = "special_token_in_content"
TOO_LONG = "too_long"


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot be used to find assistant spans (see the message)."""


@dataclass
class EncodeStats:
    """What encoding did; same field names as the loader's ``DataSummary``, so either can be passed."""

    truncated: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    removed_answers: int = 0  # ranking answers too long to fit, removed from a group that was kept


class Encoded(NamedTuple):
    """One tokenised sequence (no padding).

    input_ids: (T,) long. attention_mask: (T,) long, all ones (padding is added by the collators).
    loss_mask: (T,) bool, True on target tokens: the tokens a causal LM is trained to *predict* (assistant
    content and its EOS), i.e. ``logits[t - 1]`` is scored against ``input_ids[t]`` where ``loss_mask[t]``.
    prompt_length: number of leading tokens that belong to the prompt, generation prompt included (the
    completion starts at this index; equal to T for a prompt-only encoding).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    prompt_length: int


class EncodedPair(NamedTuple):
    """A preference pair; both sides share the same (possibly truncated) prompt tokens.

    ``source`` and ``meta`` are the record's, carried for per-source evaluation (reward-model metrics).
    """

    chosen: Encoded
    rejected: Encoded
    target: float  # P(chosen wins); 0.5 for a tie
    source: str = ""
    meta: dict[str, Any] | None = None


class EncodedRanking(NamedTuple):
    """K completions of one prompt with their ranks (1 is best, equal ranks tie)."""

    completions: list[Encoded]
    ranks: list[int]


class EncodedPrompt(NamedTuple):
    """A prompt for generation: exact ids, generation prompt included, and the record's ``meta``."""

    encoded: Encoded
    prompt: Conversation
    meta: dict[str, Any]


def check_choice(name: str, value: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; allowed values: {', '.join(allowed)}")
    return value


# ----------------------------------------------------------------------------------------------- rendering
_TOOL_PROBE = "lrlhf-tool-probe-7f3a"


def check_tool_role(tokenizer) -> None:
    """Raise :class:`ChatTemplateError` unless the chat template writes a ``tool`` message's content (a template
    without a tool role drops it or fails: the tool's answer would silently vanish from the training text)."""
    cached = getattr(tokenizer, "_lrlhf_tool_role", None)
    if cached is None:
        probe = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "call"},
                 {"role": "tool", "content": _TOOL_PROBE}]
        try:
            cached = _TOOL_PROBE in tokenizer.apply_chat_template(probe, tokenize=False)
        except Exception:  # the template raises on an unknown role
            cached = False
        tokenizer._lrlhf_tool_role = cached
    if not cached:
        name = getattr(tokenizer, "name_or_path", type(tokenizer).__name__)
        raise ChatTemplateError(f"the chat template of {name} has no tool role: a tool's answer (ShareGPT "
                                "'observation', role 'tool') would be dropped from the text; use a model whose "
                                "template supports tools, or leave such records out")


#: what a record's tool schemas are checked with: the template must write a tool's name into the text
_PROBE_TOOL = {"type": "function", "function": {"name": "lrlhf_probe_tool", "description": "probe",
                                                "parameters": {"type": "object", "properties": {}}}}
_RENDERS_TOOLS: dict[tuple[int, str], bool] = {}


def tools_of(meta: dict | None) -> list | None:
    """A record's tool schemas (ShareGPT / LLaMA-Factory ``tools``: a JSON string or a list), or None."""
    tools = (meta or {}).get("tools")
    if tools in (None, "", []):
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as err:
            raise ValueError(f"the record's 'tools' is not JSON ({err}): {tools[:80]!r}") from None
    return [tools] if isinstance(tools, dict) else list(tools)


def renders_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template writes tool schemas given as ``tools`` into the text."""
    key = (id(tokenizer), str(getattr(tokenizer, "chat_template", "")))
    if key not in _RENDERS_TOOLS:
        try:
            text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tools=[_PROBE_TOOL],
                                                 tokenize=False)
        except Exception:  # a template that cannot take tools at all
            text = ""
        _RENDERS_TOOLS[key] = "lrlhf_probe_tool" in str(text)
    return _RENDERS_TOOLS[key]


class _ToolsTokenizer:
    """The tokenizer, its chat template given one record's ``tools`` with every conversation it renders."""

    def __init__(self, tokenizer, tools: list):
        self._tokenizer, self._tools = tokenizer, tools

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def __call__(self, *args, **kwargs):
        return self._tokenizer(*args, **kwargs)

    def apply_chat_template(self, conversation, **kwargs):
        return self._tokenizer.apply_chat_template(conversation, tools=self._tools, **kwargs)


def with_tools(tokenizer, meta: dict | None):
    """``tokenizer`` as a record with tool schemas (``meta["tools"]``) is encoded: the schemas rendered by the chat
    template, in the text the model trains on; a template that cannot render them is an error (they were
    kept aside and never seen)."""
    tools = tools_of(meta)
    if tools is None:
        return tokenizer
    if not renders_tools(tokenizer):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ChatTemplateError(f"the chat template of {name} does not render tool schemas (a record's 'tools'): "
                                "the model would never see the tools it is trained to call; use a model whose "
                                "template takes tools, or leave such records out")
    return _ToolsTokenizer(tokenizer, tools)


def _render(tokenizer, messages: Conversation, add_generation_prompt: bool) -> str:
    if any(m["role"] == "tool" for m in messages):
        check_tool_role(tokenizer)
    text = tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
    )
    if not isinstance(text, str):  # pragma: no cover - defensive: transformers API drift
        raise ChatTemplateError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}")
    return text


def _tokenize(tokenizer, text: str) -> list[int]:
    # The template writes BOS and other specials into the text itself, so no extra special tokens here.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _prefix_length(tokenizer, prefix: str, full_text: str, full_ids: list[int], where: str) -> int:
    """Number of tokens of ``prefix`` after checking it is a text and token prefix of the full rendering."""
    if not full_text.startswith(prefix):
        raise ChatTemplateError(
            f"chat template is not prefix-consistent: rendering the conversation {where} is not a text "
            f"prefix of rendering the whole conversation (does the template rewrite earlier turns, e.g. "
            f"strip reasoning, or render the generation prompt differently from an assistant turn?).\n"
            f"prefix tail: {prefix[-80:]!r}\n"
            f"full text there: {full_text[max(len(prefix) - 80, 0):len(prefix) + 20]!r}"
        )
    ids = _tokenize(tokenizer, prefix)
    if full_ids[: len(ids)] != ids:
        raise ChatTemplateError(
            f"tokenisation is not prefix-consistent {where}: the tokens of the prefix text are not a prefix "
            f"of the tokens of the whole conversation (a token merges across the turn boundary: "
            f"prefix ends {ids[-3:]}, conversation has {full_ids[max(len(ids) - 3, 0):len(ids) + 1]}). "
            f"Change the template so the boundary falls on a token boundary (a newline or special token)."
        )
    return len(ids)


def _assistant_spans(tokenizer, messages: Conversation, full_text: str, full_ids: list[int]):
    """Token spans ``(start, end)`` of every assistant message, as rendered by the template."""
    spans = {}
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = _prefix_length(
            tokenizer, _render(tokenizer, messages[:i], True), full_text, full_ids,
            f"up to message {i} with add_generation_prompt=True",
        )
        end = _prefix_length(
            tokenizer, _render(tokenizer, messages[: i + 1], False), full_text, full_ids,
            f"through assistant message {i}",
        )
        spans[i] = (start, end)
    return spans


# ------------------------------------------------------------------------------------------------ encoding
#: The version of the rendering rules above, part of every stage's cache key (a rule that changes what a stage
#: trains on must not reuse a stage built under the old one). 2: the end rule.
RENDERING = 2


def _encode_untruncated(tokenizer, prompt: Conversation, completion: Conversation | None, loss_on: str,
                        targets: Sequence[bool] | None = None):
    """(ids, loss_mask, prompt_length) before truncation; see the module docstring for the EOS rule. ``targets``
    (one flag per message of prompt + completion) overrides ``loss_on``: which assistant turns are targets."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ChatTemplateError("the tokenizer has no eos_token_id; set tokenizer.eos_token")
    messages = list(prompt) + list(completion or [])
    prompt_only = completion is None
    full_text = _render(tokenizer, messages, add_generation_prompt=prompt_only)
    full_ids = _tokenize(tokenizer, full_text)
    spans = _assistant_spans(tokenizer, messages, full_text, full_ids)

    if prompt_only:
        raw_prompt_length = len(full_ids)
    elif completion and completion[0]["role"] == "assistant":
        raw_prompt_length = spans[len(prompt)][0]
    else:
        raw_prompt_length = _prefix_length(
            tokenizer, _render(tokenizer, prompt, False), full_text, full_ids, "through the prompt"
        )

    # Rebuild ids segment by segment so an EOS can be inserted after a turn whose template emits none.
    ids: list[int] = []
    mask: list[bool] = []
    cursor = 0
    prompt_length = None
    last_end = None  # where the last assistant turn's EOS ends, in ``ids``
    for i, (start, end) in sorted(spans.items()):
        is_target = not prompt_only and (targets[i] if targets is not None else i >= len(prompt) or loss_on == "all")
        ids += full_ids[cursor:start]
        mask += [False] * (start - cursor)
        if prompt_length is None and start >= raw_prompt_length:
            prompt_length = len(ids) - (start - raw_prompt_length)
        turn = full_ids[start:end]
        if eos in turn:
            # The last EOS of the turn is the template's (content could contain the token text itself).
            stop = len(turn) - turn[::-1].index(eos)
            ids += turn
            mask += [is_target] * stop + [False] * (len(turn) - stop)
            last_end = len(ids) - (len(turn) - stop)
        else:
            ids += turn + [eos]
            mask += [is_target] * (len(turn) + 1)
            last_end = len(ids)
        cursor = end
    ids += full_ids[cursor:]
    mask += [False] * (len(full_ids) - cursor)
    if prompt_length is None:  # the completion holds no assistant turn, or there is no completion
        prompt_length = len(ids) - (len(full_ids) - raw_prompt_length)
    if not prompt_only and completion and completion[-1]["role"] == "assistant" and last_end is not None:
        ids, mask = ids[:last_end], mask[:last_end]  # the end rule: the turn's EOS ends the completion
    return ids, mask, prompt_length


def _truncate_group(parts, max_length: int, truncation: str, stats: EncodeStats | None):
    """Apply the truncation rule jointly to encodings that share one prompt; ``None`` if dropped.

    All members lose the same number of leading prompt tokens so that a pair still shares its prompt.
    """
    longest = max(len(ids) for ids, _, _ in parts)
    if longest <= max_length:
        return parts
    cut = longest - max_length
    fits = truncation == "left" and all(cut < prompt_length for _, _, prompt_length in parts)
    if not fits:
        if stats is not None:
            stats.dropped[TOO_LONG] = stats.dropped.get(TOO_LONG, 0) + 1
        return None
    if stats is not None:
        stats.truncated += 1
    return [(ids[cut:], _cut_mask(mask, cut), prompt_length - cut) for ids, mask, prompt_length in parts]


def _cut_mask(mask: list[bool], cut: int) -> list[bool]:
    """``mask[cut:]``, except that the rest of a target turn the cut went through is no longer a target."""
    out = mask[cut:]
    if cut and mask[cut - 1]:
        j = 0
        while j < len(out) and out[j]:
            out[j] = False
            j += 1
    return out


def _to_encoded(ids: list[int], mask: list[bool], prompt_length: int) -> Encoded:
    input_ids = torch.tensor(ids, dtype=torch.long)
    return Encoded(input_ids, torch.ones_like(input_ids), torch.tensor(mask, dtype=torch.bool), prompt_length)


def encode_chat(
    tokenizer,
    prompt: Conversation,
    completions: Sequence[Conversation | None] = (None,),
    *,
    max_length: int,
    truncation: str = "left",
    loss_on: str = "last",
    stats: EncodeStats | None = None,
    special_text: str = "drop",
    targets: Sequence[bool] | None = None,
) -> list[Encoded] | None:
    """Encode one prompt with each of its completions (one for SFT, two for a pair, K for a ranking).

    Args:
        prompt: the messages before the completion (for SFT: everything before the last assistant turn).
        completions: continuations of ``prompt``; ``(None,)`` encodes the prompt alone with the generation
            prompt appended (PPO), with an all-False loss mask.
        max_length: the most tokens any returned encoding may have.
        truncation: ``"left"`` cuts prompt tokens from the left (the same number for all completions) or
            ``"drop"`` drops the example; see the module docstring.
        loss_on: ``"last"`` targets the assistant turns of the completion only; ``"all"`` also the assistant
            turns inside the prompt.
        stats: counters to increment (``truncated``, ``dropped["too_long"]``); an ``EncodeStats`` or the
            ``DataSummary`` of the loader.
        special_text: ``"drop"``, ``"error"`` or ``"keep"`` a message whose content contains a special
            token's text; see the module docstring.

    Returns:
        One :class:`Encoded` per completion, in order, or ``None`` when the example was dropped.
    """
    check_choice("truncation", truncation, TRUNCATION_POLICIES)
    check_choice("loss_on", loss_on, LOSS_ON)
    check_choice("special_text", special_text, SPECIAL_TEXT_POLICIES)
    if max_length < 1:
        raise ValueError(f"max_length={max_length} must be positive")
    if special_text != "keep":
        found = _special_text(tokenizer, [prompt, *[c for c in completions if c is not None]])
        if found is not None:
            if special_text == "error":
                raise ValueError(f"message {found[0]} ({found[1]}) contains the special token text {found[2]!r}; "
                                 "pass special_text='drop' to skip such examples or 'keep' to tokenise it as is")
            if stats is not None:
                stats.dropped[SPECIAL_TEXT] = stats.dropped.get(SPECIAL_TEXT, 0) + 1
            return None
    parts = [_encode_untruncated(tokenizer, prompt, completion, loss_on, targets) for completion in completions]
    parts = _truncate_group(parts, max_length, truncation, stats)
    return None if parts is None else [_to_encoded(*part) for part in parts]


def special_token_texts(tokenizer) -> tuple[str, ...]:
    """The texts a tokenizer reads as special tokens (its special and added-special tokens), longest first."""
    texts = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            texts.add(str(token))
    return tuple(sorted((t for t in texts if t), key=len, reverse=True))


def _special_text(tokenizer, conversations: Sequence[Conversation]) -> tuple[int, str, str] | None:
    """(index of the message in prompt + completions, its role, the special text) of the first offender."""
    texts = special_token_texts(tokenizer)
    index = 0
    for conversation in conversations:
        for message in conversation:
            content = message.get("content")
            if isinstance(content, str):
                for text in texts:
                    if text in content:
                        return index, message.get("role", "?"), text
            index += 1
    return None


def split_last_turn(messages: Conversation) -> tuple[Conversation, Conversation]:
    """(prompt, completion): the completion is the last assistant message and anything after it."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "assistant":
            return list(messages[:i]), list(messages[i:])
    raise ValueError("an SFT conversation needs at least one assistant message to learn from")


def encode_sft(tokenizer, example: SFTExample, **kw) -> Encoded | None:
    """An SFT conversation; ``loss_on="all"`` trains on every assistant turn, ``"last"`` on the final one; a record
    with per-message ``meta["loss_weights"]`` (LLaMA-Factory v1's ``loss_weight``) trains on exactly the assistant
    turns whose weight is above 0, whatever ``loss_on`` says."""
    prompt, completion = split_last_turn(example.messages)
    weights = example.meta.get("loss_weights")
    if weights is not None:
        if len(weights) != len(example.messages):
            raise ValueError(f"meta loss_weights has {len(weights)} values for {len(example.messages)} messages")
        kw["targets"] = [m["role"] == "assistant" and w > 0 for m, w in zip(example.messages, weights, strict=True)]
    out = encode_chat(with_tools(tokenizer, example.meta), prompt, [completion], **kw)
    return None if out is None else out[0]


def encode_pair(tokenizer, pair: PreferencePair, **kw) -> EncodedPair | None:
    """A preference pair; loss masks mark the completions' assistant turns (what DPO scores)."""
    out = encode_chat(with_tools(tokenizer, pair.meta), pair.prompt, [pair.chosen, pair.rejected], **kw)
    return None if out is None else EncodedPair(out[0], out[1], float(pair.target), pair.source, dict(pair.meta))


def encode_ranking(tokenizer, ranking: Ranking, **kw) -> EncodedRanking | None:
    """A K-way ranking: every completion shares the prompt tokens.

    An answer that cannot fit ``max_length`` even with the prompt cut to one token is removed from its group
    (counted in ``stats.removed_answers``), and the rest of the group is kept while it still orders two answers;
    a group left with fewer than two distinct ranks is dropped as ``too_long``."""
    stats = kw.pop("stats", None)
    tokenizer = with_tools(tokenizer, ranking.meta)
    completions, ranks = list(ranking.completions), list(ranking.ranks)
    scratch = EncodeStats()  # counted into ``stats`` once, for the group as finally encoded (or dropped)
    out = encode_chat(tokenizer, ranking.prompt, completions, stats=scratch, **kw)
    if out is None and scratch.dropped.get(TOO_LONG) and kw.get("truncation", "left") == "left":
        kept = [i for i, c in enumerate(completions) if encode_chat(tokenizer, ranking.prompt, [c], **kw)]
        if len({ranks[i] for i in kept}) >= 2:
            completions, ranks = [completions[i] for i in kept], [ranks[i] for i in kept]
            scratch = EncodeStats(removed_answers=len(ranking.completions) - len(kept))
            out = encode_chat(tokenizer, ranking.prompt, completions, stats=scratch, **kw)
    if stats is not None:
        stats.truncated += scratch.truncated
        stats.removed_answers += scratch.removed_answers
        for reason, n in scratch.dropped.items():
            stats.dropped[reason] = stats.dropped.get(reason, 0) + n
    return None if out is None else EncodedRanking(out, ranks)


def encode_prompt(tokenizer, example: PromptExample, **kw) -> EncodedPrompt | None:
    """A PPO prompt: exact ids, generation prompt included, nothing to predict; ``max_length`` bounds it."""
    kw.setdefault("loss_on", "last")
    out = encode_chat(with_tools(tokenizer, example.meta), example.prompt, (None,), **kw)
    return None if out is None else EncodedPrompt(out[0], example.prompt, dict(example.meta))
