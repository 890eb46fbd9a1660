"""Evaluation: observe a model (held-out gold utility, Best-of-N under a reward model, pairwise win rates)."""

from lrlhf.eval.best_of_n import BestOfN, best_of_n, bon_kl, reward_model_scorer, select_best_of_n, toy_gold_judge
from lrlhf.eval.utility import UtilityEstimate, bootstrap_interval, sample_gold_utility
from lrlhf.eval.winrate import OUTCOMES, WinRate, win_rate

__all__ = [
    "OUTCOMES",
    "BestOfN",
    "UtilityEstimate",
    "WinRate",
    "best_of_n",
    "bon_kl",
    "bootstrap_interval",
    "reward_model_scorer",
    "sample_gold_utility",
    "select_best_of_n",
    "toy_gold_judge",
    "win_rate",
]
