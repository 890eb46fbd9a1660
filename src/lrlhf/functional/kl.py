"""Per-token KL estimators and the KL-coefficient controllers.

Estimators of KL(pi || ref) from tokens sampled from pi (Schulman, "Approximating KL divergence", 2020),
with ``logprobs`` = log pi(a) and ``ref_logprobs`` = log ref(a) of the sampled action a:

- ``k1``: ``logp - ref``; unbiased, can be negative per token.
- ``k2``: ``0.5 * (logp - ref)**2``; biased, always >= 0, low variance.
- ``k3``: ``(exp(r) - 1) - r`` with ``r = ref - logp``; unbiased and always >= 0.
- ``abs``: ``|logp - ref|``.

Where the KL goes (``module/kl_penalty=in_reward|in_loss``), one object each (:class:`KLInReward`,
:class:`KLInLoss`): a ``-beta * kl`` per action in the shaped reward (Ziegler et al. 2019; PPO's default), or
``+beta * kl`` per token in the policy loss (GRPO, Shao et al. 2024). As a *loss*, an estimator's gradient is not the
reverse KL's (Tang & Munos 2025, "On a few pitfalls in KL divergence gradient estimation for RL"): on tokens drawn
from pi, ``grad KL(pi || ref) = E[(log pi - log ref) grad log pi]``, which is the gradient of ``k2``; ``k1``'s is
``E[grad log pi] = 0`` (no pull at all) and ``k3``'s is ``E[(1 - ref / pi) grad log pi]``, the gradient of the
*forward* KL(ref || pi). ``k3+`` (verl's name; OpenRLHF's ``unbiased_gradient``) is the straight-through form: the
value of ``k3`` (unbiased, >= 0: what is logged and reported), the gradient of ``k2``.

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


def straight_through(value: Tensor, logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """``value`` in the forward pass, the gradient of ``k2`` (``(log pi - log ref) grad log pi``) in the backward."""
    k2 = kl_k2(logprobs, ref_logprobs)
    return value.detach() + (k2 - k2.detach())


#: the estimators a loss may use: each of :data:`KL_ESTIMATORS`, and ``k3+`` (k3's value, k2's gradient)
LOSS_ESTIMATORS = (*KL_ESTIMATORS, "k3+")


class KLPenalty:
    """Where the KL to the reference goes and which estimator measures it (see the module docstring).

    ``in_loss``: False = ``-beta * kl`` per action in the reward; True = :meth:`per_token` is added to the policy
    loss. ``measure`` is the estimator of the logged KL and of the one the KL controller sees.
    """

    estimator: str
    in_loss: bool = False

    @property
    def measure(self) -> str:
        """The estimator whose value is logged and fed to the controller (``k3+`` is ``k3`` in value)."""
        return self.estimator.removesuffix("+")

    def per_token(self, logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
        """``(B, T)`` the differentiable per-token KL term of the loss (before beta)."""
        raise NotImplementedError(f"{type(self).__name__} puts the KL in the reward, not in the loss")


@dataclass
class KLInReward(KLPenalty):
    """``-beta * estimator(log pi_old, log ref)`` per action in the shaped reward (no gradient through it).

    Args:
        estimator: a name in :data:`KL_ESTIMATORS` (``k1``: the per-token unbiased estimate; the default).
    """

    estimator: str = "k1"

    def __post_init__(self):
        if self.estimator not in KL_ESTIMATORS:
            raise ValueError(f"module.kl_penalty.estimator must be one of {sorted(KL_ESTIMATORS)} in the reward, "
                             f"got {self.estimator!r}")


@dataclass
class KLInLoss(KLPenalty):
    """``+beta * estimator(log pi, log ref)`` per token in the policy loss, aggregated with it (the reward then
    carries no KL).

    Args:
        estimator: ``k3+`` (the default: k3's value, the reverse KL's gradient), ``k1``, ``k2`` (the right gradient
            too), ``k3`` (GRPO's; the gradient of the forward KL), ``abs``.
    """

    estimator: str = "k3+"
    in_loss: bool = field(default=True, init=False)

    def __post_init__(self):
        if self.estimator not in LOSS_ESTIMATORS:
            raise ValueError(f"module.kl_penalty.estimator must be one of {list(LOSS_ESTIMATORS)} in the loss, "
                             f"got {self.estimator!r}")

    def per_token(self, logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
        ref_logprobs = ref_logprobs.detach()
        value = kl_penalty(logprobs, ref_logprobs, self.measure)
        return straight_through(value, logprobs, ref_logprobs) if self.estimator.endswith("+") else value


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
