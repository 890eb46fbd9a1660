"""The prompt record reaches the reward (#32: a rule reads a GSM8K problem's reference answer), and the math-answer
rule (HF's math-verify) against hand-computed cases, with its mutants killed and its bad inputs named."""

import importlib.util
import re
import sys

import pytest
import torch

from lrlhf.data.math_answers import math_answer_judge, reference_answer
from lrlhf.data.records import PromptExample
from lrlhf.eval.heldout import sample_held_out
from lrlhf.functional import ResponseMasks
from lrlhf.modules.advantages import GRPO
from lrlhf.rewards.calibration import ReferenceSamples
from lrlhf.rewards.protocol import RewardScores, RewardSource
from lrlhf.rewards.rules import MathAnswer, Regex, Rule, RuleReward

from .test_ppo import _batch, _data, _module, tokenizer, world  # noqa: F401 (fixtures)

needs_math_verify = pytest.mark.skipif(importlib.util.find_spec("math_verify") is None,
                                       reason="math-verify not installed (pip install 'math-verify[antlr4_9_3]')")

# A GSM8K answer field: the worked solution, calculator notes, the final `#### 72` line.
SOLUTION = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72"
# (response, 1.0 when its final answer is 72): worked out by hand
CASES = [
    ("In April 48, in May 24, so 48 + 24 = 72", 1.0),  # the last number is the answer
    ("The answer is $72$", 1.0),  # LaTeX
    ("72.0", 1.0),  # the same number written as a decimal
    ("\\boxed{72}", 1.0),
    ("#### 72", 1.0),  # GSM8K's own format, as the recipe's prompt asks for it
    ("73", 0.0),
    ("I cannot tell how many clips she sold.", 0.0),  # no number: no answer
    ("72 clips in May, then 5 more", 0.0),  # the final number is 5
]


def _checks(rule) -> list[float]:
    return [rule.check_record("How many clips?", response, {"answer": SOLUTION}) for response, _ in CASES]


def test_the_reference_is_the_text_after_the_last_lines_hashes():
    assert reference_answer(SOLUTION) == "72"
    assert reference_answer("Then 1,000 + 80 = 1,080\n#### 1,080") == "1,080"
    assert reference_answer("\\frac{1}{2}") == "\\frac{1}{2}"  # no `####` line: the field is the answer
    assert reference_answer("#### 5 is said early\nthen 6") == "#### 5 is said early\nthen 6"  # not the last line


@needs_math_verify
def test_math_answer_by_hand():
    assert _checks(MathAnswer()) == [expected for _, expected in CASES]
    rule = MathAnswer(key="solution")  # the reference under another key; thousands separators and fractions
    assert rule.check_record("", "so 1080 in all", {"solution": "#### 1,080"}) == 1.0
    assert rule.check_record("", "\\frac{1}{2}", {"solution": "0.5"}) == 1.0
    assert rule.check_record("", "1.08", {"solution": "#### 1,080"}) == 0.0


class AlwaysOne(Rule):
    name, gate = "always_one", False

    def check_record(self, prompt, response, meta):
        return 1.0


class SameText(Rule):
    """The response's text equals the reference's, no math."""

    name, gate = "same_text", False

    def check_record(self, prompt, response, meta):
        return float(response.strip() == reference_answer(meta["answer"]))


class FirstNumber(Rule):
    """The response's first number, not its final answer."""

    name, gate = "first_number", False

    def check_record(self, prompt, response, meta):
        found = re.search(r"-?\d+(?:\.\d+)?", response)
        return float(found is not None and float(found.group()) == float(reference_answer(meta["answer"])))


@needs_math_verify
@pytest.mark.parametrize("mutant", [AlwaysOne(), SameText(), FirstNumber()], ids=lambda m: m.name)
def test_the_hand_cases_kill_the_mutants(mutant):
    assert _checks(mutant) != [expected for _, expected in CASES]


@needs_math_verify
def test_a_record_without_a_reference_is_named_with_its_sample():
    reward = RuleReward([Regex(r"\d", name="digit"), MathAnswer()])
    scores, parts = reward.score_records(["q"] * 2, ["The answer is 72", "73"], [{"answer": SOLUTION}] * 2)
    assert scores == [1.0, 0.5] and parts == {"digit": [1.0, 1.0], "math_answer": [1.0, 0.0]}
    with pytest.raises(ValueError) as error:
        reward.score_records(["How many clips?"], ["72"], [{"question": "How many clips?"}])
    assert str(error.value) == (
        "reward rule 'math_answer' (key 'answer') on the response '72' to 'How many clips?': the prompt record has no "
        "reference answer 'answer' (its fields: ['question']); give every prompt an 'answer' field, or set the key "
        "that holds it")
    with pytest.raises(ValueError, match=r"reward rule 'math_answer' \(key 'answer'\) on the response '72' .*: no "
                                         "prompt records were given"):
        reward.score_texts(["How many clips?"], ["72"])  # the texts alone: no record to read
    with pytest.raises(ValueError, match="the reference answer 'many' holds no number or expression"):
        reward.score_records(["q"], ["72"], [{"answer": "#### many"}])


