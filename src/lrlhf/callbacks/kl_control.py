"""The KL controller moved into the module: ``module.kl_controller`` (:class:`~lrlhf.functional.KLController`, by
``_target_``; ``module/kl_controller=adaptive|fixed``) is owned, driven, logged and checkpointed by
:class:`~lrlhf.modules.PPOModule`. :class:`KLControlCallback` remains only to say so to a config that still names it,
until lrlhf 0.2.0, which removes this file (and ``lrlhf.run.cli``'s refusal of ``callbacks.kl_control.*``).
"""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback

MOVED = ("callbacks.kl_control is gone: the KL controller is module.kl_controller, built by _target_ "
         "(module/kl_controller=adaptive|fixed): its beta module.kl_controller.kl_coef (was init_kl_coef / "
         "module.config.kl_coef), the adaptive target and horizon module.kl_controller.target / .horizon; the module "
         "logs kl/beta_next, kl/seq_sum_<estimator>, kl/target and kl/error and checkpoints beta")


class KLControlCallback(Callback):
    """Refuses to be built, naming the keys that replaced it (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        raise ValueError(MOVED)


__all__ = ["KLControlCallback"]
