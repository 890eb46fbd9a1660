"""The multi-policy evaluation behind ``python train.py recipe=eval`` (see docs/evaluation.md).

On one held-out prompt set and one sampling config (same seed for every policy), for every policy (a merged
model folder) and for Best-of-N under the proxy (sampled from the reference policy), report:

- gold utility (toy world) and the configured judge's score (any pointwise ``judge(prompt, response) -> float``
  or a pairwise judge, see :mod:`lrlhf.eval.judges`), with a prompt bootstrap interval;
- the proxy's score: a reward model's (calibrated as in PPO's rewards), or a reward source's raw score
  (``eval.reward``: rules, a mixture, a judge, as ``reward=...`` gives PPO; Best-of-N then picks by it);
- KL to the reference: the per-sequence sum of ``log pi - log pi_ref`` over the sampled tokens (k1, an unbiased
  estimate of KL(pi || pi_ref)) and per token (that sum over all sequences / all their tokens); for Best-of-N the
  analytic ``log N - (N - 1) / N`` per sequence (:func:`bon_kl`), per token divided by the picks' mean length;
- response length (tokens, EOS included), distinct-1/2 and self-similarity (:mod:`lrlhf.eval.diversity`);
- win / tie / loss / both-bad against the baseline with a prompt-clustered bootstrap, the length-controlled win
  rate (:mod:`lrlhf.eval.lc_winrate`), and the worst subgroup (request kind in the toy world).

Outputs in the run folder: ``eval_table.md`` / ``eval_table.csv``, ``eval_results.json``, ``utility_vs_kl.png``
(policies and the BoN curve N = 1..``bon.curve_max`` from one pool, :func:`bon_expected`) and ``goodhart.png`` /
``goodhart.csv`` (the held-out evaluations a PPO stage made at its checkpoints: gold and proxy per rollout); with
``eval.audit``, ``audit.md`` (each policy's top-reward samples, :mod:`lrlhf.eval.audit`) and ``counterfactual.md``
(how the proxy moves under edits the task does not reward, :mod:`lrlhf.eval.counterfactual`); numbers and images
also go to the logger if any.

Sampling and measuring are :func:`lrlhf.eval.heldout.sample_held_out`'s (the early-stopping callback's path too);
the plots are :mod:`lrlhf.eval.plots`'.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lrlhf.data.records import PromptExample
from lrlhf.eval.best_of_n import bon_kl
from lrlhf.eval.diversity import distinct_n, self_similarity
from lrlhf.eval.frontier import beyond_the_curves, gap_to_curve, mean_curve, per_prompt_curves
from lrlhf.eval.judges import is_pairwise, judge_accuracy, judge_pairs, resolve_judge, score_responses
from lrlhf.eval.lc_winrate import length_controlled_win_rate
from lrlhf.eval.plots import plot_goodhart, plot_utility_vs_kl
from lrlhf.eval.report import csv_table, subgroup_means, worst_subgroup, write_table
from lrlhf.eval.sampling import Draw, Samples, Shared, draw_all, sample_policy  # noqa: F401 (re-exported)
from lrlhf.eval.utility import bootstrap_interval
from lrlhf.eval.winrate import win_rate
from lrlhf.models.generation import SamplingConfig
from lrlhf.utils.io import atomic_write_text


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


# ---------------------------------------------------------------------------------------------- sampling
def best_of_n_from_pool(pool: Samples, n: int, picks: int) -> Samples:
    """``picks`` Best-of-``n`` responses per prompt from disjoint groups of ``n`` of the pool's samples (group
    ``j`` = samples ``[j n, (j + 1) n)``); the highest proxy wins, the earlier sample on equal scores."""
    size = len(pool.texts[0])
    if n * picks > size:
        raise ValueError(f"Best-of-{n} x {picks} picks needs {n * picks} pool samples per prompt, the pool has {size}")
    out = Samples(f"bon{n}", [], [], [], None, bon_kl(n))
    for p in range(len(pool.texts)):
        chosen = [max(range(j * n, (j + 1) * n), key=lambda i: (pool.proxy[p][i], -i)) for j in range(picks)]
        out.texts.append([pool.texts[p][i] for i in chosen])
        out.lengths.append([pool.lengths[p][i] for i in chosen])
        out.proxy.append([pool.proxy[p][i] for i in chosen])
        if pool.gold:
            out.gold.append([pool.gold[p][i] for i in chosen])
        if pool.judge:
            out.judge.append([pool.judge[p][i] for i in chosen])
    return out


# ----------------------------------------------------------------------------------------------- metrics
def _group_label(prompt: PromptExample, key: str) -> str:
    value = prompt.meta
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return "all"
        value = value[part]
    return str(value)


def policy_row(samples: Samples, baseline: Samples, prompts: Sequence[PromptExample], groups: Sequence[str],
               judge, judge_is_gold: bool, tie_band: float, bad_below: float | None, seed: int,
               n_resamples: int) -> dict:
    """One row of the table: every figure of ``samples`` (see the module docstring) against ``baseline``."""
    boot = {"n_resamples": n_resamples, "seed": seed}
    row: dict = {"policy": samples.name}
    gold = [_mean(g) for g in samples.gold] if samples.gold else None
    if gold is not None:
        row.update(gold=_mean(gold), gold_ci=bootstrap_interval(gold, **boot))
        base = [_mean(g) for g in baseline.gold]
        diff = [a - b for a, b in zip(gold, base, strict=True)]
        row.update(gold_vs_base=_mean(diff), gold_vs_base_ci=bootstrap_interval(diff, **boot))
    if not judge_is_gold and samples.judge:
        per_prompt = [_mean(j) for j in samples.judge]
        row.update(judge=_mean(per_prompt), judge_ci=bootstrap_interval(per_prompt, **boot))
    row["proxy"] = _mean(_mean(p) for p in samples.proxy)
    all_lengths = [x for group in samples.lengths for x in group]
    if samples.analytic_kl is not None:
        row.update(kl_seq=samples.analytic_kl, kl_token=samples.analytic_kl / max(_mean(all_lengths), 1e-9),
                   kl_kind="analytic log N - (N-1)/N")
    else:
        all_kl = [x for group in samples.kl for x in group]
        row.update(kl_seq=_mean(all_kl), kl_token=sum(all_kl) / max(sum(all_lengths), 1), kl_kind="k1 sample mean")
    row["length"] = _mean(all_lengths)
    flat = [t for group in samples.texts for t in group]
    row.update(distinct_1=distinct_n(flat, 1), distinct_2=distinct_n(flat, 2))
    row["self_sim_2"] = self_similarity(samples.texts, 2) if len(samples.texts[0]) > 1 else None
    # pairwise against the baseline: utilities from the judge (a pairwise judge sees A/B in random order)
    by_group = gold if gold is not None else [_mean(j) for j in samples.judge] if samples.judge else None
    label = "gold" if gold is not None else "judge"
    if samples is baseline:
        return _with_subgroups(row, by_group, groups, label)  # the baseline against itself compares nothing
    if is_pairwise(judge):
        ua, ub = [], []
        for p, prompt in enumerate(prompts):
            a_u, b_u, _ = judge_pairs([prompt] * len(samples.texts[p]), samples.texts[p], baseline.texts[p], judge,
                                      seed=seed * 1_000_003 + p)
            ua.append(a_u)
            ub.append(b_u)
    else:
        ua, ub = samples.judge, baseline.judge
    wins = win_rate(ua, ub, tie_band=tie_band, bad_below=bad_below, **boot)
    row.update({name: wins.rates[name] for name in ("win", "tie", "loss", "both_bad")})
    row.update(win_ci=wins.intervals["win"], net=wins.net, net_ci=wins.intervals["net"])
    lc = length_controlled_win_rate(ua, ub, samples.lengths, baseline.lengths, tie_band=tie_band,
                                    bad_below=bad_below, l2=1e-3, **boot)
    row.update(pref=lc.raw, lc_pref=lc.rate, lc_pref_ci=lc.interval, lc_slope=lc.slope)
    return _with_subgroups(row, by_group, groups, label)


def _with_subgroups(row: dict, values: list[float] | None, groups: Sequence[str], label: str) -> dict:
    """Add the worst subgroup and every subgroup's mean of ``values`` (per-prompt gold utility, or the judge's
    score without gold; each prompt weighs 1) as ``worst_group``, ``worst_group_<label>``, ``<label>[<group>]``."""
    if values is not None:
        kind, value = worst_subgroup(values, groups)
        row.update({"worst_group": kind, f"worst_group_{label}": value})
        row.update({f"{label}[{g}]": v for g, v in subgroup_means(values, groups).items()})
    return row


TABLE_COLUMNS = ("policy", "gold", "gold_ci", "gold_vs_base", "gold_vs_base_ci", "gold_vs_bon_proxy",
                 "gold_vs_bon_proxy_ci", "gold_vs_bon_gold", "gold_vs_bon_gold_ci", "judge", "proxy", "kl_seq",
                 "kl_token", "length", "distinct_1", "distinct_2", "self_sim_2", "win", "tie", "loss", "both_bad",
                 "net_ci", "pref", "lc_pref", "lc_pref_ci", "worst_group", "worst_group_gold", "worst_group_judge")


# -------------------------------------------------------------------------------------------------- main
@dataclass
class BonSettings:
    """``eval.bon``: Best-of-N under the proxy from one pool of one policy's samples."""

    policy: str | None = None
    """The policy the pool samples (one of ``eval.policies``)."""
    n: list[int] = field(default_factory=list)
    """Table rows: ``n_samples`` picks per prompt, each the best of its own ``n`` samples of the pool."""
    curve_max: int = 0
    """The utility-vs-KL curve ``N = 1..curve_max`` (0: none)."""
    gold_curve: bool = False
    """Also the curve of Best-of-N *under gold* (the oracle selection, :mod:`lrlhf.eval.frontier`), and each
    policy's gap to both curves at its KL (``gold_vs_bon_proxy``, ``gold_vs_bon_gold``, paired intervals)."""