def test_without_math_verify_the_rule_and_the_judge_name_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # import math_verify now raises ImportError
    install = re.escape("pip install 'math-verify[antlr4_9_3]'")
    with pytest.raises(ImportError, match=f"reward rule 'math_answer': the math-answer check needs HF's math-verify, "
                                          f"which is not installed: {install}"):
        MathAnswer()
    with pytest.raises(ImportError, match=install):
        math_answer_judge()


@needs_math_verify
def test_the_judge_scores_a_record_and_its_response():
    judge = math_answer_judge()
    record = PromptExample([{"role": "user", "content": "How many clips?"}], meta={"answer": SOLUTION})
    assert [judge(record, r) for r in ("so 72", "so 73")] == [1.0, 0.0]
    with pytest.raises(ValueError, match="the math-answer judge on the response 'so 72' to 'How many clips\\?': the "
                                         "prompt record has no reference answer 'answer'"):
        judge(PromptExample([{"role": "user", "content": "How many clips?"}]), "so 72")


class Words:
    """A tokenizer stand-in: token id i is the i-th word of ``vocab``."""

    def __init__(self, vocab):
        self.vocab = vocab

    def batch_decode(self, rows, skip_special_tokens=True):
        return [" ".join(self.vocab[i] for i in row) for row in rows]


@needs_math_verify
def test_the_rule_reads_each_rows_record_through_the_reward_protocol():
    reward = RuleReward([MathAnswer()])
    reward.build(None, Words(["how", "many?", "72", "73", "so"]))
    query, query_mask = torch.tensor([[0, 1]] * 3), torch.ones(3, 2, dtype=torch.long)
    response = torch.tensor([[4, 2], [4, 3], [4, 3]])  # "so 72", "so 73", "so 73"
    valid = torch.ones(3, 2, dtype=torch.bool)
    masks = ResponseMasks(valid, valid, torch.ones(3, dtype=torch.long), torch.ones(3, dtype=torch.bool),
                          torch.full((3,), 2))
    meta = [{"answer": "#### 72"}, {"answer": "#### 72"}, {"answer": "#### 73"}]
    scored = reward.score(query, query_mask, response, masks, meta=meta)
    assert scored.scores.tolist() == [1.0, 0.0, 1.0] and scored.components["math_answer"].tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="2 prompt records for 3 responses"):
        reward.score(query, query_mask, response, masks, meta=meta[:2])


class RecordingReward(RewardSource):
    """Scores 0 and keeps the ``meta`` of every call, in order."""

    def __init__(self):
        self.calls = []

    def build(self, model, tokenizer):  # noqa: F811
        return None

    def score(self, query_ids, query_mask, response_ids, masks, meta=None):
        self.calls.append(meta)
        return RewardScores(torch.zeros(len(response_ids)))


def test_the_prompt_records_reach_the_reward_in_the_rollout_the_calibration_and_held_out(world, tokenizer):  # noqa: F811
    reward = RecordingReward()
    module = _module(world, tokenizer, advantage=GRPO(samples_per_prompt=2), critic=None, reward=reward,
                     forward_batch_size=4)
    batch = _batch(world, tokenizer)
    module.make_rollout(batch)  # 4 prompts x 2 samples, scored in chunks of 4 rows
    expected = [m for m in batch["meta"] for _ in range(2)]
    assert all("task" in m for m in expected)  # the toy world's records: the task a gold utility reads
    assert reward.calls == [expected[:4], expected[4:]]
    reward.calls.clear()
    data = _data(world, tokenizer)
    data.setup("fit")
    module.calibration = ReferenceSamples(n_prompts=3)
    with pytest.raises(ValueError, match="constant reward has no scale"):  # measured, then refused: every score is 0
        module.calibration.measure(module, data)
    assert reward.calls == [[item.meta for item in data.datasets["train"][:3]]]
    reward.calls.clear()
    module.calibration = None
    from lrlhf.eval.heldout import ModuleHooks

    prompts = [PromptExample([{"role": "user", "content": "sort 3 1 2"}], meta={"p": i}) for i in range(3)]
    sample_held_out(ModuleHooks(module), prompts, n=2, seed=0, batch_size=4)
    assert reward.calls == [[{"p": 0}, {"p": 0}, {"p": 1}, {"p": 1}], [{"p": 2}, {"p": 2}]]
