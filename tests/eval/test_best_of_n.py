"""Best-of-N: the KL formula by hand, the pick on hand-made scores, sampling + scoring + judging end to end with a
stub policy, and the reward-model scorer rendering (prompt, response) exactly as RM training does."""

import math

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from lrlhf.data.collate import collate_pairs
from lrlhf.data.formats import load_records
from lrlhf.data.records import PreferencePair, PromptExample
from lrlhf.data.tokenize import encode_pair
from lrlhf.data.toy import WorldSizes, build_world, gold_utility
from lrlhf.eval.best_of_n import (
    best_of_n,
    bon_kl,
    select_best_of_n,
    toy_gold_judge,
)
from lrlhf.models import ScalarModel
from lrlhf.models.generation import SamplingConfig
from lrlhf.rewards.protocol import TextReward
from lrlhf.rewards.text import reward_model_scorer, text_scorer


def test_bon_kl_by_hand():
    assert bon_kl(1) == 0.0  # one sample: the policy itself
    assert bon_kl(2) == pytest.approx(math.log(2) - 1 / 2, abs=1e-12)  # 0.6931 - 0.5 = 0.1931
    assert bon_kl(4) == pytest.approx(1.3862943611 - 0.75, abs=1e-9)  # log 4 - 3/4
    assert bon_kl(16) == pytest.approx(2.7725887222 - 0.9375, abs=1e-9)  # log 16 - 15/16
    assert bon_kl(64) == pytest.approx(4.1588830834 - 63 / 64, abs=1e-9)
    values = [bon_kl(n) for n in range(1, 65)]
    assert all(a < b for a, b in zip(values[:-1], values[1:], strict=True))  # more samples, further from the policy
    with pytest.raises(ValueError, match="n must be >= 1"):
        bon_kl(0)


def _prompt(name):
    return PromptExample(prompt=[{"role": "user", "content": name}])


def test_select_picks_the_highest_proxy_score_per_prompt_first_on_ties():
    prompts = [_prompt("a"), _prompt("b")]
    responses = ["x", "yy", "zzz", "p", "qq", "r"]  # n = 3 per prompt, adjacent
    scores = [0.1, 0.9, 0.5, 2.0, 1.0, 2.0]  # prompt b: samples 0 and 2 tie at the top -> the first
    out = select_best_of_n(prompts, responses, scores, 3, judge=lambda p, r: float(len(r)))
    assert out.responses == ("yy", "p")
    assert out.proxy == (0.9, 2.0)
    assert out.gold == (2.0, 1.0)  # the judge (length) of the picks, not of the best-by-judge ("zzz", "qq")
    assert out.all_proxy == ((0.1, 0.9, 0.5), (2.0, 1.0, 2.0))
    assert out.all_gold == ((1.0, 2.0, 3.0), (1.0, 2.0, 1.0))
    assert out.n == 3 and out.kl == pytest.approx(math.log(3) - 2 / 3)
    assert out.gold_mean == 1.5 and out.proxy_mean == pytest.approx(1.45)
    with pytest.raises(ValueError, match="need 6 responses"):
        select_best_of_n(prompts, responses[:5], scores[:5], 3, judge=lambda p, r: 0.0)


# ------------------------------------------------------------------------------------------ toy world
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    sizes = WorldSizes(sft_train=2, sft_val=2, pref_train=2, pref_val=2, pref_test=2, rl=2, eval=4)
    return build_world(tmp_path_factory.mktemp("toy"), seed=0, sizes=sizes)


@pytest.fixture(scope="module")
def tokenizer(world):
    return AutoTokenizer.from_pretrained(world.tokenizer)


@pytest.fixture(scope="module")
def prompts(world):
    return load_records(str(world.eval_prompts), "prompt", verbose=False)[0]


class Alternating(nn.Module):
    """A stub policy: row i of every generate call answers "fig" (even i) or "7" (odd i), then EOS."""

    def __init__(self, tokenizer):
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))
        self.tokenizer = tokenizer

    def generate(self, input_ids, attention_mask, **kwargs):
        rows = [self.tokenizer(f"{'fig' if i % 2 == 0 else '7'} <|end|>", add_special_tokens=False)["input_ids"]
                for i in range(input_ids.shape[0])]
        width = max(map(len, rows))
        new = torch.tensor([r + [self.tokenizer.pad_token_id] * (width - len(r)) for r in rows])
        return torch.cat([input_ids, new], dim=1)


def test_best_of_n_samples_n_per_prompt_scores_and_judges_the_pick(tokenizer, prompts):
    seen = []

    def prefers_digits(ps, responses):  # a proxy that likes "7" over "fig"
        seen.append((len(ps), list(responses)))
        return [1.0 if r.strip().isdigit() else 0.0 for r in responses]

    sampling = SamplingConfig(max_new_tokens=4, temperature=1.0, seed=0)
    out = best_of_n(Alternating(tokenizer), tokenizer, prompts, prefers_digits, n=2, sampling=sampling, batch_size=8)
    assert seen[0][0] == 2 * len(prompts) and seen[0][1][:2] == ["fig", "7"]
    assert out.responses == ("7",) * len(prompts) and out.proxy == (1.0,) * len(prompts)
    assert out.gold == tuple(gold_utility(p.meta["task"], "7") for p in prompts)
    assert out.all_gold[0] == (toy_gold_judge(prompts[0], "fig"), toy_gold_judge(prompts[0], "7"))
    with pytest.raises(ValueError, match="temperature > 0"):
        best_of_n(Alternating(tokenizer), tokenizer, prompts, prefers_digits, n=2, sampling=SamplingConfig())