@dataclass
class AuditSettings:
    """``eval.audit``: each policy's top-reward samples and the counterfactual table."""

    top_k: int = 8
    max_samples: int | None = None


@dataclass
class EvalSettings:
    """``eval.*`` of ``recipe=eval`` (see the module docstring and ``recipes/eval.yaml``), checked when built: a bad
    value fails when planning, naming its key, before any stage is built."""

    prompts: str
    policies: dict[str, str]
    baseline: str
    reference: str
    reward_model: str | None = None
    calibration: str | None = None
    reward: object = None
    """The proxy as a reward source (rules, a mixture, a judge: ``reward=...`` sets it from ``module.reward_model``),
    built here on the reference and its tokenizer; when given, ``reward_model`` and ``calibration`` are not read and
    its raw scores are the proxy."""
    judge: object = "toy_gold"
    max_prompts: int | None = None
    subgroup_key: str = "task.kind"
    n_samples: int = 4
    temperature: float = 1.0
    max_new_tokens: int = 32
    batch_size: int = 256
    bon: BonSettings = field(default_factory=BonSettings)
    tie_band: float = 0.0
    bad_below: float | None = 0.5
    n_resamples: int = 1000
    audit: AuditSettings | None = None
    goodhart_stage: str | None = None

    def __post_init__(self):
        # a policy set to null is left out (recipe=eval without DPO: needs.dpo=null eval.policies.dpo=null)
        self.policies = {name: path for name, path in (self.policies or {}).items() if path is not None}
        if isinstance(self.bon, dict):
            self.bon = BonSettings(**self.bon)
        if isinstance(self.audit, dict):
            self.audit = AuditSettings(**self.audit)
        check_eval_config(self)


