"""Loading causal LMs and tokenizers: hub id or local path, GGUF files, 4-bit / 8-bit quantisation.

Where a name points and its checks (:class:`ModelSourceError`) are :mod:`lrlhf.utils.model_source`'s, shared with
the one tokenizer loader, :func:`load_tokenizer` (defined there, re-exported here).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lrlhf.utils.model_source import (
    FOLDER_NEEDS,
    KEY,
    TOKENIZER_FILES,
    ModelSourceError,
    check_model_source,
    load_tokenizer,
    plain_source,
    resolve_sources,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
QUANTIZATIONS = (None, "4bit", "8bit")


@dataclass
class ModelConfig:
    """Where a causal LM comes from and how to load it."""

    name_or_path: str
    """A hub id (where the network allows) or a local folder written by ``save_pretrained``. A folder
    holding a peft adapter (``adapter_config.json``) is loaded onto its base and merged (see
    :func:`load_causal_lm`). Anything that exists on disk, is absolute, starts with ``.`` or ``~``, is not a
    valid hub id, or has a parent folder that exists is a folder, and a missing one is an error (checked when
    loading: a needed stage writes its folder later)."""
    gguf_file: str | None = None
    """File name of a GGUF checkpoint inside ``name_or_path``: dequantised once into a plain transformers folder
    cached under ``<paths.cache_dir>/models/`` (:func:`lrlhf.utils.model_source.dequantised_folder`), which is
    then loaded in ``dtype`` (and quantised by ``quantization`` if set) and saves like any other model."""
    dtype: str = "float32"
    """Weights dtype: one of ``float32``, ``bfloat16``, ``float16``."""
    attn_implementation: str | None = None
    """``eager``, ``sdpa``, ``flash_attention_2``...; None lets transformers choose."""
    quantization: str | None = None
    """None, ``4bit`` (NF4, double quantisation; QLoRA) or ``8bit``, through bitsandbytes."""
    trust_remote_code: bool = False
    """Run code shipped with the checkpoint. Off unless you trust its source."""
    revision: str | None = None
    """Hub revision (branch, tag or commit)."""

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype={self.dtype!r} is not supported; choose one of {sorted(DTYPES)}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"model.quantization={self.quantization!r}; choose one of {QUANTIZATIONS}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


def _quantization_config(cfg: ModelConfig):
    from transformers import BitsAndBytesConfig

    if cfg.quantization == "4bit":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=cfg.torch_dtype,
        )
    return BitsAndBytesConfig(load_in_8bit=True)


def load_causal_lm(cfg: ModelConfig):
    """Load a causal LM in training mode.

    If ``cfg.name_or_path`` is a LoRA adapter folder, its base is loaded and the adapter **merged**: the
    PPO reference is "the base with every adapter disabled", so an SFT model that is still an adapter would
    otherwise vanish from the reference (TRL #495) and the KL would be measured against the pre-SFT model.
    """
    from transformers import AutoModelForCausalLM

    cfg = plain_source(cfg)
    own, base = resolve_sources(cfg)
    kwargs = dict(
        dtype=cfg.torch_dtype,
        trust_remote_code=cfg.trust_remote_code,
        revision=cfg.revision,
    )
    if cfg.attn_implementation:
        kwargs["attn_implementation"] = cfg.attn_implementation
    if cfg.quantization:
        if base is not None:
            raise ValueError("a LoRA adapter as the starting model must be merged in full precision first")
        kwargs["quantization_config"] = _quantization_config(cfg)
    source = base or own
    try:
        model = AutoModelForCausalLM.from_pretrained(source.path, **kwargs)
    except OSError as err:  # missing files, or a hub id not reachable
        raise source.error("model", err) from err
    if base is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, own.path).merge_and_unload()
    model.train()  # transformers returns eval mode
    return model


__all__ = [
    "DTYPES", "FOLDER_NEEDS", "KEY", "QUANTIZATIONS", "TOKENIZER_FILES", "ModelConfig", "ModelSourceError",
    "check_model_source", "load_causal_lm", "load_tokenizer",
]
