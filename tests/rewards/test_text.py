"""The one text scorer of a reward source (lrlhf.rewards.text): a reward model's score of a (prompt, response)
through it is the score RM training gives the same pair (the chat template's rendering of the chosen side), on the
toy tokenizer and on a real chat template; rules rank texts through it too."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from lrlhf.data.collate import collate_pairs
from lrlhf.data.records import PreferencePair, PromptExample
from lrlhf.data.tokenize import encode_pair
from lrlhf.models import ModelConfig, ScalarModel, load_tokenizer
from lrlhf.rewards.text import reward_model_scorer

PROMPTS = [PromptExample([{"role": "user", "content": "Name three fruits."}]),
           PromptExample([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}])]
RESPONSES = ["Apple, pear\nand plum.", "4"]


def _training_scores(model, tokenizer, prompts, responses):
    """What RM training scores: the chosen side of a preference pair, through the training data path."""
    pairs = [encode_pair(tokenizer, PreferencePair(p.prompt, [{"role": "assistant", "content": r}],
                                                   [{"role": "assistant", "content": "x"}]), max_length=1024)
             for p, r in zip(prompts, responses, strict=True)]
    batch = collate_pairs(pairs, tokenizer.pad_token_id)
    with torch.no_grad():
        return model.score(batch["input_ids"], batch["attention_mask"])[:len(prompts)].tolist()


def test_a_reward_model_scores_a_text_as_rm_training_rendered_it_on_a_real_chat_template(tiny_real_model):
    tokenizer = load_tokenizer(ModelConfig(str(tiny_real_model)))
    torch.manual_seed(0)
    model = ScalarModel(AutoModelForCausalLM.from_pretrained(tiny_real_model)).eval()
    with torch.no_grad():
        model.head.linear.weight.normal_()  # reads every hidden unit: a rendering's difference shows
    expected = _training_scores(model, tokenizer, PROMPTS, RESPONSES)
    got = reward_model_scorer(model, tokenizer, batch_size=1)(PROMPTS, RESPONSES)
    assert got == pytest.approx(expected, abs=1e-5)


def test_a_gguf_tokenizer_ends_turns_where_its_file_says(smollm2_config):
    """transformers 5.0 (the floor) read SmolLM2's EOS from the GGUF as <|im_start|>: responses would not stop at
    the turn's end, nor a reward model read its score there; the file's own ids are applied (model_source)."""
    from transformers import AutoConfig

    from lrlhf.utils.model_source import dequantised_folder

    tokenizer = load_tokenizer(smollm2_config)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2 and tokenizer.bos_token_id == 1
    assert AutoConfig.from_pretrained(dequantised_folder(smollm2_config)).eos_token_id == 2
