import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

VOCAB = 64


def _tiny(arch: str):
    torch.manual_seed(0)
    if arch == "llama":
        cfg = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
        cls = LlamaForCausalLM
    elif arch == "qwen2":
        cfg = Qwen2Config(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64
        )
        cls = Qwen2ForCausalLM
    elif arch == "gpt2":
        cfg = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64)
        cls = GPT2LMHeadModel
    elif arch == "gpt_neox":
        cfg = GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
        cls = GPTNeoXForCausalLM
    else:
        raise KeyError(arch)
    cfg.vocab_size = VOCAB
    cfg.bos_token_id = cfg.eos_token_id = cfg.pad_token_id = 1
    return cls(cfg)


ARCHS = ["llama", "qwen2", "gpt2", "gpt_neox"]


@pytest.fixture(params=ARCHS)
def tiny_model(request):
    return _tiny(request.param)


@pytest.fixture
def tiny_llama():
    return _tiny("llama")
