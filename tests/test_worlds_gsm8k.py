"""GSM8K as a world (#32): problems whose prompt records carry their reference answer, built from the real files in
``../shared/data/gsm8k`` (skipped when absent), and ``recipe=grpo_gsm8k`` (GRPO, the math verifier as the reward)
through train.py at a tiny size."""

import csv
import gzip
import importlib.util
import json
from pathlib import Path

import pytest
from test_cli import _train

from lrlhf.data.formats import load_records
from lrlhf.data.splits import normalise_prompt, prompt_of
from lrlhf.data.worlds import GSM8KWorld

SHARED_GSM8K = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
needs_gsm8k = pytest.mark.skipif(not (SHARED_GSM8K / "train.jsonl.gz").is_file(),
                                 reason="../shared/data/gsm8k is absent (an outside clone)")
needs_math_verify = pytest.mark.skipif(importlib.util.find_spec("math_verify") is None,
                                       reason="math-verify not installed (pip install 'math-verify[antlr4_9_3]')")
LIMITS = {"rl_prompts": 12, "sft_train": 12, "sft_val": 4, "eval_prompts": 6}


def _records(folder: Path, name: str):
    kind = "sft" if name.startswith("sft_") else "prompt"
    return load_records(str(folder / f"{name}.jsonl"), kind, verbose=False)[0]


@needs_gsm8k
def test_the_world_carries_each_problems_reference_and_holds_out_its_prompts(tmp_path):
    world = GSM8KWorld(train=str(SHARED_GSM8K / "train.jsonl.gz"), test=str(SHARED_GSM8K / "test.jsonl.gz"),
                       limits=LIMITS)
    world.build(tmp_path / "w")
    files = {name: _records(tmp_path / "w", name) for name in GSM8KWorld.FILES}
    assert {name: len(rows) for name, rows in files.items()} == LIMITS
    for name, rows in files.items():  # every record carries its worked solution, ending in `#### <number>`
        assert all(r.meta["answer"].splitlines()[-1].startswith("#### ") for r in rows), name
    question = files["eval_prompts"][0].prompt[-1]["content"]
    first_test = json.loads(gzip.open(SHARED_GSM8K / "test.jsonl.gz", "rt").readline())
    assert question == first_test["question"] + "\nLet's think step by step and output the final answer after \"####\"."
    assert files["eval_prompts"][0].meta["answer"] == first_test["answer"]
    held_out = {normalise_prompt(prompt_of(r)) for r in files["sft_val"]}
    assert not held_out & {normalise_prompt(prompt_of(r)) for r in files["rl_prompts"] + files["sft_train"]}
    # the SFT target is the worked solution less its calculator notes; the record keeps the field as it is
    demo = files["sft_train"][0]
    assert "<<" not in demo.messages[-1]["content"] and "<<" in demo.meta["answer"]
    assert demo.messages[-1]["content"].endswith(demo.meta["answer"].splitlines()[-1])
    report = json.loads((tmp_path / "w" / "world.json").read_text())
    assert report["sources"] == {"train": 7473, "test": 1319}
    assert world.key() == GSM8KWorld(train=world.train, test=world.test, limits=LIMITS).key()
    assert world.key() != GSM8KWorld(train=world.train, test=world.test, limits=LIMITS, seed=1).key()


def test_bad_gsm8k_input_names_the_file_the_line_and_the_key(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n" + json.dumps({"question": "q2"}) + "\n")
    world = GSM8KWorld(train=str(bad), test=str(bad), val_problems=1)
    with pytest.raises(ValueError, match=f"{bad}:2: field\\(s\\) \\['answer'\\] missing or not text"):
        world.build(tmp_path / "w")
    with pytest.raises(FileNotFoundError, match="world.test='nope.jsonl.gz': no such file"):
        GSM8KWorld(train=str(bad), test="nope.jsonl.gz").check()
    with pytest.raises(ValueError, match="world.template must hold {question}"):
        GSM8KWorld(train="a", test="b", template="Solve it.")
    with pytest.raises(ValueError, match="world.limits: {'pref_train': 3}"):
        GSM8KWorld(train="a", test="b", limits={"pref_train": 3})


@pytest.mark.slow
@needs_gsm8k
@needs_math_verify
def test_grpo_on_gsm8k_with_the_math_verifier_runs_end_to_end(tmp_path, tiny_real_model):
    run = tmp_path / "run"
    out = _train(tmp_path, "recipe=grpo_gsm8k", "model=hf", f"model.name_or_path={tiny_real_model}", "hparams=smollm2",
                 "logger=csv", f"hydra.run.dir={run}", *[f"world.limits.{k}={v}" for k, v in LIMITS.items()],
                 "trainer.max_steps=8", "module.config.max_new_tokens=8", "callbacks.early_stopping.every_n_rollouts=1",
                 "callbacks.audit.every_n_rollouts=1")
    assert "plan: grpo_gsm8k 8 steps" in out.stdout and "building the gsm8k world" in out.stdout
    assert not (tmp_path / "cache" / "stages").exists()  # no SFT, no reward model: the instruct model is the start
    summary = json.loads((run / "summary.json").read_text())
    for name in ("sft", "grpo"):  # exact-answer rates of the start and the policy on the GSM8K test problems
        lo, hi = summary[f"judge/{name}_interval"]
        assert 0.0 <= lo <= summary[f"judge/{name}"] <= hi <= 1.0
    assert len(summary["judge/grpo_minus_sft_interval"]) == 2
    assert "held-out judge score: SFT" in out.stdout
    rows = list(csv.DictReader((run / "logs" / "metrics.csv").open()))
    rates = [float(r["reward/math_answer"]) for r in rows if r.get("reward/math_answer")]
    assert len(rates) == 2 and all(0.0 <= x <= 1.0 for x in rates)  # two rollouts, the rule's pass rate each
    table = list(csv.DictReader(next((run / "logs").glob("samples.csv")).open()))
    assert table and all(r["judge"] in ("0.0", "1.0") and r["reward"] in ("0.0", "1.0") for r in table)
    assert "## rollout 2" in (run / "audit.md").read_text()  # the audit rescored edited responses with their records
