"""The ``pairs`` stage (``recipe=pairs``): preference pairs of the SFT policy's own samples, labelled by simulated
annotators on the world's gold: what a world with a programmatic gold and no preference file trains its reward
model and DPO on (``world=sentiment``: its ``pairs_recipe``; :mod:`lrlhf.data.sentiment`).

1. ``world.dir/pair_prompts.jsonl`` is split by prompt (:func:`split_prompts`, seeded) into ``pairs.shares``
   (train, val, test): a test prompt is in no training pair.
2. The SFT policy (``deps.sft``) samples ``pairs.samples_per_prompt`` responses to each prompt (temperature
   ``pairs.temperature``, ``pairs.max_new_tokens``); distinct ones are paired, ``pairs.pairs_per_prompt`` per prompt
   (:func:`lrlhf.run.rounds.on_policy_pairs`).
3. ``annotator`` labels every pair (:class:`lrlhf.eval.annotators.SimulatedAnnotators` on ``world.judge``: a
   label 1 / 0 / 0.5), written as ``pref_train|pref_val|pref_test.jsonl`` in the stage folder, each line carrying the
   gold of both sides (``gold_chosen``, ``gold_rejected``, by ``gold``: the world's) for the figures; nothing that
   trains reads them.
4. ``summary.json``: the counts, the labels' agreement with the gold order (observed; and, for a label model, expected
   and the best accuracy any reward model can reach on these labels: the annotators' ceiling), per split.
"""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig

from lrlhf.run.training import begin_stage
from lrlhf.utils.io import atomic_write_text, write_json_lines

SPLITS = ("pref_train", "pref_val", "pref_test")


@dataclass
class PairSettings:
    """``pairs.*`` of ``recipe=pairs``."""

    samples_per_prompt: int = 4
    pairs_per_prompt: int = 2
    shares: dict = field(default_factory=lambda: {"pref_train": 0.8, "pref_val": 0.05, "pref_test": 0.15})
    max_new_tokens: int = 32
    temperature: float = 1.0
    max_prompts: int | None = None  # the first N pair prompts only (a short run)
    seed: int = 0

    def __post_init__(self):
        if self.samples_per_prompt < 2:
            raise ValueError(f"pairs.samples_per_prompt must be >= 2 (a pair needs two samples), got "
                             f"{self.samples_per_prompt}")
        if self.pairs_per_prompt < 1:
            raise ValueError(f"pairs.pairs_per_prompt must be >= 1, got {self.pairs_per_prompt}")
        if set(self.shares) != set(SPLITS) or any(v <= 0 for v in self.shares.values()) or abs(
                sum(self.shares.values()) - 1.0) > 1e-6:
            raise ValueError(f"pairs.shares must give {', '.join(SPLITS)} shares > 0 summing to 1, got {self.shares}")
        if self.temperature <= 0:
            raise ValueError(f"pairs.temperature must be > 0 (pairs of distinct samples), got {self.temperature}")
        if self.max_prompts is not None and self.max_prompts < 1:
            raise ValueError(f"pairs.max_prompts must be >= 1 or null, got {self.max_prompts}")


def split_prompts(prompts: list, shares: dict, seed: int) -> dict[str, list]:
    """The prompts (distinct: a world's) shuffled with ``seed`` and cut by ``shares``: at least one prompt in each of
    pref_val and pref_test, the rest in pref_train; each split keeps the file order."""
    order = list(range(len(prompts)))
    random.Random(f"lrlhf-pairs:{seed}").shuffle(order)
    n_val, n_test = (max(1, round(shares[s] * len(prompts))) for s in ("pref_val", "pref_test"))
    if len(prompts) - n_val - n_test < 1:
        raise ValueError(f"pairs: {len(prompts)} pair prompts, too few for pairs.shares={shares} (world.limits."
                         "pair_prompts or pairs.max_prompts)")
    cuts = {"pref_val": order[:n_val], "pref_test": order[n_val:n_val + n_test], "pref_train": order[n_val + n_test:]}
    return {name: [prompts[i] for i in sorted(cuts[name])] for name in SPLITS}