def test_reward_model_scorer_renders_like_rm_training(world, tokenizer, prompts):
    reward_model = ScalarModel(AutoModelForCausalLM.from_pretrained(world.model)).eval()
    responses = ["3 1 2", "fig"]
    scores = reward_model_scorer(reward_model, tokenizer, batch_size=1)(prompts[:2], responses)
    # the same (prompt, response) as the chosen side of a preference pair, through the training data path
    pairs = [encode_pair(tokenizer, PreferencePair(p.prompt, [{"role": "assistant", "content": r}],
                                                   [{"role": "assistant", "content": "x"}]), max_length=1024)
             for p, r in zip(prompts[:2], responses, strict=True)]
    batch = collate_pairs(pairs, tokenizer.pad_token_id)
    with torch.no_grad():
        expected = reward_model.score(batch["input_ids"], batch["attention_mask"])[:2]
    assert scores == pytest.approx(expected.tolist(), abs=1e-5)


class _RecordReward(TextReward):
    """A reward reading all three things a source is given: the prompt text, the response and the record's meta."""

    name = "record"

    def score_records(self, prompts, responses, meta):
        scores = [1000.0 * (m["said"] in p) + 10.0 * m["k"] + len(r.split())
                  for p, r, m in zip(prompts, responses, meta, strict=True)]
        return scores, {}


def test_source_scorer_scores_a_reward_source_as_ppo_does(tokenizer, prompts):
    reward = _RecordReward()
    reward.build(None, tokenizer)
    records = [PromptExample(p.prompt, p.source, {**p.meta, "k": i, "said": p.prompt[-1]["content"]})
               for i, p in enumerate(prompts[:3])]
    responses = ["1 2 3", "fig", "7 7 7 7 7 7 7"]
    scores = text_scorer(reward, tokenizer, batch_size=2)(records, responses)  # two batches: 2 + 1
    assert scores == [1000.0 + 0 + 3, 1000.0 + 10 + 1, 1000.0 + 20 + 7]  # the prompt seen, its meta, the response
    with pytest.raises(ValueError, match="3 prompts and 2 responses"):
        text_scorer(reward, tokenizer)(records, responses[:2])


def test_bon_expected_by_hand_and_against_every_subset():
    import itertools
    import random

    from lrlhf.eval.best_of_n import bon_expected

    proxy, gold = [0.1, 0.5, 0.3], [1.0, 2.0, 3.0]
    assert bon_expected(proxy, gold, 1) == pytest.approx(2.0, abs=1e-12)  # the mean
    # subsets {0,1} -> 2, {0,2} -> 3, {1,2} -> 2
    assert bon_expected(proxy, gold, 2) == pytest.approx(7 / 3, abs=1e-12)
    assert bon_expected(proxy, gold, 3) == pytest.approx(2.0, abs=1e-12)  # the proxy's best of all
    assert bon_expected([0.5, 0.5], [1.0, 0.0], 2) == 1.0  # equal scores: the earlier sample, as select_best_of_n
    rng = random.Random(0)
    proxy = [rng.choice([0.0, 0.5, 1.0, rng.random()]) for _ in range(7)]
    gold = [rng.random() for _ in range(7)]
    for n in range(1, 8):
        picks = [select_best_of_n([PromptExample([])], [str(i) for i in s], [proxy[i] for i in s], n,
                                  lambda p, r: gold[int(r)]).gold[0] for s in itertools.combinations(range(7), n)]
        assert bon_expected(proxy, gold, n) == pytest.approx(sum(picks) / len(picks), abs=1e-12)
    with pytest.raises(ValueError, match="pool size"):
        bon_expected(proxy, gold, 8)


def test_a_rule_reward_ranks_best_of_n_candidates_through_the_text_scorer(tokenizer, prompts):
    """Any reward source is a best-of-N proxy (lrlhf.rewards.text.text_scorer): here rules, no reward model."""
    from lrlhf.rewards.rules import Regex, RuleReward

    rules = RuleReward(rules=[Regex(pattern="^[0-9 ]+$", name="numbers_only")])
    rules.build(None, tokenizer)
    scorer = text_scorer(rules, tokenizer)
    assert scorer(prompts[:3], ["7", "fig", "1 2"]) == [1.0, 0.0, 1.0]
    sampling = SamplingConfig(max_new_tokens=4, temperature=1.0, seed=0)
    out = best_of_n(Alternating(tokenizer), tokenizer, prompts, scorer, n=2, sampling=sampling, batch_size=8)
    assert out.responses == ("7",) * len(prompts) and out.proxy == (1.0,) * len(prompts)
