"""Pure tensor math of RLHF: masks, log-probs, KL, reward shaping, GAE, whitening, losses, preference pairs.

This subpackage imports only torch (no Lightning, transformers, peft or Hydra). Every function documents
the tensor shapes and which positions a mask marks valid; see the README for the conventions
(one reward slot per action, the score added once at the terminal action).
"""

from lrlhf.functional.advantages import gae, grpo_advantages, rloo_advantages
from lrlhf.functional.ensemble_rules import (
    EnsembleCombine,
    EnsembleMean,
    MeanMinusStd,
    SingleMember,
    WorstCase,
    disagreement,
)
from lrlhf.functional.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    KLController,
    kl_abs,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_penalty,
)
from lrlhf.functional.logprobs import entropy_from_logits, token_logprobs
from lrlhf.functional.losses import (
    KTOStats,
    PolicyLossStats,
    ValueLossStats,
    bradley_terry_loss,
    explained_variance,
    kto_loss,
    ppo_policy_loss,
    ranking_loss,
    value_loss,
)
from lrlhf.functional.masks import (
    ResponseMasks,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    response_masks,
)
from lrlhf.functional.policy_losses import (
    GSPO,
    Aggregation,
    ClipHigher,
    ClipPPO,
    DualClip,
    PolicyLoss,
    SequenceMean,
    SequenceSumNorm,
    TokenMean,
)
from lrlhf.functional.preference_losses import (
    DPOLoss,
    DPOStats,
    IPOLoss,
    PreferenceLoss,
    RobustDPOLoss,
    SimPOLoss,
    dpo_loss,
)
from lrlhf.functional.preferences import margin_summary, pairwise_accuracy, ranking_pairs
from lrlhf.functional.rewards import ShapedRewards, shape_rewards

__all__ = [
    "GSPO",
    "KL_ESTIMATORS",
    "AdaptiveKLController",
    "Aggregation",
    "ClipHigher",
    "ClipPPO",
    "DPOLoss",
    "DPOStats",
    "DualClip",
    "EnsembleCombine",
    "EnsembleMean",
    "FixedKLController",
    "IPOLoss",
    "KLController",
    "KTOStats",
    "MeanMinusStd",
    "PolicyLoss",
    "PolicyLossStats",
    "PreferenceLoss",
    "ResponseMasks",
    "RobustDPOLoss",
    "SequenceMean",
    "SequenceSumNorm",
    "ShapedRewards",
    "SimPOLoss",
    "SingleMember",
    "TokenMean",
    "ValueLossStats",
    "WorstCase",
    "bradley_terry_loss",
    "disagreement",
    "dpo_loss",
    "entropy_from_logits",
    "explained_variance",
    "gae",
    "grpo_advantages",
    "kl_abs",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_penalty",
    "kto_loss",
    "margin_summary",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "pairwise_accuracy",
    "ppo_policy_loss",
    "ranking_loss",
    "ranking_pairs",
    "response_masks",
    "rloo_advantages",
    "shape_rewards",
    "token_logprobs",
    "value_loss",
]
