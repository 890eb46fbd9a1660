"""Word-level test tokenizers built in code, with two chat templates.

Word-level + whitespace splitting makes token spans computable by hand: every word, punctuation run and
special token is one token; newlines vanish.
"""

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
WORDS = (
    "system user assistant User Assistant : you are kind hi hello how what is two plus three five four "
    "fine thanks bye ok sure a b c d e f g h"
).split()

# ChatML: the assistant turn ends with <|im_end|>, which is the EOS token.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Plain: no EOS at the end of an assistant turn, so the encoder must append one.
PLAIN = (
    "<s>{% for m in messages %}{% if m['role'] == 'user' %}User : {{ m['content'] }}\n"
    "{% elif m['role'] == 'assistant' %}Assistant : {{ m['content'] }}\n"
    "{% else %}{{ m['content'] }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}Assistant :{% endif %}"
)


def make_tokenizer(template: str, eos: str) -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token=eos,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    tok.chat_template = template
    return tok


@pytest.fixture(scope="session")
def chatml():
    return make_tokenizer(CHATML, eos="<|im_end|>")


@pytest.fixture(scope="session")
def plain():
    return make_tokenizer(PLAIN, eos="</s>")


def ids(tok, words: str) -> list[int]:
    """Token ids of a space-separated string of vocabulary entries (the hand-computed expectation)."""
    return tok.convert_tokens_to_ids(words.split())
