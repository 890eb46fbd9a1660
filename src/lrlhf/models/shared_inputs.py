"""Model inputs for a prefix-shared batch (:mod:`lrlhf.data.shared_batches`): the 4-D attention mask in the form the
model's attention implementation takes.

transformers 5.x passes a 4-D ``attention_mask`` through its mask creation unchanged (``masking_utils``: "already
prepared, or custom"); ``sdpa`` takes it as a boolean mask (True = attend), ``eager`` adds it to its scores, so it
gets the additive float form. Flash-attention kernels take no arbitrary mask and flex attention wants a
``BlockMask``; a sliding window narrower than a shared row, or ALiBi biases, would not see the rows as the padded
layout does (:func:`sharing_blocker`): such a model runs shared batches unshared, with a warning.
"""

from __future__ import annotations

import warnings

import torch

from lrlhf.functional.prefix_sharing import additive_mask, shared_attention_mask

SHARED_ATTENTION = ("eager", "sdpa")
ALIBI_MODELS = ("bloom", "mpt")


def attention_implementation(model) -> str:
    """The model's attention implementation name (``config._attn_implementation``), through peft wrappers."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return str(getattr(base.config, "_attn_implementation", None) or "eager")


def _base_config(model):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.config


def sharing_blocker(model, width: int | None = None) -> str | None:
    """Why ``model`` cannot run a shared row of ``width`` columns as the padded rows would, or None.

    - an attention that takes no custom 4-D mask (flash attention, flex);
    - a sliding window narrower than the row: transformers hands the custom mask to sliding layers unchanged, so a
      shared row would attend further back than the window lets the padded rows;
    - ALiBi position biases (bloom, mpt, falcon's ``alibi``), which read column distances, not ``position_ids``.
    """
    implementation = attention_implementation(model)
    if implementation not in SHARED_ATTENTION:
        return f"the model's attention {implementation!r} takes no custom 4-D mask"
    config = _base_config(model)
    window = getattr(config, "sliding_window", None)
    if getattr(config, "use_sliding_window", True) and isinstance(window, int) and width is not None and width > window:
        return f"its sliding window ({window} tokens) is narrower than the shared row ({width})"
    if getattr(config, "alibi", False) or getattr(config, "model_type", "") in ALIBI_MODELS:
        return f"{config.model_type} positions are ALiBi biases over columns, not position_ids"
    return None


def can_share(model, width: int | None = None) -> bool:
    """Whether ``model`` runs a shared row of ``width`` columns exactly (:func:`sharing_blocker`); otherwise the
    modules run a shared batch unshared (:func:`lrlhf.data.shared_batches.unshare_batch`) with this warning."""
    blocker = sharing_blocker(model, width)
    if blocker is None:
        return True
    warnings.warn(f"prefix-shared batches run unshared: {blocker} (data.prefix_sharing=false avoids building "
                  "them)", stacklevel=2)
    return False


def shared_inputs(model, batch: dict) -> dict:
    """Keyword arguments for ``model`` (a causal LM or its decoder) on a shared batch: ``input_ids``,
    ``position_ids``, the 4-D ``attention_mask`` and ``use_cache=False``."""
    blocker = sharing_blocker(model, batch["input_ids"].shape[1])
    if blocker is not None:
        raise ValueError(f"prefix sharing cannot run this model: {blocker}; set data.prefix_sharing=false"
                         + (", or model.attn_implementation=sdpa" if "4-D mask" in blocker else ""))
    implementation = attention_implementation(model)
    mask = shared_attention_mask(batch["segment_ids"])
    if implementation == "eager":
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        mask = additive_mask(mask, dtype)
    return {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"], "attention_mask": mask,
            "use_cache": False}


__all__ = [
    "ALIBI_MODELS", "SHARED_ATTENTION", "attention_implementation", "can_share", "shared_inputs", "sharing_blocker",
]
