"""Per-token KL estimators and the KL-coefficient controllers.

Estimators of KL(pi || ref) from tokens sampled from pi (Schulman, "Approximating KL divergence", 2020),
with ``logprobs`` = log pi(a) and ``ref_logprobs`` = log ref(a) of the sampled action a:

- ``k1``: ``logp - ref``; unbiased, can be negative per token.
- ``k2``: ``0.5 * (logp - ref)**2``; biased, always >= 0, low variance.
- ``k3``: ``(exp(r) - 1) - r`` with ``r = ref - logp``; unbiased and always >= 0.
- ``abs``: ``|logp - ref|``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

KLEstimator = Callable[[Tensor, Tensor], Tensor]


def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return logprobs - ref_logprobs


def kl_k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return 0.5 * (logprobs - ref_logprobs) ** 2


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    log_ratio = ref_logprobs - logprobs
    return torch.expm1(log_ratio) - log_ratio


def kl_abs(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return (logprobs - ref_logprobs).abs()


KL_ESTIMATORS: dict[str, KLEstimator] = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3, "abs": kl_abs}


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str | KLEstimator = "k1") -> Tensor:
    """Per-token KL estimate, same shape as the inputs ``(B, T)``; masking is the caller's job.

    ``estimator`` is a name in :data:`KL_ESTIMATORS` or a callable ``(logprobs, ref_logprobs) -> kl``.
    """
    if callable(estimator):
        return estimator(logprobs, ref_logprobs)
    try:
        fn = KL_ESTIMATORS[estimator]
    except KeyError:
        raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {sorted(KL_ESTIMATORS)}") from None
    return fn(logprobs, ref_logprobs)


class FixedKLController:
    """A constant KL coefficient ``value``; ``update`` does nothing (kept for a common interface)."""

    def __init__(self, kl_coef: float):
        if kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> float:
        return self.value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Adaptive KL coefficient of Ziegler et al. (2019), "Fine-Tuning LMs from Human Preferences", eq. 2.

    ``e = clip(KL / target - 1, -0.2, 0.2)``; ``beta <- beta * (1 + e * n_steps / horizon)``.

    Args:
        init_kl_coef: starting beta.
        target: the KL (in the units the caller measures, e.g. per-sequence sum of k1) to steer towards.
        horizon: how many steps (samples, in Ziegler's use) the correction is spread over.
        clip: bound of the proportional error (0.2 in the paper).
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float, clip: float = 0.2):
        if init_kl_coef <= 0:
            raise ValueError(f"init_kl_coef must be > 0 for an adaptive controller, got {init_kl_coef}")
        if target <= 0:
            raise ValueError(f"target must be > 0, got {target}")
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)
        self.clip = float(clip)

    def update(self, current_kl: float, n_steps: int) -> float:
        proportional_error = min(max(float(current_kl) / self.target - 1.0, -self.clip), self.clip)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon
        return self.value

    def state_dict(self) -> dict:
        return {"value": self.value, "target": self.target, "horizon": self.horizon, "clip": self.clip}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])
        self.target = float(state["target"])
        self.horizon = float(state["horizon"])
        self.clip = float(state["clip"])
