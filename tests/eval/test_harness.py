"""The evaluation harness's pieces: Best-of-N picks from a pool, one table row computed by hand, and sampling +
KL + proxy against a naive one-row-at-a-time computation on the toy model."""

import copy
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lrlhf.data.formats import load_records
from lrlhf.data.records import PromptExample
from lrlhf.data.tokenize import encode_prompt
from lrlhf.data.toy import WorldSizes, build_world
from lrlhf.eval.best_of_n import bon_kl, toy_gold_judge
from lrlhf.eval.harness import Samples, best_of_n_from_pool, policy_row, sample_policy
from lrlhf.models import ScalarModel
from lrlhf.models.generation import SamplingConfig
from lrlhf.rewards.protocol import FunctionReward

U = 2.0**-24  # fp32 unit roundoff


def test_best_of_n_from_pool_picks_the_best_of_disjoint_groups():
    pool = Samples("pool", [["a", "b", "c", "d"]], [[1, 2, 3, 4]], [[0.1, 0.9, 0.5, 0.5]], [[0.0] * 4],
                   gold=[[0.0, 1.0, 2.0, 3.0]], judge=[[5.0, 6.0, 7.0, 8.0]])
    bon = best_of_n_from_pool(pool, n=2, picks=2)
    # group (a, b): b (0.9); group (c, d): equal scores, the earlier c
    assert bon.texts == [["b", "c"]] and bon.lengths == [[2, 3]] and bon.proxy == [[0.9, 0.5]]
    assert bon.gold == [[1.0, 2.0]] and bon.judge == [[6.0, 7.0]]
    assert bon.name == "bon2" and bon.analytic_kl == bon_kl(2) and bon.kl is None
    with pytest.raises(ValueError, match="needs 6 pool samples"):
        best_of_n_from_pool(pool, n=3, picks=2)


def _prompt(kind):
    return PromptExample([{"role": "user", "content": kind}], meta={"task": {"kind": kind}})


def test_policy_row_by_hand():
    prompts = [_prompt("sort"), _prompt("count")]
    base_gold = [[0.2, 0.4], [0.6, 0.6]]
    baseline = Samples("sft", [["a", "b"], ["c", "d"]], [[2, 4], [3, 3]], [[0.0, 0.0], [0.0, 0.0]],
                       [[0.0, 0.0], [0.0, 0.0]], gold=base_gold, judge=base_gold)
    gold = [[0.6, 0.4], [0.9, 0.3]]
    policy = Samples("ppo", [["a b", "a b"], ["c", "e"]], [[4, 4], [2, 6]], [[1.0, 2.0], [3.0, 4.0]],
                     [[1.0, 2.0], [3.0, 2.0]], gold=gold, judge=gold)
    row = policy_row(policy, baseline, prompts, ["sort", "count"], toy_gold_judge, True, tie_band=0.0,
                     bad_below=0.3, seed=0, n_resamples=100)
    assert row["gold"] == pytest.approx(0.55, abs=1e-12)  # prompts 0.5 and 0.6
    assert row["gold_vs_base"] == pytest.approx(0.1, abs=1e-12)  # (0.5 - 0.3 + 0.6 - 0.6) / 2
    assert row["proxy"] == pytest.approx(2.5, abs=1e-12)
    assert row["kl_seq"] == pytest.approx(2.0, abs=1e-12) and row["kl_token"] == pytest.approx(8 / 16, abs=1e-12)
    assert row["length"] == 4.0
    assert row["distinct_1"] == pytest.approx(4 / 6) and row["distinct_2"] == pytest.approx(1 / 2)  # a b a b c e
    assert row["self_sim_2"] == 1.0  # prompt 0: {ab} twice; prompt 1: no bigram in either (empty sets: equal)
    # prompt 0: 0.6 > 0.2 win, 0.4 = 0.4 tie; prompt 1: 0.9 > 0.6 win, 0.3 < 0.6 loss
    assert (row["win"], row["tie"], row["loss"], row["both_bad"]) == pytest.approx((0.5, 0.25, 0.25, 0.0))
    assert row["pref"] == pytest.approx((1.5 / 2 + 1 / 2) / 2, abs=1e-12)
    assert row["worst_group"] == "sort" and row["worst_group_gold"] == pytest.approx(0.5)
    assert row["gold[count]"] == pytest.approx(0.6) and "judge" not in row  # the judge is the gold utility
    row = policy_row(baseline, baseline, prompts, ["sort", "count"], toy_gold_judge, True, 0.0, None, 0, 100)
    assert "win" not in row and row["gold_vs_base"] == 0.0 and row["worst_group"] == "sort"  # 0.3 vs 0.6
    bon = Samples("bon4", policy.texts, policy.lengths, policy.proxy, None, bon_kl(4), gold=gold, judge=gold)
    row = policy_row(bon, baseline, prompts, ["sort", "count"], toy_gold_judge, True, 0.0, None, 0, 100)
    assert row["kl_seq"] == pytest.approx(math.log(4) - 3 / 4) and row["kl_kind"].startswith("analytic")
    assert row["kl_token"] == pytest.approx((math.log(4) - 3 / 4) / 4.0)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    sizes = WorldSizes(sft_train=2, sft_val=2, pref_train=2, pref_val=2, pref_test=2, rl=2, eval=3)
    return build_world(tmp_path_factory.mktemp("toy"), seed=0, sizes=sizes)


