"""Preference and ranking formats: ``sharegpt_pairwise``, ``hh_rlhf``, ``pairwise``,
``chosen_rejected_messages`` (LLaMA-Factory v1's DPO/RM files), ``ranking``."""

from __future__ import annotations

import math
from typing import Any

from lrlhf.data.conversations import (
    SkipRecord,
    check_continuation,
    check_prompt,
    conversation,
    hh_transcript,
    sharegpt_conversation,
    split_shared_prompt,
    strip_prompt,
    with_system,
)
from lrlhf.data.formats.registry import _Ctx, _register
from lrlhf.data.records import PreferencePair, Ranking, label_value
from lrlhf.data.summary import UNLABELLED

# --- preferences ---------------------------------------------------------------------------------------


#: a pair's optional label fields: a person's ``label`` (``lrlhf label``, the iterative loop's file exchange), an
#: explicit tie, P(chosen wins), or the two answers' scores (UltraFeedback). When a row has the key ``label`` it
#: decides alone (the labelled file keeps the input's ``target``): 1 / 0 / 0.5 (:func:`label_value`), null = not a
#: training pair (dropped and counted as ``unlabelled``); a pair labelled 0 is read with its answers swapped.
LABEL_KEYS = ("label", "tie", "target", "score_chosen", "score_rejected")


def _people_label(row: dict[str, Any], ctx: _Ctx) -> float:
    """The row's ``label`` (the key is present), or :class:`SkipRecord` (``unlabelled``) when it is null."""
    try:
        label = label_value(row["label"])
    except ValueError as err:
        raise ctx.error(f"field {err}") from None
    if label is None:
        raise SkipRecord(UNLABELLED)
    return label


def _target(row: dict[str, Any], ctx: _Ctx) -> float:
    tie = ctx.get(row, "tie", bool, "true or false", optional=True)
    target = ctx.get(row, "target", (int, float), "a number in [0, 1]", optional=True)
    scores = [ctx.get(row, key, (int, float), "a number", optional=True) for key in ("score_chosen", "score_rejected")]
    if None not in scores:  # equal scores are a tie, not "chosen wins"; a lower-scored chosen is a labelling error
        if scores[0] < scores[1]:
            raise ctx.error(f"field 'score_chosen' ({scores[0]}) is below 'score_rejected' ({scores[1]}): the "
                            "chosen answer scored worse; swap the two or drop the scores")
        if scores[0] == scores[1] and target is None and tie is None:
            tie = True
    if target is not None and not (math.isfinite(target) and 0.0 <= target <= 1.0):
        raise ctx.error(f"field 'target' is {target!r}; allowed: a number in [0, 1] (P(chosen wins))")
    if tie and target is not None and target != 0.5:
        raise ctx.error(f"fields 'tie' (true) and 'target' ({target}) disagree; a tie is target 0.5")
    if tie:
        return 0.5
    return 1.0 if target is None else float(target)


def _pair(prompt, chosen, rejected, row, ctx) -> PreferencePair:
    check_prompt(prompt, ctx, "prompt")
    check_continuation(chosen, ctx, "chosen")
    check_continuation(rejected, ctx, "rejected")
    labelled = "label" in row  # a person's decision: over target / tie / scores
    if labelled:
        target = _people_label(row, ctx)
        if target < 0.5:
            chosen, rejected, target = rejected, chosen, 1.0 - target
    else:
        target = _target(row, ctx)
    return PreferencePair(prompt=prompt, chosen=chosen, rejected=rejected, target=target,
                          source=ctx.source, meta=ctx.meta(row), labelled=labelled)


@_register("preference", "sharegpt_pairwise", ("conversations", "chosen", "rejected"),
           ("system", *LABEL_KEYS))
