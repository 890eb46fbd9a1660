"""The frozen reward artefact: what :meth:`lrlhf.modules.RewardModule.export` writes and PPO / the evaluation read.

A reward-model folder holds the merged backbone (a transformers checkpoint), the head (``reward_head.safetensors``),
the tokenizer, the calibration (``reward_calibration.json``, :class:`RewardCalibration`) and, for a LoRA reward
model, its adapter alone in ``adapter/``. :func:`load_reward_model` reads it as a stand-alone
:class:`~lrlhf.models.ScalarModel`; :func:`attach_reward_adapter` puts the ``reward`` adapter and head on the
policy's own base instead of a second copy of the weights. Training lives in :mod:`lrlhf.modules.rm`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from torch import Tensor

from lrlhf.models.heads import AdapterScalarModel, ScalarHead, ScalarModel
from lrlhf.models.loading import ModelConfig, load_causal_lm

CALIBRATION_FILE = "reward_calibration.json"
HEAD_FILE = "reward_head.safetensors"
ADAPTER_NAME = "reward"
ADAPTER_DIR = "adapter"


@dataclass
class RewardCalibration:
    """Frozen affine normalisation of a reward model's scores: ``(r - mean) / std``.

    Measured once after training on reference completions (a held-out set, or the SFT policy's outputs)
    and kept fixed during PPO, so the reward scale does not move with the policy.
    """

    mean: float
    """Mean reward on the reference completions."""
    std: float
    """Standard deviation (unbiased) of the reward on the reference completions."""
    count: int
    """Number of completions measured."""
    reference: str = ""
    """What the reference completions were (free text)."""

    def normalise(self, rewards: Tensor) -> Tensor:
        return (rewards - self.mean) / self.std

    def save(self, out_dir: str | Path) -> Path:
        from lrlhf.utils.io import atomic_write_text

        path = Path(out_dir) / CALIBRATION_FILE
        atomic_write_text(path, json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> RewardCalibration:
        """From ``reward_calibration.json`` or the folder holding it."""
        path = Path(path)
        if path.is_dir():
            path = path / CALIBRATION_FILE
        return cls(**json.loads(path.read_text()))


def load_calibration(path: str | Path) -> RewardCalibration:
    """:meth:`RewardCalibration.load`."""
    return RewardCalibration.load(path)


def load_reward_model(out_dir: str | Path, dtype: str = "float32") -> ScalarModel:
    """A :class:`ScalarModel` in eval mode from :meth:`RewardModule.export`'s folder; from an ensemble's folder
    (``recipe=rm_ensemble``), its :class:`~lrlhf.models.ensemble.RewardEnsembleModel` with its default rule."""
    from safetensors.torch import load_file

    from lrlhf.models.ensemble import is_ensemble, load_reward_ensemble

    out_dir = Path(out_dir)
    if is_ensemble(out_dir):
        return load_reward_ensemble(out_dir, dtype=dtype)
    backbone = load_causal_lm(ModelConfig(str(out_dir), dtype=dtype))
    model = ScalarModel(backbone)
    model.head.load_state_dict(load_file(out_dir / HEAD_FILE))
    return model.eval()


def attach_reward_adapter(peft_model, out_dir: str | Path) -> AdapterScalarModel:
    """Load the ``reward`` adapter and head of a LoRA :meth:`RewardModule.export` onto ``peft_model``.

    The reward adapter was trained on a base; it means something only on that same base. The base recorded
    in the adapter is compared with ``peft_model``'s and a mismatch is refused, naming both.
    """
    from safetensors.torch import load_file

    out_dir = Path(out_dir)
    adapter_dir = out_dir / ADAPTER_DIR
    if not (adapter_dir / "adapter_config.json").is_file():
        raise FileNotFoundError(f"{adapter_dir}: no reward adapter (export a RewardModule trained with LoRA)")
    trained_on = json.loads((adapter_dir / "adapter_config.json").read_text()).get("base_model_name_or_path")
    base = getattr(peft_model.get_base_model().config, "_name_or_path", None)
    if trained_on and base and Path(str(trained_on)).resolve() != Path(str(base)).resolve():
        raise ValueError(f"{adapter_dir}: the reward adapter was trained on base {trained_on!r}, "
                         f"but the policy's base is {base!r}")
    from lrlhf.utils.compat import load_frozen_adapter

    load_frozen_adapter(peft_model, str(adapter_dir), ADAPTER_NAME)  # the policy's adapters stay trainable
    head = ScalarHead(peft_model.get_base_model().config.hidden_size)
    head.load_state_dict(load_file(out_dir / HEAD_FILE))
    return AdapterScalarModel(peft_model, ADAPTER_NAME, head.requires_grad_(False)).eval()


__all__ = [
    "ADAPTER_DIR",
    "ADAPTER_NAME",
    "CALIBRATION_FILE",
    "HEAD_FILE",
    "RewardCalibration",
    "attach_reward_adapter",
    "load_calibration",
    "load_reward_model",
]
