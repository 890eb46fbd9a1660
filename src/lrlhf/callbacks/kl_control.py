"""KL control: a fixed or adaptive (Ziegler et al. 2019) coefficient beta of the per-token KL penalty.

Who updates beta, once per rollout: the module. :class:`KLControlCallback` builds the controller
(:class:`~lrlhf.functional.FixedKLController` or :class:`~lrlhf.functional.AdaptiveKLController`) and installs
it as ``pl_module.kl_controller`` at ``setup``; :meth:`PPOModule.update_kl_controller` then feeds it the
rollout's KL at the end of ``training_step``, exactly once, and the next rollout's rewards use the new beta.
The callback does not call ``update`` itself (no double update); it owns the controller's configuration, its
state in checkpoints, and its log.

The KL it reacts to: the mean over the rollout's sequences of the **per-sequence sum** of the per-token
estimator the rewards use (``ppo.kl_estimator``; ``k1`` = ``logp - ref_logp`` by default), i.e. the module's
``rollout/kl_seq``, with ``n_steps`` = the rollout's number of sequences (Ziegler's horizon counts samples).
The callback checks at ``setup`` that the module's estimator is the one named in its config.

Logged every rollout: ``kl/beta_next`` (beta after the update, used by the next rollout; the module logs the
beta in effect as ``kl/beta``), ``kl/<measure>_<estimator>`` (the KL fed to the controller, e.g.
``kl/seq_sum_k1``) and, for the adaptive controller, ``kl/target`` and ``kl/error`` (the clipped proportional
error).
"""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from lrlhf.functional import KL_ESTIMATORS, AdaptiveKLController, FixedKLController

KL_CONTROLLERS = ("fixed", "adaptive")


class _ObservedController:
    """The functional controller, recording the KL and step count of its last ``update`` for the log."""

    def __init__(self, controller, kind: str):
        self.controller = controller
        self.kind = kind
        self.last_kl: float | None = None
        self.last_n_steps: int | None = None
        self.last_error: float | None = None

    @property
    def value(self) -> float:
        return self.controller.value

    def update(self, current_kl: float, n_steps: int) -> float:
        self.last_kl, self.last_n_steps = float(current_kl), int(n_steps)
        if isinstance(self.controller, AdaptiveKLController):
            c = self.controller
            self.last_error = min(max(self.last_kl / c.target - 1.0, -c.clip), c.clip)
        return self.controller.update(current_kl, n_steps)

    def state_dict(self) -> dict:
        return {"kind": self.kind, **self.controller.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        kind = state.get("kind", "adaptive" if "target" in state else "fixed")
        if kind != self.kind:
            raise ValueError(f"cannot resume the KL controller: the checkpoint's is {kind!r}, "
                             f"callbacks.kl_control.controller is {self.kind!r}")
        self.controller.load_state_dict({k: v for k, v in state.items() if k != "kind"})


class KLControlCallback(Callback):
    """Fixed or adaptive KL coefficient (see the module docstring).

    Args:
        controller: ``"fixed"`` or ``"adaptive"``.
        init_kl_coef: starting beta; None = the module's ``ppo.kl_coef``.
        target: adaptive only: the KL to steer towards, in the measured units (per-sequence sum, nats; Ziegler
            et al. used 6).
        horizon: adaptive only: number of samples the correction is spread over (Ziegler et al.: 10000).
        clip: adaptive only: bound of the proportional error (0.2 in the paper).
        estimator: the per-token KL estimator the module's rewards use (checked against ``ppo.kl_estimator``).
        measure: what is fed to the controller; only ``"seq_sum"`` (mean over sequences of the per-sequence
            sum) is implemented, named here so that the config and the log say it.
    """

    def __init__(
        self,
        controller: str = "adaptive",
        init_kl_coef: float | None = None,
        target: float = 6.0,
        horizon: float = 10000.0,
        clip: float = 0.2,
        estimator: str = "k1",
        measure: str = "seq_sum",
    ):
        if controller not in KL_CONTROLLERS:
            raise ValueError(f"callbacks.kl_control.controller must be one of {list(KL_CONTROLLERS)}, "
                             f"got {controller!r}")
        if estimator not in KL_ESTIMATORS:
            raise ValueError(f"callbacks.kl_control.estimator must be one of {sorted(KL_ESTIMATORS)}, "
                             f"got {estimator!r}")
        if measure != "seq_sum":
            raise ValueError(f"callbacks.kl_control.measure must be 'seq_sum', got {measure!r}")
        if init_kl_coef is not None and init_kl_coef < 0:
            raise ValueError(f"callbacks.kl_control.init_kl_coef must be >= 0 or None, got {init_kl_coef}")
        self.kind = controller
        self.init_kl_coef = init_kl_coef
        self.target, self.horizon, self.clip = float(target), float(horizon), float(clip)
        self.estimator, self.measure = estimator, measure
        self.controller: _ObservedController | None = None
        self._pending_state: dict | None = None

    @property
    def kl_name(self) -> str:
        """The logged name of the measured KL, e.g. ``kl/seq_sum_k1``."""
        return f"kl/{self.measure}_{self.estimator}"

    def build(self, init_kl_coef: float) -> _ObservedController:
        if self.kind == "fixed":
            return _ObservedController(FixedKLController(init_kl_coef), "fixed")
        return _ObservedController(AdaptiveKLController(init_kl_coef, self.target, self.horizon, self.clip),
                                   "adaptive")

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        config = getattr(pl_module, "config", None)
        module_estimator = getattr(config, "kl_estimator", self.estimator)
        if module_estimator != self.estimator:
            raise ValueError(f"callbacks.kl_control.estimator={self.estimator!r} but the rewards use "
                             f"ppo.kl_estimator={module_estimator!r}; set them equal")
        if self.controller is None:
            init = self.init_kl_coef if self.init_kl_coef is not None else getattr(config, "kl_coef", None)
            if init is None:
                raise ValueError("callbacks.kl_control.init_kl_coef is needed (the module has no config.kl_coef)")
            self.controller = self.build(init)
            if self._pending_state is not None:
                self.controller.load_state_dict(self._pending_state)
                self._pending_state = None
        pl_module.kl_controller = self.controller  # the module's update hook now drives this controller
        extra = (f", target {self.target} nats, horizon {self.horizon:g} samples, clip {self.clip}"
                 if self.kind == "adaptive" else "")
        rank_zero_info(f"KL control: {self.kind} beta={self.controller.value:.4g}{extra}; measured KL = mean "
                       f"per-sequence sum of {self.estimator} ({self.kl_name})")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        c = self.controller
        if c is None or c.last_kl is None:
            return
        stats = {"kl/beta_next": c.value, self.kl_name: c.last_kl}
        if c.kind == "adaptive":
            stats["kl/target"] = self.target
            stats["kl/error"] = c.last_error
        pl_module.log_dict(stats, batch_size=c.last_n_steps or 1)
        c.last_kl = None

    def state_dict(self) -> dict:
        if self.controller is None:
            return dict(self._pending_state or {})
        return self.controller.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        if self.controller is None:
            self._pending_state = dict(state_dict)
        else:
            self.controller.load_state_dict(state_dict)
