"""LightningModules: they orchestrate the functional, data and model layers, one numbered step at a time."""

from lrlhf.modules.dpo import DPOConfig, DPOModule
from lrlhf.modules.kto import KTOConfig, KTOModule
from lrlhf.modules.ppo import PPOConfig, PPOModule, Rollout
from lrlhf.modules.rm import (
    RewardCalibration,
    RewardConfig,
    RewardModule,
    attach_reward_adapter,
    compute_calibration,
    load_calibration,
    load_reward_model,
)
from lrlhf.modules.sft import SFTConfig, SFTModule
from lrlhf.rewards.protocol import FrozenRewardModel, FunctionReward, RewardAdapter, RewardEnsemble, RewardSource

__all__ = [
    "DPOConfig",
    "DPOModule",
    "KTOConfig",
    "KTOModule",
    "FrozenRewardModel",
    "FunctionReward",
    "PPOConfig",
    "PPOModule",
    "RewardCalibration",
    "RewardAdapter",
    "RewardEnsemble",
    "RewardConfig",
    "RewardModule",
    "RewardSource",
    "Rollout",
    "SFTConfig",
    "SFTModule",
    "attach_reward_adapter",
    "compute_calibration",
    "load_calibration",
    "load_reward_model",
]
