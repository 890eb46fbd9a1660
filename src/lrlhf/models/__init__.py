"""Models: load backbones (hub id / local path / GGUF / 4-bit or 8-bit), LoRA adapters for roles, scalar heads, and
the frozen reward artefact (a trained reward model's folder, its calibration)."""

from lrlhf.models.ensemble import RewardEnsembleModel, load_reward_ensemble, write_ensemble
from lrlhf.models.heads import AdapterScalarModel, ScalarHead, ScalarModel, last_token_index
from lrlhf.models.loading import ModelConfig, load_causal_lm, load_tokenizer
from lrlhf.models.lora import (
    LORA_TARGET_MODULES,
    LoraSpec,
    add_adapters,
    export_adapter,
    export_merged,
    load_adapter_weights,
    lora_target_modules,
    reference_mode,
)
from lrlhf.models.reward import RewardCalibration, attach_reward_adapter, load_calibration, load_reward_model

__all__ = [
    "AdapterScalarModel",
    "LORA_TARGET_MODULES",
    "LoraSpec",
    "ModelConfig",
    "RewardCalibration",
    "RewardEnsembleModel",
    "ScalarHead",
    "ScalarModel",
    "add_adapters",
    "attach_reward_adapter",
    "export_adapter",
    "export_merged",
    "last_token_index",
    "load_adapter_weights",
    "load_calibration",
    "load_causal_lm",
    "load_reward_ensemble",
    "load_reward_model",
    "load_tokenizer",
    "lora_target_modules",
    "reference_mode",
    "write_ensemble",
]