def check_eval_config(ev: EvalSettings) -> None:
    """Refuse a bad ``eval`` node of ``recipe=eval`` naming its key (cheap: nothing is loaded)."""
    policies, bon = ev.policies, ev.bon
    checks = [
        ("policies", len(policies) >= 1, "must name at least one policy folder"),
        ("baseline", ev.baseline in policies, f"must be one of eval.policies {sorted(policies)}"),
        ("n_samples", int(ev.n_samples or 0) >= 1, "must be >= 1"),
        ("batch_size", int(ev.batch_size or 0) >= 1, "must be >= 1"),
        ("max_new_tokens", int(ev.max_new_tokens or 0) >= 1, "must be >= 1"),
        ("temperature", float(ev.temperature or 0) > 0, "must be > 0 (KL and Best-of-N need sampling)"),
        ("n_resamples", int(ev.n_resamples or 0) >= 1, "must be >= 1"),
        ("tie_band", float(ev.tie_band or 0) >= 0, "must be >= 0"),
        ("bon.n", all(int(n) >= 1 for n in bon.n or []), "entries must be >= 1"),
        ("bon.curve_max", int(bon.curve_max or 0) >= 0, "must be >= 0 (0: no curve)"),
        ("bon.gold_curve", not bon.gold_curve or int(bon.curve_max or 0) > 0,
         "needs eval.bon.curve_max > 0 (the curves' largest N)"),
        ("bon.policy", not (bon.n or bon.curve_max) or bon.policy in policies,
         f"must be one of eval.policies {sorted(policies)}"),
        ("reward_model", ev.reward_model is not None or ev.reward is not None,
         "is null and so is eval.reward: give the proxy, a reward-model folder or a reward source (reward=...)"),
        ("reward", ev.reward is None or callable(getattr(ev.reward, "score", None)),
         "must be a reward source (an object with build() and score(); lrlhf.rewards.protocol)"),
        ("reward", not getattr(ev.reward, "needs_preparation", False),
         "is a mixture whose scales a PPO run measures on its reference samples (calibrate): recipe=eval has none; "
         "mix raw scores here (module.reward_model.calibrate=null) or evaluate with the reward model"),
        ("judge", callable(ev.judge) or ev.judge == "toy_gold"
         or str(ev.judge).startswith("rm:") or ":" in str(ev.judge),
         "must be toy_gold, rm:<reward model folder> or <module>:<callable>"),
    ]
    for key, ok, rule in checks:
        if not ok:
            value = _lookup(ev, key)
            raise ValueError(f"eval.{key} {rule}, got {value!r}")