def test_sample_policy_matches_a_naive_one_row_computation(world):
    tokenizer = AutoTokenizer.from_pretrained(world.tokenizer)
    model = AutoModelForCausalLM.from_pretrained(world.model)
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05 * torch.randn_like(p))
    reward_model = ScalarModel(copy.deepcopy(reference))
    prompts = load_records(str(world.eval_prompts), "prompt", verbose=False)[0]
    sampling = SamplingConfig(max_new_tokens=12, temperature=1.0, seed=5)
    out = sample_policy(model, tokenizer, prompts, 2, sampling, reward_model, reference=reference, batch_size=4)
    again = sample_policy(model, tokenizer, prompts, 2, sampling, reward_model, reference=None, batch_size=4)
    assert again.texts == out.texts and again.kl == [[0.0, 0.0]] * 3  # seeded (for a given batch size)
    with torch.no_grad():
        for p, prompt in enumerate(prompts):
            query = encode_prompt(tokenizer, prompt, max_length=1024).encoded.input_ids
            for i in range(2):
                response = out.ids[p][i]
                assert out.lengths[p][i] == len(response)
                ids = torch.tensor([list(query) + response])  # one row: no padding at all
                logp, tol = [], 0.0
                for m in (model, reference):
                    hidden = m.model(input_ids=ids).last_hidden_state[0, len(query) - 1:-1]
                    z = m.lm_head(hidden).double()  # fp32 logits; log-softmax and sums in fp64
                    logp.append(torch.log_softmax(z, -1).gather(-1, ids[0, len(query):, None]).squeeze(-1))
                    # each fp32 side's log-prob of a token is off by at most the LM head's rounding (H u sum_i
                    # |h_i W_vi|) plus the log-softmax's (u times the logit, max and log-sum-exp; (V + 2) u for
                    # the sum of V exponentials); the k1 sum adds n u sum_t |k1_t|
                    head = (hidden.abs() @ m.lm_head.weight.abs().T).amax(-1).double()
                    tol += 2 * U * (hidden.shape[-1] * head + 4 * z.abs().amax(-1) + 2 * torch.logsumexp(z, -1).abs()
                                    + z.shape[-1] + 4).sum()
                k1 = logp[0] - logp[1]
                tol += len(response) * U * k1.abs().sum()
                assert abs(out.kl[p][i] - k1.sum().item()) <= tol, (out.kl[p][i], k1.sum().item(), tol)
                score = reward_model.score(ids, torch.ones_like(ids)).item()
                assert out.proxy[p][i] == pytest.approx(score, abs=1e-5)


def test_policy_row_without_gold_uses_the_judge():
    prompts = [_prompt("sort"), _prompt("count")]
    base = Samples("sft", [["a"], ["b"]], [[1], [1]], [[0.0], [0.0]], [[0.0], [0.0]], judge=[[0.5], [0.5]])
    policy = Samples("mine", [["a b"], ["c"]], [[2], [1]], [[0.0], [0.0]], [[0.0], [0.0]], judge=[[0.9], [0.1]])
    row = policy_row(policy, base, prompts, ["sort", "count"], len, False, 0.0, None, 0, 50)
    assert "gold" not in row and row["judge"] == pytest.approx(0.5)
    assert (row["win"], row["loss"]) == (0.5, 0.5)
    assert row["worst_group"] == "count" and row["worst_group_judge"] == pytest.approx(0.1)
    assert row["judge[sort]"] == pytest.approx(0.9)


def test_sample_policy_with_a_reward_source_as_the_proxy(world):
    tokenizer = AutoTokenizer.from_pretrained(world.tokenizer)
    model = AutoModelForCausalLM.from_pretrained(world.model)
    prompts = load_records(str(world.eval_prompts), "prompt", verbose=False)[0]
    reward = FunctionReward(fn=lambda prompt, response: 10.0 * ("items" in prompt) + len(response.split()))
    reward.build(model, tokenizer)
    sampling = SamplingConfig(max_new_tokens=12, temperature=1.0, seed=5)
    out = sample_policy(model, tokenizer, prompts, 2, sampling, None, batch_size=4, reward=reward)
    plain = sample_policy(model, tokenizer, prompts, 2, sampling, None, batch_size=4)
    assert out.texts == plain.texts and all(math.isnan(v) for row in plain.proxy for v in row)  # no proxy: NaN
    for p, prompt in enumerate(prompts):  # the source's raw score of each sample (the toy prompts ask "how many items")
        asks = "items" in prompt.prompt[-1]["content"]
        assert out.proxy[p] == [10.0 * asks + len(t.split()) for t in out.texts[p]]
    with pytest.raises(ValueError, match="not both"):
        sample_policy(model, tokenizer, prompts, 2, sampling, ScalarModel(model), reward=reward)


def test_sampling_more_than_one_batch_shows_its_progress(world, capsys):
    """A best-of-N pool sampled for ~30 minutes on a CPU without a word looked like a hang: a bar per policy."""
    tokenizer = AutoTokenizer.from_pretrained(world.tokenizer)
    model = AutoModelForCausalLM.from_pretrained(world.model)
    prompts = load_records(str(world.eval_prompts), "prompt", verbose=False)[0]
    sampling = SamplingConfig(max_new_tokens=4, temperature=1.0, seed=5)
    sample_policy(model, tokenizer, prompts, 2, sampling, None, batch_size=4, name="pool")  # 6 rows: 2 batches
    out = capsys.readouterr().out
    assert "eval: pool" in out and "6/6" in out
    sample_policy(model, tokenizer, prompts, 2, sampling, None, batch_size=6, name="one")  # one batch: no bar
    assert "eval: one" not in capsys.readouterr().out
