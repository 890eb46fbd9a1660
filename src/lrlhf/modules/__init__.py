"""LightningModules: they orchestrate the functional, data and model layers, one numbered step at a time."""

from lrlhf.modules.reward import RewardConfig, RewardModule, compute_calibration, load_reward_model

__all__ = ["RewardConfig", "RewardModule", "compute_calibration", "load_reward_model"]
