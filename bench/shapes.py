"""The model shapes of the benchmarks and how a random model of one is built: a Llama of the shape (random weights,
nothing downloaded) and a word-level chat tokenizer over its ids, and chat prompts of random words."""

from __future__ import annotations

from pathlib import Path

import torch

PAD, EOS, USER, ASSISTANT = 0, 1, 2, 3
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|> ' + m['content'] + ' ' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
REFERENCE = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                 intermediate_size=1024, vocab_size=8000, tie_word_embeddings=False)
SMOLLM2 = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
               intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True)
QWEN05 = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
              intermediate_size=4864, vocab_size=32000, tie_word_embeddings=True)  # Qwen2.5-0.5B body, 32k vocab
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=512, tie_word_embeddings=True)  # dry runs (bench/gpu_check.sh)
#: Llama-3.1-8B's body (bench/ppo_at_scale.py builds it on the device in bf16; random weights, nothing downloaded)
LLAMA8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False)
SHAPES = {"reference": REFERENCE, "qwen05": QWEN05, "tiny": TINY, "llama8b": LLAMA8B}


def llama_config(shape: dict, max_positions: int = 1024):
    from transformers import LlamaConfig

    return LlamaConfig(**shape, max_position_embeddings=max_positions, pad_token_id=PAD, eos_token_id=EOS,
                       bos_token_id=None)


def build_model(out: Path, shape: dict, seed: int) -> None:
    """A random Llama of ``shape`` (fp32, saved to ``out``) and its tokenizer (:func:`build_tokenizer`)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    LlamaForCausalLM(llama_config(shape)).save_pretrained(out)
    build_tokenizer(out, shape["vocab_size"])


def build_tokenizer(out: Path, vocab_size: int) -> None:
    """A word-level chat tokenizer over ``vocab_size`` ids (``t<i>`` words), saved to ``out``."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "</s>": EOS, "<|user|>": USER, "<|assistant|>": ASSISTANT,
             **{f"t{i}": i for i in range(4, vocab_size)}}
    backend = Tokenizer(WordLevel(vocab, unk_token="t4"))
    backend.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>",
                                        additional_special_tokens=["<|user|>", "<|assistant|>"])
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    tokenizer.save_pretrained(out)


def make_prompts(n: int, vocab: int, seed: int, tokens: tuple[int, int] = (10, 40)) -> list[list[dict]]:
    """``n`` one-turn conversations whose chat-templated encoding is ``tokens`` long, 10-40 by default (user tag +
    words + tag)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        words = int(torch.randint(tokens[0] - 2, tokens[1] - 1, (1,), generator=g))
        ids = torch.randint(4, vocab, (words,), generator=g).tolist()
        out.append([{"role": "user", "content": " ".join(f"t{i}" for i in ids)}])
    return out


__all__ = ["LLAMA8B", "SHAPES", "build_model", "build_tokenizer", "llama_config", "make_prompts"]
