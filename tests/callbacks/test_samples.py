"""SampleTable: each column is what it says (reward, judge, KL recomputed from their definitions), tables come at
the interval and at the end, and logging them never changes training."""

import csv
import json
import math
from pathlib import Path

import pytest
import torch

from lrlhf.callbacks import SampleTable
from lrlhf.callbacks.samples import COLUMNS
from lrlhf.data.formats import load_records
from lrlhf.eval.best_of_n import toy_gold_judge
from lrlhf.eval.heldout import ModuleHooks, sample_held_out
from lrlhf.models import LoraSpec, ModelConfig, ScalarModel, load_causal_lm
from lrlhf.modules import DPOConfig, DPOModule, RewardModule, SFTConfig, SFTModule
from lrlhf.rewards.text import reward_model_scorer

from .conftest import BATCH, make_data, make_module, make_trainer


def _weights(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _rows(path):
    with path.open() as f:
        return list(csv.DictReader(f))


def _table(world, **kw):
    return SampleTable(prompts=str(world.eval_prompts), pairs=str(world.pref_val), judge="toy_gold",
                       max_new_tokens=6, max_prompts=3, **kw)


def test_ppo_table_at_the_interval_and_the_end_and_training_unchanged(world, tokenizer, tmp_path):
    steps = make_module(world, tokenizer).updates_per_rollout(BATCH)
    plain = make_module(world, tokenizer)
    make_trainer(tmp_path / "plain", 3, plain).fit(plain, datamodule=make_data(world, tokenizer))
    table = _table(world, every_n_steps=2 * steps)
    module = make_module(world, tokenizer)
    trainer = make_trainer(tmp_path / "t", 3, module, [table])  # no logger: <log_dir>/samples.csv
    trainer.fit(module, datamodule=make_data(world, tokenizer))
    # the table samples from a forked RNG in eval mode: the run is bitwise the run without it
    after, expected = _weights(module), _weights(plain)
    assert after.keys() == expected.keys() and all(torch.equal(after[k], expected[k]) for k in after)

    rows = _rows(Path(trainer.log_dir) / "samples.csv")
    assert list(rows[0]) == COLUMNS
    assert [int(r["step"]) for r in rows] == [2 * steps] * 3 + [3 * steps] * 3  # the interval, then the end
    prompts, _ = load_records(str(world.eval_prompts), "prompt", verbose=False)
    final = rows[3:]
    # the columns recomputed from their definitions on the final policy (the same seed gives the same samples)
    again = table.rows(module, 3 * steps)
    assert [r[3] for r in again] == [r["response"] for r in final]
    for prompt, row in zip(prompts, final, strict=False):
        assert row["kind"] == "sample" and row["prompt"] == prompt.prompt[-1]["content"]
        assert float(row["judge"]) == pytest.approx(toy_gold_judge(prompt, row["response"]), abs=1e-6)
        assert math.isfinite(float(row["reward"])) and math.isfinite(float(row["kl"]))
    kls = torch.tensor([float(r["kl"]) for r in final])
    assert kls.abs().sum() > 0  # three updates moved the policy from its reference


def test_ppo_reward_and_kl_are_the_held_out_paths(world, tokenizer):
    # the held-out path (early stopping's): the calibrated RM score and the sequence sum of log pi - log pi_ref
    module = make_module(world, tokenizer)
    module.configure_model()
    for name, p in module.model.named_parameters():
        if "lora_B" in name and "policy" in name:
            torch.nn.init.normal_(p, std=0.5)  # a policy away from its reference
    rows = _table(world).rows(module, 0)
    prompts, _ = load_records(str(world.eval_prompts), "prompt", verbose=False)
    samples = sample_held_out(ModuleHooks(module), prompts[:3], 1, 0, 3)
    assert [r[3] for r in rows] == samples.texts
    assert [r[4] for r in rows] == pytest.approx(samples.proxy.tolist(), abs=1e-6)
    assert [r[6] for r in rows] == pytest.approx(samples.kl.tolist(), abs=1e-6)
    assert any(abs(r[6]) > 1e-3 for r in rows)


def test_sft_table_has_no_reward_and_no_kl_and_the_gold_judge(world, tokenizer, tmp_path):
    module = SFTModule(ModelConfig(str(world.model)), tokenizer, SFTConfig(lr=1e-2))
    module.configure_model()
    rows = _table(world).rows(module, 5)
    prompts, _ = load_records(str(world.eval_prompts), "prompt", verbose=False)
    assert len(rows) == 3 and all(r[0] == 5 and r[1] == "sample" for r in rows)
    assert all(r[4] is None and r[6] is None for r in rows)  # SFT optimises no reward and has no reference
    expected = [toy_gold_judge(p, r[3]) for p, r in zip(prompts[:3], rows, strict=True)]
    assert [r[5] for r in rows] == pytest.approx(expected, abs=1e-6)


def test_dpo_reward_is_beta_times_the_kl_and_zero_at_the_start(world, tokenizer):
    module = DPOModule(ModelConfig(str(world.model)), tokenizer, DPOConfig(beta=0.25, lora=LoraSpec(r=2)))
    module.configure_model()
    rows = _table(world).rows(module, 0)
    assert all(r[4] == 0.0 and r[6] == 0.0 for r in rows)  # LoRA B = 0: the policy is its reference
    for name, p in module.model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    rows = _table(world).rows(module, 1)
    kls = [r[6] for r in rows]
    assert any(abs(k) > 1e-3 for k in kls)
    assert [r[4] for r in rows] == pytest.approx([0.25 * k for k in kls], rel=1e-4, abs=1e-6)


def test_reward_model_table_scores_chosen_and_rejected(world, tokenizer):
    torch.manual_seed(0)
    module = RewardModule(ScalarModel(load_causal_lm(ModelConfig(str(world.model)))), tokenizer=tokenizer)
    rows = _table(world).rows(module, 7)
    pairs, _ = load_records(str(world.pref_val), "preference", verbose=False)
    pairs = pairs[:3]
    assert [r[1] for r in rows] == ["chosen", "rejected"] * len(pairs)
    texts = [c[-1]["content"] for p in pairs for c in (p.chosen, p.rejected)]
    assert [r[3] for r in rows] == texts
    records = [p for p in pairs for _ in (0, 1)]
    expected = reward_model_scorer(module.model, tokenizer)(records, texts)
    assert [r[4] for r in rows] == pytest.approx(expected, abs=1e-6)
    assert all(r[6] is None for r in rows) and all(isinstance(r[5], float) for r in rows)


@pytest.mark.parametrize(("key", "value"), [("every_n_steps", -1), ("max_prompts", 0), ("max_new_tokens", 0)])
def test_bad_settings_name_their_key(key, value):
    with pytest.raises(ValueError, match=rf"callbacks\.samples\.{key} must be"):
        SampleTable(**{key: value})


def test_dpo_reward_stays_at_temperature_one_when_sampling_at_another(world, tokenizer):
    # the KL is at the sampling temperature; DPO's implicit reward is always at temperature 1 (its loss's)
    module = DPOModule(ModelConfig(str(world.model)), tokenizer, DPOConfig(beta=0.25, lora=LoraSpec(r=2)))
    module.configure_model()
    for name, p in module.model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    hot = _table(world, temperature=1.0).rows(module, 1)
    cold = _table(world, temperature=0.5).rows(module, 1)
    assert [r[4] for r in hot] == pytest.approx([0.25 * r[6] for r in hot], rel=1e-4, abs=1e-6)
    assert any(abs(r[4] - 0.25 * r[6]) > 1e-3 for r in cold)  # not beta x the temperature-0.5 log-ratio


def test_reward_model_table_reads_a_rankings_file_as_best_against_worst(world, tokenizer, tmp_path):
    # #36 item 1: a rankings world's pref_val crashed the table after the RM had trained
    path = tmp_path / "rankings.jsonl"
    rows = [{"prompt": "sort : 3 1", "completions": ["1 3", "3 1", "1"], "ranks": [1, 3, 2], "group": "t1"},
            {"prompt": "count : a b", "completions": ["2", "3"], "ranks": [2, 1], "group": "t2"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    torch.manual_seed(0)
    module = RewardModule(ScalarModel(load_causal_lm(ModelConfig(str(world.model)))), tokenizer=tokenizer)
    table = SampleTable(pairs=str(path), max_prompts=3)
    got = table.rows(module, 1)
    assert [(r[1], r[3]) for r in got] == [("chosen", "1 3"), ("rejected", "3 1"), ("chosen", "3"), ("rejected", "2")]
