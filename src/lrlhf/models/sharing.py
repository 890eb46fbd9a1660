"""Model inputs for a prefix-shared batch (:mod:`lrlhf.data.sharing`): the 4-D attention mask in the form the
model's attention implementation takes.

transformers 5.x passes a 4-D ``attention_mask`` through its mask creation unchanged (``masking_utils``: "already
prepared, or custom"); ``sdpa`` takes it as a boolean mask (True = attend), ``eager`` adds it to its scores, so it
gets the additive float form. Flash-attention kernels take no arbitrary mask and flex attention wants a
``BlockMask``: a model using them is refused with the config key that turns sharing off.
"""

from __future__ import annotations

import warnings

import torch

from lrlhf.functional.sharing import additive_mask, shared_attention_mask

SHARED_ATTENTION = ("eager", "sdpa")


def attention_implementation(model) -> str:
    """The model's attention implementation name (``config._attn_implementation``), through peft wrappers."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return str(getattr(base.config, "_attn_implementation", None) or "eager")


def can_share(model) -> bool:
    """Whether ``model``'s attention takes the shared layout's 4-D mask (else the modules run a shared batch
    unshared, :func:`lrlhf.data.sharing.unshare_batch`, with this warning)."""
    implementation = attention_implementation(model)
    if implementation in SHARED_ATTENTION:
        return True
    warnings.warn(f"prefix-shared batches run unshared: the model's attention {implementation!r} takes no custom "
                  "4-D mask (data.prefix_sharing=false avoids building them)", stacklevel=2)
    return False


def shared_inputs(model, batch: dict) -> dict:
    """Keyword arguments for ``model`` (a causal LM or its decoder) on a shared batch: ``input_ids``,
    ``position_ids``, the 4-D ``attention_mask`` and ``use_cache=False``."""
    implementation = attention_implementation(model)
    if implementation not in SHARED_ATTENTION:
        raise ValueError(
            f"prefix sharing needs attention 'eager' or 'sdpa' (a custom 4-D mask); this model uses "
            f"{implementation!r}: set data.prefix_sharing=false, or model.attn_implementation=sdpa"
        )
    mask = shared_attention_mask(batch["segment_ids"])
    if implementation == "eager":
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        mask = additive_mask(mask, dtype)
    return {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"], "attention_mask": mask,
            "use_cache": False}


__all__ = ["SHARED_ATTENTION", "attention_implementation", "can_share", "shared_inputs"]
