"""Scalar heads on a causal LM's hidden states: a reward (one per sequence) or a value (one per position)."""

from __future__ import annotations

import contextlib
import math

import torch
from torch import Tensor, nn


def last_token_index(attention_mask: Tensor) -> Tensor:
    """``(B,)`` index of the last attended position of each row; works for left and right padding."""
    mask = attention_mask.bool()
    if not mask.any(dim=1).all():
        raise ValueError("last_token_index: a row has no attended token")
    return mask.shape[1] - 1 - mask.flip(dims=[1]).int().argmax(dim=1)


class ScalarHead(nn.Module):
    """``Linear(hidden, 1)`` in fp32.

    Init: weight ~ N(0, 1 / (hidden + 1)), bias 0, as in Stiennon et al. (2020) for the reward head, so the
    initial scalar has unit-order variance whatever the width; ``zero_init`` (used for a value head) starts
    every value at 0 so the first advantages are just the returns.
    """

    def __init__(self, hidden_size: int, zero_init: bool = False):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        if zero_init:
            nn.init.zeros_(self.linear.weight)
        else:
            nn.init.normal_(self.linear.weight, std=1.0 / math.sqrt(hidden_size + 1))
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        """``(..., H)`` -> ``(...)``."""
        return self.linear(hidden.to(self.linear.weight.dtype)).squeeze(-1)


def decoder(model):
    """The transformer body of a causal LM (no LM head), through any peft wrapper."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, base.base_model_prefix)


@contextlib.contextmanager
def capture_trunk_output(model):
    """Within the block, every forward of ``model``'s transformer body (:func:`decoder`) stores its last hidden
    states ``(B, T, H)`` (after the final norm: what the LM head reads) in the yielded dict under ``"hidden"``,
    so a causal-LM forward also serves a scalar head without a second trunk pass."""
    store: dict = {}

    def hook(module, args, output):
        store["hidden"] = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]

    handle = decoder(model).register_forward_hook(hook)
    try:
        yield store
    finally:
        handle.remove()


class ScalarModel(nn.Module):
    """A causal LM body plus a :class:`ScalarHead`: a reward model or a value model.

    The LM head is never run (the vocabulary projection is the costliest layer of a small model), and with
    a peft ``backbone`` whichever adapter is active is applied.
    """

    def __init__(self, backbone, zero_init: bool = False):
        super().__init__()
        self.backbone = backbone
        self.head = ScalarHead(backbone.config.hidden_size, zero_init=zero_init)
        # The LM head is never run: freeze it (unless tied to the input embeddings), so no optimiser holds it
        # and DDP does not wait for a gradient it never gets ("parameters that were not used in producing
        # the loss").
        lm_head, embeddings = backbone.get_output_embeddings(), backbone.get_input_embeddings()
        if lm_head is not None and not any(p is embeddings.weight for p in lm_head.parameters()):
            lm_head.requires_grad_(False)

    def hidden_states(self, input_ids: Tensor, attention_mask: Tensor, **kwargs) -> Tensor:
        """``(B, T, H)`` last hidden states.

        Position ids are derived from the attention mask unless given, so left- and right-padded rows get
        the same positions as unpadded ones (transformers would otherwise count pads on the left). No KV cache
        is built unless ``use_cache`` is given (a scoring forward never reuses one; Llama-style models would
        otherwise allocate a ``DynamicCache`` on every call, training included).
        """
        if "position_ids" not in kwargs:
            kwargs["position_ids"] = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        kwargs.setdefault("use_cache", False)
        out = decoder(self.backbone)(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        return out.last_hidden_state

    def forward(self, input_ids: Tensor, attention_mask: Tensor, **kwargs) -> Tensor:
        """``(B, T)`` a scalar at every position (values)."""
        return self.head(self.hidden_states(input_ids, attention_mask, **kwargs))

    def score(self, input_ids: Tensor, attention_mask: Tensor, **kwargs) -> Tensor:
        """``(B,)`` the scalar at each row's last attended token (rewards)."""
        hidden = self.hidden_states(input_ids, attention_mask, **kwargs)
        last = last_token_index(attention_mask)
        return self.head(hidden[torch.arange(hidden.shape[0], device=hidden.device), last])


class AdapterScalarModel(ScalarModel):
    """A scalar head read through one named adapter of a *shared* peft model (e.g. a ``reward`` LoRA on the
    policy's base: one copy of the base weights serves policy, reference, value and reward).

    The peft model is referenced, not registered as a submodule, so the owner's ``state_dict`` and optimiser
    see it once; only the head is this module's own. Each call activates ``adapter`` and restores the
    previously active adapter afterwards; ``adapter``'s weights never require grad.
    """

    def __init__(self, peft_model, adapter: str, head: ScalarHead):
        nn.Module.__init__(self)
        if adapter not in getattr(peft_model, "peft_config", {}):
            raise ValueError(f"the model has no adapter {adapter!r} (it has {sorted(peft_model.peft_config)})")
        object.__setattr__(self, "backbone", peft_model)  # not a submodule: the owner registers it
        self.adapter = adapter
        self.head = head

    def hidden_states(self, input_ids: Tensor, attention_mask: Tensor, **kwargs) -> Tensor:
        model = self.backbone
        previous = model.active_adapter
        model.set_adapter(self.adapter)
        try:
            return super().hidden_states(input_ids, attention_mask, **kwargs)
        finally:
            model.set_adapter(previous)
            for name, param in model.named_parameters():
                if f".{self.adapter}." in name:
                    param.requires_grad_(False)
