"""The toy world's tiny Llama-architecture model, built from a config with a seeded random init."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of the tiny Llama. Defaults: the calibration run's fastest model (docs/architecture.md)."""

    hidden_size: int = 64
    """Width of the residual stream (64-128 keeps CPU steps fast)."""
    num_layers: int = 2
    """Decoder layers (2-4)."""
    num_heads: int = 4
    """Attention heads; must divide hidden_size."""
    intermediate_size: int = 256
    """Width of the MLP."""
    max_position_embeddings: int = 128
    """Longest prompt + response, in tokens (prompts are <= 20 tokens, responses are cut well before)."""

    def __post_init__(self):
        if self.hidden_size <= 0 or self.hidden_size % max(self.num_heads, 1):
            raise ValueError(f"hidden_size must be a positive multiple of num_heads={self.num_heads}, "
                             f"got {self.hidden_size}")
        for name in ("num_layers", "num_heads", "intermediate_size", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


def llama_config(cfg: TinyModelConfig, tokenizer):
    """A ``LlamaConfig`` for ``cfg`` whose vocabulary and special ids match ``tokenizer``."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )


def build_model(cfg: TinyModelConfig, tokenizer, seed: int):
    """A randomly initialised ``LlamaForCausalLM`` (float32, eval mode); the init depends only on ``seed``
    (the global torch RNG is forked, so callers' RNG state is left as it was)."""
    import torch
    from transformers import LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(llama_config(cfg, tokenizer))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()
