"""sample_gold_utility: new tokens only, cut at EOS, plain sampling kwargs, per-kind means, determinism."""

import math

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from lrlhf.data.formats import load_records
from lrlhf.data.toy import WorldSizes, build_world
from lrlhf.eval import sample_gold_utility


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    sizes = WorldSizes(sft_train=2, sft_val=2, pref_train=2, pref_val=2, pref_test=2, rl=2, eval=6)
    return build_world(tmp_path_factory.mktemp("toy"), seed=0, sizes=sizes)


@pytest.fixture(scope="module")
def tokenizer(world):
    return AutoTokenizer.from_pretrained(world.tokenizer)


@pytest.fixture(scope="module")
def prompts(world):
    records, _ = load_records(str(world.eval_prompts), "prompt", verbose=False)
    return records


class Oracle(nn.Module):
    """Answers sort prompts ideally and count prompts with a word (gold 0), then EOS and junk after it.

    It reads each prompt back from the left-padded ids, so it also checks that the prompt reaches generate.
    """

    def __init__(self, tokenizer):
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))  # generate_responses asks the parameters for the device
        self.tokenizer = tokenizer
        self.calls = []

    def generate(self, input_ids, attention_mask, **kwargs):
        self.calls.append(kwargs)
        rows = []
        for ids in input_ids.tolist():
            words = self.tokenizer.decode(ids, skip_special_tokens=True).split(":")[-1].split()
            answer = " ".join(sorted(words, key=int)) if words[0].isdigit() else "fig"
            junk = "7 7 7"  # after the EOS: must be cut off (it would cost brevity and order)
            rows.append(self.tokenizer(f"{answer} <|end|> {junk}", add_special_tokens=False)["input_ids"])
        width = max(map(len, rows))
        pad = self.tokenizer.pad_token_id
        new = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        return torch.cat([input_ids, new], dim=1)


def test_scores_only_the_new_tokens_cut_at_eos(tokenizer, prompts):
    model = Oracle(tokenizer)
    result = sample_gold_utility(model, tokenizer, prompts, n_samples=2, temperature=0.7, max_new_tokens=5, seed=3,
                                 batch_size=4)
    kinds = [p.meta["task"]["kind"] for p in prompts]
    assert set(kinds) == {"sort", "count"}
    # sort answers are ideal (1.0), count answers have no number (0.0)
    assert result.by_kind == {"count": 0.0, "sort": 1.0}
    share = kinds.count("sort") / len(kinds)
    assert result.mean == pytest.approx(share, abs=1e-12)
    per_prompt = [1.0 if k == "sort" else 0.0 for k in kinds]
    std = math.sqrt(sum((u - share) ** 2 for u in per_prompt) / (len(kinds) - 1))
    assert result.stderr == pytest.approx(std / math.sqrt(len(kinds)), abs=1e-12)
    # 12 rows in batches of 4; plain sampling: no top-k / top-p warping
    assert len(model.calls) == 3
    assert model.calls[0] == {"pad_token_id": tokenizer.pad_token_id, "do_sample": True, "temperature": 0.7,
                              "top_k": 0, "top_p": 1.0, "max_new_tokens": 5}


def test_deterministic_from_the_seed_and_leaves_the_rng_alone(world, tokenizer, prompts):
    model = AutoModelForCausalLM.from_pretrained(world.model)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = sample_gold_utility(model, tokenizer, prompts, n_samples=2, temperature=1.0, max_new_tokens=8, seed=1)
    assert torch.equal(torch.get_rng_state(), state)
    again = sample_gold_utility(model, tokenizer, prompts, n_samples=2, temperature=1.0, max_new_tokens=8, seed=1)
    assert first == again
    assert 0.0 <= first.mean <= 1.0 and first.stderr >= 0.0


def test_rejects_bad_arguments(tokenizer, prompts):
    with pytest.raises(ValueError, match="n_samples"):
        sample_gold_utility(Oracle(tokenizer), tokenizer, prompts, n_samples=0)
    with pytest.raises(ValueError, match="prompt"):
        sample_gold_utility(Oracle(tokenizer), tokenizer, [], n_samples=1)


def test_bootstrap_interval_brackets_the_mean_and_shrinks_with_more_prompts():
    from lrlhf.eval import bootstrap_interval

    # constant values: every resample has the same mean
    assert bootstrap_interval([0.25] * 10) == (0.25, 0.25)
    values = [0.0, 1.0] * 20  # mean 0.5
    lo, hi = bootstrap_interval(values, seed=3)
    assert lo < 0.5 < hi
    lo_big, hi_big = bootstrap_interval(values * 25, seed=3)
    assert hi_big - lo_big < (hi - lo) / 3  # 25x the prompts: about 1/5 of the width


def test_compare_with_sft_reports_the_exact_solve_rates(monkeypatch, prompts):
    """#32: a verifiable reward's solve rate before and after (a response with gold 1 is solved), paired per prompt."""
    from lrlhf.data.toy import ideal_answer
    from lrlhf.eval import utility

    two = list(prompts[:2])
    ideal = [ideal_answer(p.meta["task"]) for p in two]
    texts = {"sft": [ideal[0], ideal[0], "fig", ideal[1]], "policy": [ideal[0], ideal[0], ideal[1], ideal[1]]}
    monkeypatch.setattr(utility, "generate_responses", lambda model, *a, **k: texts[model])
    out = utility.compare_with_sft("policy", "sft", None, two, "grpo", n_samples=2, temperature=1.0,
                                   max_new_tokens=8, seed=0)
    assert out["gold/sft_solved"] == pytest.approx(0.75) and out["gold/grpo_solved"] == 1.0
    assert out["gold/grpo_solved_gain"] == pytest.approx(0.25)  # prompt 0: +0, prompt 1: +0.5
    lo, hi = out["gold/grpo_solved_gain_interval"]
    assert lo <= 0.25 <= hi
