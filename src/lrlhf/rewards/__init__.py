"""Rewards, one floor below the LightningModules and the evaluation (it may import functional, utils, data, models):
the protocol every consumer scores through (:class:`RewardSource`: ``build`` then ``score`` on token ids, giving
:class:`RewardScores`), the sources (a frozen reward model, its adapter on the policy's base, an ensemble, a
program), text rewards and rules (``rules.py``, ``constraint_reward.py``), an LLM judge (``judge.py``), mixtures
(``mixture.py``), the calibration measured on reference samples (``calibration.py``), and the one adapter from a
built source to a text scorer (:func:`text_scorer`) that best-of-N, ``recipe=eval`` and the judges use.
"""

from lrlhf.rewards.protocol import (
    FrozenRewardModel,
    FunctionReward,
    Meta,
    RewardAdapter,
    RewardEnsemble,
    RewardScores,
    RewardSource,
    TextReward,
    checked_scores,
    reward_source,
)

__all__ = ["FrozenRewardModel", "FunctionReward", "Meta", "RewardAdapter", "RewardEnsemble", "RewardScores",
           "RewardSource", "TextReward", "checked_scores", "reward_source"]
