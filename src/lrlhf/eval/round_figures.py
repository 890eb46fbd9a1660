"""The figures of iterative RLHF's rounds (:mod:`lrlhf.run.rounds`): a policy's samples on held-out prompts judged by
the world's judge, a reward model's calibrated scores and pairwise accuracy on them, and the rounds' table and plot."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from lrlhf.utils.io import atomic_write_text


def policy(folder: str):
    from lrlhf.models import ModelConfig, load_causal_lm, load_tokenizer

    config = ModelConfig(folder)
    return load_causal_lm(config).eval(), load_tokenizer(config)


def rm_scorer(rm_folder: Path):
    """``score(prompts, texts) -> calibrated scores`` of the reward model in ``rm_folder``, loaded once
    (:meth:`RewardModule.export`'s folder: a LoRA RM's holds its merged weights too)."""
    from lrlhf.models import ModelConfig, load_tokenizer
    from lrlhf.models.reward import load_calibration, load_reward_model
    from lrlhf.rewards.text import reward_model_scorer

    folder = Path(rm_folder)
    scorer = reward_model_scorer(load_reward_model(folder), load_tokenizer(ModelConfig(str(folder))), 1024)
    calibration = load_calibration(folder)

    def score(prompts: list, texts: list[str]) -> list[float]:
        return [(s - calibration.mean) / calibration.std for s in scorer(prompts, texts)]

    return score


def pair_accuracy(s_a: list[float], s_b: list[float], u_a: list[float], u_b: list[float]) -> dict:
    """How often the scores order a pair as the judge's utilities do, on the pairs the judge does not tie, with
    the 95 % bootstrap interval."""
    from lrlhf.functional.stats import bootstrap_interval

    hits = [float((x > y) == (ga > gb)) for x, y, ga, gb in zip(s_a, s_b, u_a, u_b, strict=True) if ga != gb]
    if not hits:
        return {"accuracy": float("nan"), "interval": [float("nan")] * 2, "pairs": 0}
    return {"accuracy": sum(hits) / len(hits), "interval": list(bootstrap_interval(hits)), "pairs": len(hits)}


#: Pairs of samples per held-out prompt in the rounds' figures (4 samples: pairs (1, 2) and (3, 4)).
HELD_OUT_PAIRS = 2


@dataclass(frozen=True)
class HeldOut:
    """Where and how the rounds' figures sample a policy: the run's ``eval`` settings."""

    prompts: str
    """The held-out prompt file (``eval.prompts``)."""
    judge: object
    """The world's judge (``eval.judge``: ``toy_gold``, ``rm:<folder>``, ``<module>:<callable>`` or a callable)."""
    max_new_tokens: int
    max_prompts: int | None = None
    """The first N prompts only; None = all."""
    max_prompt_length: int = 1024


def held_out_samples(policy_folder: str, held_out: HeldOut, seed: int) -> dict:
    """``2 * HELD_OUT_PAIRS`` samples of the policy per held-out prompt (``held_out.prompts``) as pairs ``a[i]``,
    ``b[i]`` (pair ``i`` belongs to prompt ``i // HELD_OUT_PAIRS``), and the world judge's utility of each."""
    from lrlhf.eval.judges import resolve_judge, score_responses
    from lrlhf.models.generation import SamplingConfig, generate_responses

    prompts = held_out_prompts(held_out)
    model, tokenizer = policy(policy_folder)
    sampling = SamplingConfig(max_new_tokens=held_out.max_new_tokens, temperature=1.0, seed=seed)
    texts = generate_responses(model, tokenizer, [p for p in prompts for _ in range(2)], sampling, batch_size=64,
                               max_prompt_length=held_out.max_prompt_length)
    judge = resolve_judge(held_out.judge, key="eval.judge")
    return {"a": texts[0::2], "b": texts[1::2], "u_a": score_responses(judge, prompts, texts[0::2]),
            "u_b": score_responses(judge, prompts, texts[1::2])}


def held_out_prompts(held_out: HeldOut) -> list:
    """The held-out prompts, each ``HELD_OUT_PAIRS`` times (one per pair of :func:`held_out_samples`)."""
    from lrlhf.data.formats import load_records

    prompts = load_records(held_out.prompts, "prompt", verbose=False)[0][:held_out.max_prompts]
    return [p for p in prompts for _ in range(HELD_OUT_PAIRS)]


def per_prompt(values: list[float]) -> list[float]:
    """The mean of each prompt's ``HELD_OUT_PAIRS`` consecutive values (the prompt is the bootstrap's unit)."""
    k = HELD_OUT_PAIRS
    return [sum(values[i:i + k]) / k for i in range(0, len(values), k)]


def _fmt(value, interval=None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.3f}" + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")


def write_report(rows: list[dict], run_dir: Path) -> dict:
    """``rounds.json``, ``rounds.md`` (one row per round) and ``rounds.png`` (judge and proxy across rounds)."""
    kind = "gold" if any("gold/ppo" in row for row in rows) else "judge"
    lines = [f"| round | labels (total) | PPO steps | held-out {kind} [95% CI] | {kind} - reference [95% CI] "
             "| proxy [95% CI] | KL (seq) | RM acc. before refresh | RM acc. after | RM acc. on its PPO policy "
             "| RM calibration (mean, std) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]

    def acc(value):
        return "-" if not value else _fmt(value["accuracy"], value["interval"])

    for row in rows:
        cal = row["calibration"]
        lines.append(
            f"| {row['round']} | {row['labels']} ({row['labels_total']}) | {row['ppo_steps']} "
            f"| {_fmt(row.get(f'{kind}/ppo'), row.get(f'{kind}/ppo_interval'))} "
            f"| {_fmt(row.get(f'{kind}/ppo_minus_sft'), row.get(f'{kind}/ppo_minus_sft_interval'))} "
            f"| {_fmt(row.get('proxy'), row.get('proxy_interval'))} | {_fmt(row.get('rollout/kl_seq'))} "
            f"| {acc(row.get('rm_accuracy_before'))} | {acc(row.get('rm_accuracy_after'))} "
            f"| {acc(row.get('rm_accuracy_end'))} | {_fmt(cal.get('mean'))}, {_fmt(cal.get('std'))} |")
    table = "\n".join(lines) + "\n"
    atomic_write_text(run_dir / "rounds.json", json.dumps(rows, indent=2, default=str) + "\n")
    atomic_write_text(run_dir / "rounds.md", table)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    x = [row["round"] for row in rows]
    ax.plot(x, [row.get(f"{kind}/ppo", float("nan")) for row in rows], "o-", label=f"held-out {kind}")
    ax.set_xlabel("round")
    ax.set_ylabel(f"held-out {kind}")
    ax.set_xticks(x)
    twin = ax.twinx()
    twin.plot(x, [row.get("proxy", float("nan")) for row in rows], "s--", color="tab:orange",
              label="proxy (calibrated)")
    twin.set_ylabel("proxy (calibrated RM score)")
    handles = [*ax.get_legend_handles_labels()[0], *twin.get_legend_handles_labels()[0]]
    ax.legend(handles, [h.get_label() for h in handles], loc="best", fontsize=8)
    fig.tight_layout()
    plot = run_dir / "rounds.png"
    fig.savefig(plot, dpi=120)
    plt.close(fig)
    return {"table": str(run_dir / "rounds.md"), "table_markdown": table, "plot": str(plot)}


__all__ = ["HELD_OUT_PAIRS", "HeldOut", "held_out_prompts", "held_out_samples", "pair_accuracy", "per_prompt", "policy",
           "rm_scorer", "write_report"]
