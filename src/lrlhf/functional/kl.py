"""Per-token KL estimators and the KL-coefficient controllers.

Estimators of KL(pi || ref) from tokens sampled from pi (Schulman, "Approximating KL divergence", 2020),
with ``logprobs`` = log pi(a) and ``ref_logprobs`` = log ref(a) of the sampled action a:

- ``k1``: ``logp - ref``; unbiased, can be negative per token.
- ``k2``: ``0.5 * (logp - ref)**2``; biased, always >= 0, low variance.
- ``k3``: ``(exp(r) - 1) - r`` with ``r = ref - logp``; unbiased and always >= 0.
- ``abs``: ``|logp - ref|``.

And the controllers of the KL coefficient beta, one interface (:class:`KLController`): :class:`FixedKLController`
and :class:`AdaptiveKLController`. Their errors name the config key ``module.kl_controller.*``, where the PPO
recipes build them (by ``_target_``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

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


class KLController:
    """The interface of a KL-coefficient controller: ``value`` is beta in effect; ``update`` is called once per
    rollout with the measured KL; only ``value`` is state (the settings come from the config)."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> float:
        """Take the KL measured over ``n_steps`` samples; return the new beta."""
        return self.value

    def stats(self) -> dict[str, float]:
        """What the last ``update`` decided besides ``value``, for the log (names without a prefix)."""
        return {}

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


@dataclass
class FixedKLController(KLController):
    """A constant beta: ``update`` leaves it as it is.

    Args:
        kl_coef: beta, ``>= 0``.
    """

    kl_coef: float = 0.05
    value: float = field(init=False)

    def __post_init__(self):
        if not self.kl_coef >= 0:
            raise ValueError(f"module.kl_controller.kl_coef must be >= 0, got {self.kl_coef!r}")
        self.value = float(self.kl_coef)


@dataclass
class AdaptiveKLController(KLController):
    """Adaptive KL coefficient of Ziegler et al. (2019), "Fine-Tuning LMs from Human Preferences", eq. 2.

    ``e = clip(KL / target - 1, -clip, clip)``; ``beta <- beta * (1 + e * n_steps / horizon)``.

    Args:
        kl_coef: the starting beta, ``> 0``.
        target: the KL (in the units the caller measures, e.g. per-sequence sum of k1) to steer towards.
        horizon: how many steps (samples, in Ziegler's use) the correction is spread over.
        clip: bound of the proportional error (0.2 in the paper).
    """

    kl_coef: float = 0.1
    target: float = 6.0
    horizon: float = 10000.0
    clip: float = 0.2
    value: float = field(init=False)
    error: float | None = field(init=False, default=None)
    """The clipped proportional error of the last ``update`` (None before the first)."""

    def __post_init__(self):
        for key in ("kl_coef", "target", "horizon", "clip"):
            if not getattr(self, key) > 0:
                raise ValueError(f"module.kl_controller.{key} must be > 0 (adaptive controller), "
                                 f"got {getattr(self, key)!r}")
            setattr(self, key, float(getattr(self, key)))
        self.value = self.kl_coef

    def update(self, current_kl: float, n_steps: int) -> float:
        self.error = min(max(float(current_kl) / self.target - 1.0, -self.clip), self.clip)
        self.value *= 1.0 + self.error * n_steps / self.horizon
        return self.value

    def stats(self) -> dict[str, float]:
        """``target`` and the last ``error``."""
        return {} if self.error is None else {"target": self.target, "error": self.error}
