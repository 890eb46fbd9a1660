"""Evaluation: observe a model (gold utility on held-out prompts, ...)."""

from lrlhf.eval.utility import UtilityEstimate, sample_gold_utility

__all__ = ["UtilityEstimate", "sample_gold_utility"]