def _lookup(node, key: str):
    """``node.a.b`` for ``key = "a.b"`` (None when a part is missing)."""
    for part in key.split("."):
        node = getattr(node, part, None)
    return node


def run_eval(ev: EvalSettings, out_dir: Path, seed: int, goodhart_folder: str | None = None, logger=None,
             hyperparams: dict | None = None, workers: int = 1) -> dict:
    """Evaluate the policies of ``ev`` (see the module docstring); returns the summary. ``goodhart_folder``: the
    stage folder whose held-out history ``goodhart.png`` plots; ``logger``: a Lightning logger the figures also go
    to, with ``hyperparams``; ``workers``: the policies' and the pool's samples drawn in up to that many processes
    (the same samples: :func:`lrlhf.eval.sampling.draw_all`)."""
    from lrlhf.data.formats import load_records
    from lrlhf.eval.best_of_n import toy_gold_judge

    policies = dict(ev.policies)
    bon_ns = [int(n) for n in ev.bon.n]
    prompts, _ = load_records(str(ev.prompts), "prompt", verbose=False)
    if ev.max_prompts:
        prompts = prompts[:ev.max_prompts]
    groups = [_group_label(p, ev.subgroup_key) for p in prompts]
    judge = resolve_judge(ev.judge)
    # the gold: the toy world's utility of each prompt's task, or a judge marked exact (a world's programmatic gold)
    gold = toy_gold_judge if all("task" in p.meta for p in prompts) else judge if getattr(judge, "exact", False) \
        else None
    judge_is_gold, has_gold = judge is gold, gold is not None
    reward = ev.reward
    if reward is not None:
        print(f"eval: the proxy is the reward source {type(reward).__name__} (its raw scores)")
    shared = Shared(prompts, str(ev.reference), ev.reward_model and str(ev.reward_model),
                    ev.calibration and str(ev.calibration), ev.batch_size, reward)
    sampling = SamplingConfig(ev.max_new_tokens, ev.temperature, seed)

    def finish(samples: Samples) -> Samples:  # gold and judge utilities, computed once per sample
        if has_gold and not samples.gold:
            samples.gold = [score_responses(gold, [p] * len(texts), texts) for p, texts in zip(prompts, samples.texts,
                                                                                             strict=True)]
        if not samples.judge and not is_pairwise(judge):
            samples.judge = samples.gold if judge_is_gold else [
                score_responses(judge, [p] * len(texts), texts) for p, texts in zip(prompts, samples.texts, strict=True)
            ]
        return samples

    draws = [Draw(name, str(path), ev.n_samples, sampling) for name, path in policies.items()]
    pool_size = max([ev.bon.curve_max, *(n * ev.n_samples for n in bon_ns)]) if bon_ns or ev.bon.curve_max else 0
    if pool_size:  # Best-of-N under the proxy: one pool of the bon policy's samples, drawn apart from its own
        draws.append(Draw("pool", str(policies[ev.bon.policy]), pool_size,
                          SamplingConfig(ev.max_new_tokens, ev.temperature, seed + 1), kl=False))
    drawn = draw_all(shared, draws, workers, then=finish)  # each scored as it is drawn: a bad judge fails early
    evaluated = dict(zip(policies, drawn[:len(policies)], strict=True))
    pool = drawn[-1] if pool_size else None
    curve, curves = [], {}
    if pool is not None:
        for n in bon_ns:
            evaluated[f"bon{n}"] = best_of_n_from_pool(pool, n, ev.n_samples)
        if has_gold and ev.bon.curve_max:
            curves["proxy"] = per_prompt_curves(pool.proxy, pool.gold, ev.bon.curve_max)
            if ev.bon.gold_curve:
                curves["gold"] = per_prompt_curves(pool.gold, pool.gold, ev.bon.curve_max)
            curve = mean_curve(curves["proxy"])
    baseline = evaluated[ev.baseline]
    rows = [policy_row(s, baseline, prompts, groups, judge, judge_is_gold, ev.tie_band, ev.bad_below, seed,
                       ev.n_resamples) for s in evaluated.values()]
    if ev.bon.gold_curve:  # the frontier: each policy's gold against both curves at its own KL
        for row, samples in zip(rows, evaluated.values(), strict=True):
            row.update(_frontier_gaps(samples, row["kl_seq"], curves, ev.n_resamples, seed))
        for line in beyond_the_curves({r["policy"]: r["kl_seq"] for r in rows}, ev.bon.curve_max) if curves else ():
            print(line, flush=True)
    columns = [c for c in TABLE_COLUMNS if any(r.get(c) is not None for r in rows)]
    every = list(dict.fromkeys(k for r in rows for k in r))  # the CSV keeps every figure, the Markdown the main ones
    md, csv_path = write_table(rows, out_dir / "eval_table", columns, csv_columns=every)
    plots = {}
    if has_gold:
        gold_curve = mean_curve(curves["gold"]) if "gold" in curves else None
        plots["utility_vs_kl"] = str(plot_utility_vs_kl(rows, curve, out_dir / "utility_vs_kl.png", ev.baseline,
                                                        gold_curve=gold_curve))
    history, goodhart = _goodhart_history(goodhart_folder), []
    if history is not None:
        hist, source = history
        plots["goodhart"] = str(plot_goodhart(
            hist["history"], hist.get("best_index"), out_dir / "goodhart.png",
            title=f"one PPO run over its checkpoints: held-out gold and proxy ({Path(source).parent.name})"))
        goodhart = [{"stage": Path(goodhart_folder).name, **{k: r.get(k) for k in GOODHART_COLUMNS[1:]}}
                    for r in hist["history"]]
        atomic_write_text(out_dir / "goodhart.csv", csv_table(goodhart, GOODHART_COLUMNS))
    results = {"prompts": len(prompts), "n_samples": ev.n_samples, "sampling": sampling.__dict__,
               "judge": getattr(judge, "__name__", type(judge).__name__), "baseline": ev.baseline,
               "policies": policies, "rows": rows, "bon_curve": [{"n": n, "kl": k, "gold": g} for n, k, g in curve]}
    if goodhart:
        results["goodhart"] = goodhart
    if "gold" in curves:
        results["bon_gold_curve"] = [{"n": n, "kl": k, "gold": g} for n, k, g in mean_curve(curves["gold"])]
        _write_curves(out_dir / "frontier_curves.csv", results)
    if ev.audit:  # the high-reward audit and the counterfactual table of every policy (audit.md, ...)
        from lrlhf.rewards.text import reward_model_scorer, text_scorer

        m = shared.models()  # loaded once in this process (the draws' may have been in workers)
        raw = text_scorer(reward, m["tokenizer"], batch_size=ev.batch_size) if reward is not None else \
            reward_model_scorer(m["reward_model"], m["tokenizer"], batch_size=ev.batch_size)
        results["counterfactual"] = _audits(evaluated, prompts, raw, m["calibration"], judge, ev, out_dir, seed)
    atomic_write_text(out_dir / "eval_results.json", json.dumps(results, indent=2, default=list) + "\n")
    if logger is not None:
        _log(logger, rows, plots, hyperparams or {}, results)
    figures = [str(out_dir / name) for name, written in (("frontier_curves.csv", "gold" in curves),
                                                         ("goodhart.csv", bool(goodhart))) if written]
    return {"table": str(md), "csv": str(csv_path), "results": str(out_dir / "eval_results.json"), "plots": plots,
            "figures_csv": figures,
            "table_markdown": md.read_text(), **{f"gold/{r['policy']}": r.get("gold") for r in rows},
            **({} if judge_is_gold else judge_accuracy(judge)), "export": str(out_dir)}


