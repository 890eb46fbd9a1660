"""Evaluation: observe a model (gold utility on held-out prompts, Best-of-N under a reward model, ...)."""

from lrlhf.eval.best_of_n import BestOfN, best_of_n, bon_kl, reward_model_scorer, select_best_of_n, toy_gold_judge
from lrlhf.eval.utility import UtilityEstimate, bootstrap_interval, sample_gold_utility

__all__ = [
    "BestOfN",
    "UtilityEstimate",
    "best_of_n",
    "bon_kl",
    "bootstrap_interval",
    "reward_model_scorer",
    "sample_gold_utility",
    "select_best_of_n",
    "toy_gold_judge",
]
