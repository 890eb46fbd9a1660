"""Evaluation: observe a model (held-out gold utility, Best-of-N under a reward model, pairwise win rates, the
length-controlled win rate, diversity, subgroups, tables). ``lrlhf.eval.harness`` runs ``recipe=eval``."""

from lrlhf.eval.best_of_n import (
    BestOfN,
    best_of_n,
    bon_expected,
    bon_kl,
    reward_model_scorer,
    select_best_of_n,
    toy_gold_judge,
)
from lrlhf.eval.diversity import distinct_n, self_similarity
from lrlhf.eval.judges import judge_pairs, resolve_judge, reward_model_judge
from lrlhf.eval.lc_winrate import LengthControlledWinRate, length_controlled_win_rate
from lrlhf.eval.report import subgroup_means, worst_subgroup, write_table
from lrlhf.eval.utility import UtilityEstimate, bootstrap_interval, sample_gold_utility
from lrlhf.eval.winrate import OUTCOMES, WinRate, win_rate

__all__ = [
    "OUTCOMES",
    "BestOfN",
    "LengthControlledWinRate",
    "UtilityEstimate",
    "WinRate",
    "best_of_n",
    "bon_expected",
    "bon_kl",
    "bootstrap_interval",
    "distinct_n",
    "judge_pairs",
    "length_controlled_win_rate",
    "resolve_judge",
    "reward_model_judge",
    "reward_model_scorer",
    "sample_gold_utility",
    "select_best_of_n",
    "self_similarity",
    "subgroup_means",
    "toy_gold_judge",
    "win_rate",
    "worst_subgroup",
    "write_table",
]
