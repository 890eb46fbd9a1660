"""Models: load backbones (hub id / local path / GGUF / 4-bit or 8-bit), LoRA adapters for roles, scalar heads."""

from lrlhf.models.heads import AdapterScalarModel, ScalarHead, ScalarModel, last_token_index
from lrlhf.models.loading import ModelConfig, load_causal_lm, load_tokenizer
from lrlhf.models.lora import (
    LORA_TARGET_MODULES,
    LoraSpec,
    add_adapters,
    export_adapter,
    export_merged,
    lora_target_modules,
    reference_mode,
)

__all__ = [
    "AdapterScalarModel",
    "LORA_TARGET_MODULES",
    "LoraSpec",
    "ModelConfig",
    "ScalarHead",
    "ScalarModel",
    "add_adapters",
    "export_adapter",
    "export_merged",
    "last_token_index",
    "load_causal_lm",
    "load_tokenizer",
    "lora_target_modules",
    "reference_mode",
]