def read_sharegpt_pairwise(row, ctx):
    prompt = sharegpt_conversation(ctx.get(row, "conversations", list, "a list of turns"), ctx,
                                    "conversations")
    system = ctx.get(row, "system", str, "a string", optional=True)
    chosen = sharegpt_conversation(ctx.get(row, "chosen", (dict, list), "a {from, value} turn"), ctx,
                                    "chosen")
    rejected = sharegpt_conversation(ctx.get(row, "rejected", (dict, list), "a {from, value} turn"), ctx,
                                      "rejected")
    return _pair(with_system(system, prompt), chosen, rejected, row, ctx)


@_register("preference", "hh_rlhf", ("chosen", "rejected"), LABEL_KEYS,
           detect=lambda row: "prompt" not in row and isinstance(row["chosen"], str))
def read_hh_rlhf(row, ctx):
    chosen = hh_transcript(ctx.get(row, "chosen", str, "a transcript string"), ctx, "chosen")
    rejected = hh_transcript(ctx.get(row, "rejected", str, "a transcript string"), ctx, "rejected")
    return _pair(*split_shared_prompt(chosen, rejected, ctx), row, ctx)


@_register("preference", "pairwise", ("chosen", "rejected"), ("prompt", *LABEL_KEYS))
def read_pairwise(row, ctx):
    raw_chosen = ctx.get(row, "chosen", (str, list), "a string or messages")
    raw_rejected = ctx.get(row, "rejected", (str, list), "a string or messages")
    chosen = conversation(raw_chosen, ctx, "chosen", "assistant")
    rejected = conversation(raw_rejected, ctx, "rejected", "assistant")
    raw_prompt = ctx.get(row, "prompt", (str, list), "a string or messages", optional=True)
    if raw_prompt is None:
        if isinstance(raw_chosen, str) or isinstance(raw_rejected, str):
            raise ctx.error("field 'prompt' is missing; it may be left out only when chosen and rejected are "
                            "full conversations (message lists) that share the prompt")
        return _pair(*split_shared_prompt(chosen, rejected, ctx), row, ctx)
    prompt = conversation(raw_prompt, ctx, "prompt", "user")
    return _pair(prompt, strip_prompt(prompt, chosen), strip_prompt(prompt, rejected), row, ctx)



@_register("preference", "chosen_rejected_messages", ("chosen_messages", "rejected_messages"), LABEL_KEYS)
def read_chosen_rejected_messages(row, ctx):
    chosen = conversation(ctx.get(row, "chosen_messages", list, "a list of messages"), ctx, "chosen_messages",
                          "assistant")
    rejected = conversation(ctx.get(row, "rejected_messages", list, "a list of messages"), ctx,
                            "rejected_messages", "assistant")
    return _pair(*split_shared_prompt(chosen, rejected, ctx), row, ctx)



# --- rankings ------------------------------------------------------------------------------------------


@_register("ranking", "ranking", ("prompt", "completions", "ranks"))
def read_ranking(row, ctx):
    prompt = conversation(ctx.get(row, "prompt", (str, list), "a string or messages"), ctx, "prompt", "user")
    check_prompt(prompt, ctx, "prompt")
    raw = ctx.get(row, "completions", list, "a list of strings or message lists")
    ranks = ctx.get(row, "ranks", list, "a list of integers >= 1 (1 = best)")
    if len(raw) < 2 or len(ranks) != len(raw):
        raise ctx.error(f"'completions' ({len(raw)}) and 'ranks' ({len(ranks)}) need one length, at least 2")
    if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks):
        raise ctx.error(f"field 'ranks' is {ranks!r}; allowed: integers >= 0, lower = better (0- or 1-based), "
                        "equal = tie")
    completions = []
    for i, completion in enumerate(raw):
        completion = strip_prompt(prompt, conversation(completion, ctx, f"completions[{i}]", "assistant"))
        check_continuation(completion, ctx, f"completions[{i}]")
        completions.append(completion)
    return Ranking(prompt=prompt, completions=completions, ranks=list(ranks), source=ctx.source,
                   meta=ctx.meta(row))


