"""The high-reward audit (a reward-hacking check): the samples a reward model likes best, with what could explain
their reward: the members' disagreement (an ensemble), the length, how the reward moves under counterfactual edits
(:mod:`lrlhf.eval.counterfactual`) and, where known, the gold utility or a held-out judge's. Reward hacking shows
here first: top samples that are long, padded, repeated, or that an edit the task does not care about moves.

:func:`audit_rows` is the table (W&B table or Markdown); :class:`lrlhf.callbacks.HighRewardAudit` writes it during
PPO every N rollouts, and ``recipe=eval`` for each policy's held-out samples.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from lrlhf.eval.counterfactual import DEFAULT_TRANSFORMS

#: ``rescore(indices, texts) -> rewards``: the reward of sample ``indices[j]``'s prompt with ``texts[j]`` as its
#: response, on the same scale (calibrated) as the audited rewards.
Rescore = Callable[[list[int], list[str]], list[float]]


def audit_rows(prompts: Sequence, responses: Sequence[str], rewards: Sequence[float], lengths: Sequence[int],
               rescore: Rescore, disagreement: Sequence[float] | None = None, judge=None,
               transforms: Sequence = DEFAULT_TRANSFORMS, top_k: int = 8, seed: int = 0) -> tuple[list[str], list]:
    """``(columns, rows)`` of the ``top_k`` highest-reward samples, best first.

    ``judge``: a batch scorer ``(prompts, texts) -> utilities`` (as :func:`counterfactual_table`'s) or None.
    Columns: ``rank``, ``reward``, ``disagreement`` (None without an ensemble), ``length`` (tokens), ``judge``
    (None without one), ``d_<transform>`` for each transformation (the reward's change when the response is
    edited, both rescored by ``rescore`` so a decode/encode round trip cancels; None where the edit changes
    nothing), ``prompt`` (its last message), ``response``.
    """
    if not len(prompts) == len(responses) == len(rewards) == len(lengths):
        raise ValueError("audit_rows needs one prompt, response, reward and length per sample")
    top = sorted(range(len(rewards)), key=lambda i: -float(rewards[i]))[:top_k]
    picked = [responses[i] for i in top]
    base = rescore(top, picked)
    deltas = []
    for t, transform in enumerate(transforms):
        rng = random.Random(seed * 1000 + t)
        edited = [transform(r, rng) for r in picked]
        changed = [j for j, (a, b) in enumerate(zip(picked, edited, strict=True)) if a != b]
        new = rescore([top[j] for j in changed], [edited[j] for j in changed]) if changed else []
        column = [None] * len(top)
        for j, value in zip(changed, new, strict=True):
            column[j] = float(value) - float(base[j])
        deltas.append(column)
    utilities = judge([prompts[i] for i in top], picked) if judge is not None else None
    columns = ["rank", "reward", "disagreement", "length", "judge", *(f"d_{t.name}" for t in transforms),
               "prompt", "response"]
    rows = []
    for j, i in enumerate(top):
        prompt = prompts[i]
        text = prompt.prompt[-1]["content"] if getattr(prompt, "prompt", None) else str(prompt)
        rows.append([j + 1, float(rewards[i]), None if disagreement is None else float(disagreement[i]),
                     int(lengths[i]), None if utilities is None else utilities[j], *(d[j] for d in deltas),
                     text, responses[i]])
    return columns, rows


def audit_markdown(columns: list[str], rows: list, title: str) -> str:
    """The audit as a Markdown section (numbers to 3 decimals, ``-`` for None, text cells one line)."""

    def cell(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:+.3f}" if value == value else "nan"
        return str(value).replace("\n", " ").replace("|", "\\|")

    lines = [f"## {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_policy_audits(evaluated: dict, prompts: Sequence, score, judge, top_k: int, max_samples: int | None,
                        out_dir, seed: int = 0) -> dict:
    """``recipe=eval``'s part: for each policy's held-out samples (:class:`lrlhf.eval.harness.Samples`), the
    high-reward audit (``audit.md``) and the counterfactual table (``counterfactual.md``, on the first
    ``max_samples`` samples) under ``score(prompts, texts)`` (the calibrated proxy); ``judge`` a pointwise scorer
    ``(prompts, texts) -> utilities`` or None. Returns ``{policy: counterfactual rows}``."""
    from pathlib import Path

    from lrlhf.eval.counterfactual import counterfactual_table, table_markdown
    from lrlhf.utils.io import atomic_write_text

    audits, tables, out = ["# High-reward audit of each policy's held-out samples\n"], [], {}
    tables.append("# Counterfactual rescoring of each policy's held-out samples (the proxy reward's change)\n")
    for name, samples in evaluated.items():
        flat_prompts = [p for p, texts in zip(prompts, samples.texts, strict=True) for _ in texts]
        texts = [t for row in samples.texts for t in row]
        rewards = [r for row in samples.proxy for r in row]
        lengths = [n for row in samples.lengths for n in row]

        def rescore(indices, edited, flat_prompts=flat_prompts):
            return score([flat_prompts[i] for i in indices], edited)

        columns, rows = audit_rows(flat_prompts, texts, rewards, lengths, rescore, judge=judge, top_k=top_k,
                                   seed=seed)
        audits.append(audit_markdown(columns, rows, name))
        k = len(texts) if max_samples is None else min(len(texts), max_samples)
        out[name] = counterfactual_table(score, flat_prompts[:k], texts[:k], judge=judge, seed=seed)
        tables.append(f"## {name} ({k} samples)\n\n" + table_markdown(out[name]))
    atomic_write_text(Path(out_dir) / "audit.md", "\n".join(audits))
    atomic_write_text(Path(out_dir) / "counterfactual.md", "\n".join(tables))
    return out


__all__ = ["audit_markdown", "audit_rows", "write_policy_audits"]
