"""The quality of the labels (the labelling page's summary, ``/summary``): per annotator, agreement with the check
items' known answers and labels per minute; between annotators, Cohen's kappa on the items both decided
(torchmetrics' ``multiclass_cohen_kappa`` over the four decisions ``chosen`` / ``rejected`` / ``tie`` /
``both_bad``; skips left out); and the pairs on which annotators disagree."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import combinations

import torch
from torchmetrics.functional.classification import multiclass_cohen_kappa

from lrlhf.labelling.store import LabelStore

KAPPA_CLASSES = ("chosen", "rejected", "tie", "both_bad")


@dataclass
class AnnotatorSummary:
    name: str
    decisions: int
    labels: int  # decisions with a label (chosen, rejected, tie)
    skipped: int
    checks_answered: int
    checks_correct: int
    per_minute: float | None  # decisions per minute between the first and the last (None with fewer than 2)

    @property
    def check_accuracy(self) -> float | None:
        return self.checks_correct / self.checks_answered if self.checks_answered else None


@dataclass
class PairAgreement:
    a: str
    b: str
    common: int  # items both decided (skips left out)
    agreement: float | None  # the fraction of those with the same decision
    kappa: float | None  # Cohen's kappa; None when undefined (no common item, or one decision only)


@dataclass
class Summary:
    annotators: list[AnnotatorSummary]
    pairs: list[PairAgreement]
    disagreements: list[tuple[str, dict[str, str]]] = field(default_factory=list)  # (item key, annotator -> choice)


def cohen_kappa(x: list[str], y: list[str]) -> float | None:
    """Cohen's kappa of two annotators' decisions on the same items; None when it is undefined."""
    if not x:
        return None
    index = {c: i for i, c in enumerate(KAPPA_CLASSES)}
    kappa = multiclass_cohen_kappa(torch.tensor([index[c] for c in x]), torch.tensor([index[c] for c in y]),
                                   num_classes=len(KAPPA_CLASSES)).item()
    return None if math.isnan(kappa) else kappa


def summarise(store: LabelStore) -> Summary:
    with store.lock:
        logs = {name: dict(log.decisions) for name, log in sorted(store.logs.items())}
    annotators = []
    for name, decided in logs.items():
        events = list(decided.values())
        checks = [e for e in events if e["check"] and e["choice"] != "skip"]
        times = sorted(e["t"] for e in events)
        span = (times[-1] - times[0]) / 60 if len(times) > 1 else 0.0
        annotators.append(AnnotatorSummary(
            name, len(events), sum(e["label"] is not None for e in events), sum(e["choice"] == "skip" for e in events),
            len(checks), sum(e["choice"] == "chosen" for e in checks),
            (len(times) - 1) / span if span > 0 else None))
    pairs = []
    for a, b in combinations(logs, 2):
        keys = [k for k in logs[a] if k in logs[b] and "skip" not in (logs[a][k]["choice"], logs[b][k]["choice"])]
        x, y = [logs[a][k]["choice"] for k in keys], [logs[b][k]["choice"] for k in keys]
        same = sum(i == j for i, j in zip(x, y, strict=True))
        pairs.append(PairAgreement(a, b, len(keys), same / len(keys) if keys else None, cohen_kappa(x, y)))
    disagreements = []
    for key in store.items:
        choices = {name: decided[key]["choice"] for name, decided in logs.items()
                   if key in decided and decided[key]["choice"] != "skip"}
        if len(set(choices.values())) > 1:
            disagreements.append((key, choices))
    return Summary(annotators, pairs, disagreements)


__all__ = ["AnnotatorSummary", "PairAgreement", "Summary", "cohen_kappa", "summarise"]
