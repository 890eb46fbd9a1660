"""LoRA adapters for roles on one frozen base, the reference as "all adapters disabled", and export.

One base model serves several roles (see ``docs/architecture.md`` of the project): ``policy`` and ``value``
(and ``reward`` when the RM was trained as LoRA on the same base) are named peft adapters; the reference is
the same base under :func:`reference_mode`. The base weights are never trained when adapters are used.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: Every linear layer inside the transformer blocks, per ``config.model_type`` (the QLoRA paper's finding:
#: adapting all block linears matters more than the rank). Output and embedding layers are never adapted.
LORA_TARGET_MODULES: dict[str, list[str]] = {
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "mistral": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "qwen2": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "qwen3": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "gemma2": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "gpt2": ["c_attn", "c_proj", "c_fc"],
    "gpt_neox": ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"],
}


def lora_target_modules(model) -> list[str] | str:
    """LoRA target module names for ``model``'s architecture; peft's ``"all-linear"`` for others."""
    names = LORA_TARGET_MODULES.get(model.config.model_type)
    return list(names) if names is not None else "all-linear"


@dataclass
class LoraSpec:
    """Hyperparameters of one LoRA adapter."""

    r: int = 8
    """Rank of the update."""
    alpha: float = 16.0
    """Scale numerator: the update is ``(alpha / r) * B A`` (``alpha / sqrt(r)`` with ``rslora``)."""
    dropout: float = 0.0
    """Dropout on the adapter input (0 keeps rollouts and updates on the same function)."""
    target_modules: list[str] | None = None
    """Module names to adapt; None resolves them per architecture (:data:`LORA_TARGET_MODULES`)."""
    rslora: bool = False
    """Rank-stabilised scaling."""
    layers: int | list[int] | None = None
    """Which decoder layers get the adapter: None = all; ``n`` = the last ``n`` (backward then runs through those
    alone: on a CPU, LoRA on the last 8 of SmolLM2's 30 layers trains about twice as fast); a list = those
    indices."""

    def __post_init__(self):
        if self.r <= 0:
            raise ValueError(f"lora.r must be > 0, got {self.r}")
        if isinstance(self.layers, int) and self.layers <= 0 or isinstance(self.layers, list) and (
                not self.layers or any(not isinstance(i, int) or i < 0 for i in self.layers)):
            raise ValueError(f"lora.layers must be null, a count > 0 or a list of layer indices, got {self.layers}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")

    def to_peft(self, model):
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=self.target_modules or lora_target_modules(model),
            use_rslora=self.rslora,
            bias="none",
            layers_to_transform=self._layers(model),
        )

    def _layers(self, model) -> list[int] | None:
        if self.layers is None:
            return None
        n = model.config.num_hidden_layers
        layers = list(range(max(0, n - self.layers), n)) if isinstance(self.layers, int) else list(self.layers)
        if any(i >= n for i in layers):
            raise ValueError(f"lora.layers={self.layers}: the model has {n} layers (0 to {n - 1})")
        return layers


def is_quantised(model) -> bool:
    """Whether a transformers model (a peft model: its base) was loaded quantised (``model.quantization``)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return bool(getattr(base, "is_loaded_in_4bit", False) or getattr(base, "is_loaded_in_8bit", False))


def refuse_full_finetuning_if_quantised(model, key: str, hint: str) -> None:
    """Full fine-tuning of a quantised model (``model.quantization``) would train only its unquantised tensors
    (embeddings, norms, head) and report success: refused, naming ``key`` (null) and how to train LoRA instead."""
    if is_quantised(model):
        raise ValueError(f"{key} is null (full fine-tuning), but the model is loaded quantised (model.quantization): "
                         f"only its unquantised tensors would train. Train LoRA adapters on it: {hint}")


def add_adapters(model, adapters: dict[str, LoraSpec]):
    """Wrap ``model`` in a peft model with one named adapter per role (e.g. ``{"policy": LoraSpec()}``).

    The base weights are frozen. The first adapter is active; peft makes only the active adapter trainable
    (``set_adapter`` switches both).
    """
    from peft import PeftModel, get_peft_model, prepare_model_for_kbit_training

    if not adapters:
        raise ValueError("add_adapters needs at least one adapter")
    if isinstance(model, PeftModel):
        raise ValueError("model already has adapters: merge them first (see load_causal_lm)")
    if is_quantised(model):
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    names = list(adapters)
    peft_model = get_peft_model(model, adapters[names[0]].to_peft(model), adapter_name=names[0])
    for name in names[1:]:
        peft_model.add_adapter(name, adapters[name].to_peft(model))
    peft_model.set_adapter(names[0])
    return peft_model


def reference_mode(model):
    """Context in which ``model`` computes the reference: the base with every adapter disabled.

    A model without adapters (full fine-tuning) has no reference inside it; that is an error here, the
    caller then keeps a separate frozen copy.
    """
    if not hasattr(model, "disable_adapter"):
        raise TypeError("reference_mode needs a peft model; full fine-tuning needs a separate reference model")
    return model.disable_adapter()


def export_merged(model, out_dir: str | Path, tokenizer=None, adapter: str | None = None) -> Path:
    """Write merged weights with ``save_pretrained`` (loadable by plain transformers), tokenizer alongside.

    For a peft model, ``adapter`` (default: the active one) is merged into a **copy** of the base, so the
    live model keeps its adapters; a plain model is saved as is. A quantised model (QLoRA) is saved dequantised.
    """
    out_dir = Path(out_dir)
    if hasattr(model, "merge_and_unload") and is_quantised(model):
        merged = _merged_dequantised(model, adapter or model.active_adapter)
    elif hasattr(model, "merge_and_unload"):
        merged = copy.deepcopy(model)
        name = adapter or merged.active_adapter
        for other in list(merged.peft_config):
            if other != name:
                merged.delete_adapter(other)
        merged.set_adapter(name)
        merged = merged.merge_and_unload()
    elif is_quantised(model):
        merged = copy.deepcopy(model).dequantize()
    else:
        merged = model
    merged.save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return out_dir


def _merged_dequantised(model, adapter: str):
    """A quantised peft model (QLoRA) merged in full precision: the base dequantised to its compute dtype, then
    ``adapter`` added. peft's own merge into a 4-bit layer re-quantises the sum and rounds the LoRA delta away
    (4% of a toy RM's score), and a quantised checkpoint re-loaded with a quantization config cannot be saved
    again (transformers 5.24). The next stage quantises the saved weights on load, as this one did."""
    from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

    state = get_peft_model_state_dict(model, adapter_name=adapter)
    config = copy.deepcopy(model.peft_config[adapter])
    base = copy.deepcopy(model).unload().dequantize()  # the base alone, without any adapter, in full precision
    full = get_peft_model(base, config, adapter_name=adapter)
    set_peft_model_state_dict(full, state, adapter_name=adapter)
    return full.merge_and_unload()


def export_adapter(model, out_dir: str | Path, adapter: str, tokenizer=None) -> Path:
    """Write one adapter so that ``PeftModel.from_pretrained(base, out_dir)`` loads it directly.

    peft writes a named (non-``default``) adapter into ``out_dir/<name>/``; the files are moved up one level
    so the folder itself is the adapter.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        model.save_pretrained(tmp, selected_adapters=[adapter])
        src = Path(tmp) / adapter if (Path(tmp) / adapter).is_dir() else Path(tmp)
        for item in src.iterdir():
            if item.is_file():
                shutil.move(str(item), out_dir / item.name)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return out_dir


def load_adapter_weights(peft_model, folder: str | Path, adapter: str, key: str = "module.init_adapter") -> None:
    """Load the weights of a saved adapter (:func:`export_adapter`'s folder) into ``peft_model``'s adapter
    ``adapter`` (same rank and target modules), e.g. to continue a policy where a previous PPO stage left it.
    ``key``: the config key an error names."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    path = Path(folder) / "adapter_model.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"{key}={folder}: no adapter_model.safetensors there (expected an adapter folder, "
                                "e.g. a PPO stage's export/adapter)")
    try:
        result = set_peft_model_state_dict(peft_model, load_file(path), adapter_name=adapter)
    except RuntimeError as err:  # a size mismatch: another rank
        raise ValueError(f"{key}={folder} does not fit the `{adapter}` adapter: {err}") from err
    missing = [k for k in result.missing_keys if "lora_" in k and f".{adapter}." in k]
    if missing or result.unexpected_keys:
        raise ValueError(f"{key}={folder} does not fit the `{adapter}` adapter: {len(missing)} of its weights "
                         f"missing (e.g. {missing[:1]}), {len(result.unexpected_keys)} unexpected "
                         f"(e.g. {result.unexpected_keys[:1]}); it needs the same target modules and layers")

