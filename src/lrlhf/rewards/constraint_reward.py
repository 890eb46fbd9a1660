"""``reward=constraints``: the prompt record's precise instruction constraint as a rule (IFEval style, RLVR).
:class:`InstructionConstraint` reads ``meta["constraint"]`` (``world=constraints`` writes one per prompt,
:mod:`lrlhf.data.constraints`) and gives 1.0 when the response meets it, else 0.0 (with ``partial=True``, the
partial credit of :func:`lrlhf.data.constraints.credit`, below 0.5); a prompt record without one raises, naming the
rule and the sample."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lrlhf.data.constraints import constraint_of, credit, satisfied
from lrlhf.rewards.rules import Rule


@dataclass
class InstructionConstraint(Rule):
    """1.0 when the response meets its prompt record's ``meta["constraint"]``; else 0.0, or with ``partial`` the
    graded credit of :func:`~lrlhf.data.constraints.credit` (how near the response came, below 0.5)."""

    name: str = "constraint"
    gate: bool = False
    partial: bool = False

    def check(self, prompt: str, response: str) -> float:
        return self.check_record(prompt, response, None)

    def check_record(self, prompt: str, response: str, meta: Mapping | None) -> float:
        where = f"reward rule {self.name!r} on the response {response[:80]!r} to {prompt[-80:]!r}"
        constraint = constraint_of(meta, where)
        return credit(constraint, response) if self.partial else float(satisfied(constraint, response))


__all__ = ["InstructionConstraint"]