def _frontier_gaps(samples: Samples, kl: float, curves: dict, n_resamples: int, seed: int) -> dict:
    """``gold_vs_bon_<curve>`` and its ``_ci`` for each curve (:func:`lrlhf.eval.frontier.gap_to_curve`)."""
    if not samples.gold:
        return {}
    gold = [_mean(g) for g in samples.gold]
    out = {}
    for name, per_prompt in curves.items():
        gap = gap_to_curve(gold, per_prompt, kl, n_resamples=n_resamples, seed=seed)
        out[f"gold_vs_bon_{name}"], out[f"gold_vs_bon_{name}_ci"] = gap if gap is not None else (None, None)
    return out


#: the Best-of-N curves of ``eval_results.json``: (name, key)
CURVES = (("proxy", "bon_curve"), ("gold", "bon_gold_curve"))
#: goodhart.csv: the Goodhart stage's held-out evaluations, one row a checkpoint (``utility``: the held-out gold)
GOODHART_COLUMNS = ("stage", "rollout", "global_step", "kl", "proxy", "utility", "length")


def _write_curves(path: Path, results: dict) -> None:
    """The two Best-of-N curves as one CSV: ``curve, n, kl, gold``."""
    lines = ["curve,n,kl,gold"] + [f"{name},{c['n']},{c['kl']!r},{c['gold']!r}"
                                   for name, key in CURVES for c in results.get(key, [])]
    atomic_write_text(path, "\n".join(lines) + "\n")


