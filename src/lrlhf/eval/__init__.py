"""Evaluation: observe a model (held-out sampling with proxy score and KL, gold utility and judges, Best-of-N under a
reward model, pairwise win rates, the length-controlled win rate, diversity, subgroups, tables, plots).
``lrlhf.eval.harness`` runs ``recipe=eval``; the early-stopping callback uses the same held-out path and judges.
Imports only ``data``, ``models``, ``functional`` and ``utils`` (tests/test_architecture.py)."""

from lrlhf.eval.best_of_n import (
    BestOfN,
    best_of_n,
    bon_expected,
    bon_kl,
    select_best_of_n,
    toy_gold_judge,
)
from lrlhf.eval.diversity import distinct_n, self_similarity
from lrlhf.eval.heldout import HeldOutSamples, ModelPolicy, ModuleHooks, sample_held_out
from lrlhf.eval.judges import judge_pairs, resolve_judge, reward_model_judge, score_responses
from lrlhf.eval.lc_winrate import LengthControlledWinRate, length_controlled_win_rate
from lrlhf.eval.plots import plot_goodhart, plot_utility_vs_kl
from lrlhf.eval.report import subgroup_means, worst_subgroup, write_table
from lrlhf.eval.utility import UtilityEstimate, bootstrap_interval, compare_with_sft, sample_gold_utility
from lrlhf.eval.winrate import OUTCOMES, WinRate, win_rate
from lrlhf.rewards.text import reward_model_scorer

__all__ = [
    "OUTCOMES",
    "BestOfN",
    "HeldOutSamples",
    "LengthControlledWinRate",
    "ModelPolicy",
    "ModuleHooks",
    "UtilityEstimate",
    "WinRate",
    "best_of_n",
    "bon_expected",
    "bon_kl",
    "bootstrap_interval",
    "compare_with_sft",
    "distinct_n",
    "judge_pairs",
    "length_controlled_win_rate",
    "plot_goodhart",
    "plot_utility_vs_kl",
    "resolve_judge",
    "reward_model_judge",
    "reward_model_scorer",
    "sample_held_out",
    "sample_gold_utility",
    "score_responses",
    "select_best_of_n",
    "self_similarity",
    "subgroup_means",
    "toy_gold_judge",
    "win_rate",
    "worst_subgroup",
    "write_table",
]
