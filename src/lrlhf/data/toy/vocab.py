"""The toy world's word-level vocabulary and chat template, built by code into a ``PreTrainedTokenizerFast``.

Every word the world writes (prompt words, numbers, items, filler) is in the vocabulary, so nothing the world
produces maps to ``<unk>``. The pre-tokenizer splits on whitespace only, so a text's tokens are exactly
``text.split()`` plus the special tokens the chat template inserts; :mod:`.utility` counts length the
same way.

Chat template (ChatML-like, every turn closed by the end-of-turn token, which is also the EOS)::

    <bos><|user|> sort these numbers : 5 3 8 <|end|><|assistant|> 3 5 8 <|end|>

With ``add_generation_prompt=True`` a prompt ends with ``<|assistant|>``, and the token ids of a prompt
rendered that way are a prefix of the ids of the same prompt followed by its assistant turn (tested).
"""

from __future__ import annotations

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<|end|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD, UNK, BOS, EOS, *ROLE_TOKENS)

# Numbers 0..20: digits for sort, counts and plausible wrong counts.
NUMBERS = tuple(str(i) for i in range(21))
# Items to count.
ITEMS = (
    "apple", "pear", "fig", "plum", "lime", "kiwi", "cat", "dog",
    "cow", "hen", "fox", "owl", "bee", "ant", "rat", "pig",
)  # fmt: skip
# Words of the prompt templates.
PROMPT_WORDS = ("sort", "these", "numbers", "how", "many", "items", ":")
# Filler an assistant can wrap around an answer; the gold utility charges for every word of it.
FILLER_WORDS = (
    "sure", "here", "is", "the", "answer", "i", "think", "hope", "this", "helps", "well", "so", "ok",
    "let", "me", "see", "great", "question", "really", "very", "good", "done", "thanks", "for",
    "asking", "of", "course", "result", "it", "that", "a", "and", "you", "my", "list", "count", "know",
)  # fmt: skip

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|> {{ message['content'] }} {{ eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def vocabulary() -> dict[str, int]:
    """Token -> id, specials first (``<pad>`` = 0), then the words in a fixed order, no duplicates."""
    tokens: list[str] = []
    for token in (*SPECIAL_TOKENS, *NUMBERS, *ITEMS, *PROMPT_WORDS, *FILLER_WORDS):
        if token not in tokens:
            tokens.append(token)
    return {token: i for i, token in enumerate(tokens)}


def build_tokenizer(model_max_length: int = 128):
    """A ``PreTrainedTokenizerFast`` over :func:`vocabulary` with the chat template; no network, no files."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(vocab=vocabulary(), unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )
