"""Lightning's ``WandbLogger`` as ``logger=wandb`` builds it (``configs/logger/wandb.yaml``).

Lightning always passes ``anonymous=None`` to ``wandb.init``, and recent wandb (0.31 here) warns for any value of
that setting: ``wandb: WARNING The anonymous setting has no effect and will be removed``, on every run. The
argument is left out unless a user asks for anonymous logging (which older wandb, down to the floor, still reads).
"""

from __future__ import annotations

from lightning.pytorch.loggers import WandbLogger as _LightningWandbLogger


class WandbLogger(_LightningWandbLogger):
    """:class:`lightning.pytorch.loggers.WandbLogger` without the ``anonymous`` argument it does not need."""

    def __init__(self, *args, anonymous: bool | None = None, **kwargs):
        super().__init__(*args, anonymous=anonymous, **kwargs)
        if not anonymous:
            self._wandb_init.pop("anonymous", None)


__all__ = ["WandbLogger"]
