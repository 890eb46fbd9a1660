"""Evaluation: observe a model (gold utility on held-out prompts, ...)."""

from lrlhf.eval.utility import UtilityEstimate, bootstrap_interval, sample_gold_utility

__all__ = ["UtilityEstimate", "bootstrap_interval", "sample_gold_utility"]