def agreement(lines: list[dict], annotator) -> dict:
    """The labels' agreement with the gold order (ties half), observed and expected, and the annotators' ceiling on
    the accuracy of any reward model (:mod:`lrlhf.data.toy.annotators`), over pair lines with their golds."""
    from lrlhf.data.toy.annotators import accuracy_ceiling, expected_agreement, observed_agreement
    from lrlhf.data.toy.utility import response_tokens

    if not lines:
        return {"pairs": 0}
    gc, gr = [r["gold_chosen"] for r in lines], [r["gold_rejected"] for r in lines]
    lc = [len(response_tokens(r["chosen"][0]["content"])) for r in lines]
    lr = [len(response_tokens(r["rejected"][0]["content"])) for r in lines]
    labels = [0.5 if r["target"] == 0.5 else 1.0 for r in lines]  # chosen is the preferred side (a tie: a)
    out = {"pairs": len(lines), "ties": sum(x == 0.5 for x in labels),
           "agreement_with_gold": observed_agreement(gc, gr, labels), "gold_mean": statistics.fmean(gc + gr)}
    config = getattr(annotator, "config", None)  # a label model (SimulatedAnnotators): its expectations
    if config is not None:
        out["expected_agreement"] = expected_agreement(gc, gr, lc, lr, config)
        out["accuracy_ceiling"] = accuracy_ceiling(gc, gr, lc, lr, config)
    return out


def run_pairs(cfg: DictConfig, out_dir: Path, final_dir: Path) -> dict:
    """Draw, label and write the pairs (module docstring); returns the summary (also ``summary.json``)."""
    from hydra.utils import instantiate

    from lrlhf.data.formats import load_records
    from lrlhf.eval.annotators import preference_record
    from lrlhf.eval.judges import resolve_judge, score_responses
    from lrlhf.eval.round_figures import policy
    from lrlhf.models.generation import SamplingConfig
    from lrlhf.run.rounds import on_policy_pairs

    begin_stage(cfg, out_dir, final_dir)
    settings: PairSettings = instantiate(cfg.pairs, _convert_="all")
    annotator = instantiate(cfg.annotator, _convert_="all")
    gold = resolve_judge(cfg.gold, key="gold")
    prompts, _ = load_records(str(Path(cfg.world.dir) / "pair_prompts.jsonl"), "prompt", verbose=False)
    prompts = prompts[:settings.max_prompts]
    parts = split_prompts(prompts, settings.shares, settings.seed)
    model, tokenizer = policy(cfg.policy)
    sampling = SamplingConfig(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                              seed=settings.seed)
    summary: dict = {"stage": "pairs", "run_dir": str(final_dir), "policy": cfg.policy}
    for index, split in enumerate(SPLITS):
        chosen = parts[split]
        print(f"pairs: {split}: sampling {settings.samples_per_prompt} responses to each of {len(chosen)} prompts",
              flush=True)
        pairs, _ = on_policy_pairs(model, tokenizer, chosen, sampling, samples_per_prompt=settings.samples_per_prompt,
                                   pairs_per_prompt=settings.pairs_per_prompt,
                                   budget=settings.pairs_per_prompt * len(chosen),
                                   seed=f"lrlhf-pairs:{settings.seed}:{split}")
        if not pairs:
            raise ValueError(f"pairs: no pair of distinct samples for {split} ({len(chosen)} prompts): raise "
                             "pairs.samples_per_prompt or pairs.temperature, or give more prompts")
        labels = annotator.label(pairs, index)
        records = [p.prompt for p in pairs]
        golds_a = score_responses(gold, records, [p.a for p in pairs])
        golds_b = score_responses(gold, records, [p.b for p in pairs])
        lines = []
        for pair, label, ga, gb in zip(pairs, labels, golds_a, golds_b, strict=True):
            gold_chosen, gold_rejected = (gb, ga) if label == 0.0 else (ga, gb)
            lines.append(preference_record(pair, label, gold_chosen=gold_chosen, gold_rejected=gold_rejected))
        write_json_lines(out_dir / f"{split}.jsonl", lines)
        summary[split] = {"prompts": len(chosen), **agreement(lines, annotator)}
    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


__all__ = ["PairSettings", "SPLITS", "agreement", "run_pairs", "split_prompts"]