def _audits(evaluated, prompts, raw, calibration, judge, ev, out_dir, seed) -> dict:
    """:func:`lrlhf.eval.audit.write_policy_audits` under the proxy (``raw``, a scorer of its raw scores, then the
    calibration) and the pointwise judge."""
    from lrlhf.eval.audit import write_policy_audits

    def score(records, texts):
        values = raw(records, texts)
        return [calibration.normalise(v) for v in values] if calibration is not None else values

    pointwise = None if is_pairwise(judge) else (lambda records, texts: score_responses(judge, records, texts))
    return write_policy_audits(evaluated, prompts, score, pointwise, int(ev.audit.top_k), ev.audit.max_samples,
                               out_dir, seed)


def _goodhart_history(folder: str | None) -> tuple[dict, str] | None:
    if not folder:
        return None
    found = sorted(Path(folder).rglob("heldout_history.json"))
    if not found:
        return None
    history = json.loads(found[0].read_text())
    return (history, str(found[0])) if history.get("history") else None


def _log(logger, rows: Sequence[dict], plots: dict, hyperparams: dict, results: dict) -> None:
    logger.log_hyperparams(hyperparams)
    for row in rows:
        logger.log_metrics({f"eval/{row['policy']}/{k}": v for k, v in row.items()
                            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)})
    if hasattr(logger, "log_table"):  # WandbLogger
        columns = [c for c in TABLE_COLUMNS if c in rows[0]]
        logger.log_table(key="eval/table", columns=columns, data=[[str(r.get(c)) for c in columns] for r in rows])
        curves = [[name, c["n"], c["kl"], c["gold"]] for name, key in CURVES for c in results.get(key, [])]
        if curves:
            logger.log_table(key="eval/bon_curves", columns=["curve", "n", "kl", "gold"], data=curves)
        if results.get("goodhart"):
            logger.log_table(key="eval/goodhart", columns=list(GOODHART_COLUMNS),
                             data=[[r[c] for c in GOODHART_COLUMNS] for r in results["goodhart"]])
    if hasattr(logger, "log_image"):
        for key, path in plots.items():
            logger.log_image(key=f"eval/{key}", images=[path])
    logger.finalize("success")
