"""What a training stage leaves behind: the one contract between a LightningModule and the CLI.

After ``trainer.fit`` the CLI (``lrlhf.cli.finish_stage``) does the same for every module, with no table per
algorithm:

1. ``summary = module.stage_summary(trainer, out_dir)`` on every rank: the figures of training (by default the
   ``summary_metrics`` the module logged);
2. ``summary |= callback.stage_summary(trainer, module)`` for every callback that has the method (early stopping
   restores the checkpoint it chose and says which; a collective under a sharded strategy);
3. on global rank 0 alone, with the module whole (gathered when sharded): ``summary |= module.finish(datamodule,
   out_dir, trained)`` (held-out evaluations that need the data: the reward model's test metrics and
   calibration), then ``module.export_stage(folder)`` writes the stage's files into a fresh folder that is moved
   into ``out_dir`` by rename and returns ``{"export": <the model to load next>, "adapter": <its adapter or
   None>}``;
4. a module whose ``policy_name`` is set is a policy: with an ``eval`` block in the config its held-out gold
   utility is compared with the SFT model's, reported as ``gold/<policy_name>``.

A subclass changes what its stage leaves behind by overriding these methods, not the CLI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.utilities.model_helpers import is_overridden


def logged(trainer, key: str) -> float | None:
    """``trainer.callback_metrics[key]`` as a float (None when it was not logged)."""
    value = trainer.callback_metrics.get(key)
    return None if value is None else float(value)


class StageOutputs:
    """Mixed into every LightningModule the CLI trains (see the module docstring)."""

    #: A policy compared with the SFT model when the config has an ``eval`` block (e.g. ``"ppo"``); None otherwise.
    policy_name: str | None = None
    #: ``trainer.callback_metrics`` keys copied into ``summary.json`` by the default :meth:`stage_summary`.
    summary_metrics: tuple[str, ...] = ()

    def stage_summary(self, trainer, out_dir: Path) -> dict[str, Any]:
        """The figures of training (every rank calls it, before the export). A ``val/`` figure no validation
        produced (a run shorter than ``trainer.val_check_interval``) comes from one validation of the final model,
        and ``validated_at_end`` says so (one process; a launch of several says why it is null, ``validation``)."""
        summary = {key: logged(trainer, key) for key in self.summary_metrics}
        missing = [key for key, value in summary.items() if key.startswith("val/") and value is None]
        if not missing or trainer.datamodule is None or not is_overridden("validation_step", self):
            return summary
        if trainer.world_size > 1:  # a sharded module is not validated outside fit here: say why it is null
            summary["validation"] = (f"none ran: the run ({trainer.global_step} steps) was shorter than "
                                     f"trainer.val_check_interval ({trainer.val_check_interval})")
            return summary
        trainer.validate(self, datamodule=trainer.datamodule, verbose=False)
        summary.update({key: logged(trainer, key) for key in missing})
        summary["validated_at_end"] = True
        return summary

    def finish(self, datamodule, out_dir: Path, trained) -> dict[str, Any]:
        """Evaluations after training that need the data (global rank 0, on the whole module; ``trained`` is the
        module that trained, which differs from ``self`` under a sharded strategy)."""
        return {}

    def export_stage(self, folder: Path) -> dict[str, Path | None]:
        """Write the stage's files into ``folder``; ``{"export": <model folder>, "adapter": <folder or None>}``."""
        raise NotImplementedError(f"{type(self).__name__} does not say what its stage exports (export_stage)")
