"""A judge as the reward (lrlhf.rewards.judge) without a judge model: the questions it asks, how it reads the
answers, and what it refuses, with the model calls replaced by recorders."""

import re

import pytest

import lrlhf.rewards.judge as judge_module
from lrlhf.data.records import PromptExample
from lrlhf.models import ModelConfig
from lrlhf.models.generation import SamplingConfig
from lrlhf.rewards.judge import JudgeReward, PairwiseJudgeReward


class Echo(JudgeReward):
    """Answers every question with the question itself."""

    def ask(self, questions):
        return list(questions)


class PairwiseRecorder(PairwiseJudgeReward):
    """Records the questions of each ``ask`` and answers them with ``rule(question)``."""

    def ask(self, questions):
        self.asked.append(list(questions))
        return [self.rule(q) for q in questions]


def _pairwise(rule, template="{prompt}|{a}|{b}", **kw):
    judge = PairwiseRecorder(judge="unused", template=template, reference_key="ref", **kw)
    judge.asked, judge.rule = [], rule
    return judge


# ----------------------------------------------------------------------------------------------- settings
def test_a_judge_needs_a_model_a_response_slot_and_a_valid_pattern():
    with pytest.raises(ValueError, match=r"^module.reward_model.judge must name the judge model \(a folder or hub "
                                         r"id\)$"):
        JudgeReward(judge="")
    with pytest.raises(ValueError, match=r"^module.reward_model.template must hold \{response\} \(and usually "
                                         r"\{prompt\}\)$"):
        JudgeReward(judge="unused", template="{prompt}")
    with pytest.raises(ValueError, match=r"^module.reward_model.pattern '\(' is not a regular expression: "):
        JudgeReward(judge="unused", pattern="(")
    with pytest.raises(ValueError, match=r"^module.reward_model.template must hold \{a\} and \{b\} \(and usually "
                                         r"\{prompt\}\)$"):
        PairwiseJudgeReward(judge="unused", template="{a} {response}")


def test_an_unbuilt_judge_has_no_model_yet():
    judge = JudgeReward(judge="unused")
    assert judge.model is None and judge.judge_tokenizer is None and judge.tokenizer is None


def test_build_keeps_the_policy_tokenizer_and_loads_the_judge_from_its_config(monkeypatch):
    import torch

    loaded = []

    def load_causal_lm(config):
        loaded.append(config)
        return torch.nn.Linear(2, 2)

    monkeypatch.setattr(judge_module, "load_causal_lm", load_causal_lm)
    monkeypatch.setattr(judge_module, "load_tokenizer", lambda config: ("judge tokenizer", config))
    config = ModelConfig("some/judge")
    judge = JudgeReward(judge=config)
    policy_tokenizer = object()
    module = judge.build(None, policy_tokenizer)
    assert judge.tokenizer is policy_tokenizer and loaded == [config] and loaded[0] is config
    assert judge.judge_tokenizer == ("judge tokenizer", config)
    assert module is judge.model and not module.training and not any(p.requires_grad for p in module.parameters())
    JudgeReward(judge="a/folder").build(None, policy_tokenizer)  # a name is made a config
    assert loaded[1] == ModelConfig("a/folder")


# ----------------------------------------------------------------------------------------------- asking
def test_the_judge_is_asked_greedily_one_user_turn_per_question(monkeypatch):
    calls = []

    def generate_responses(model, tokenizer, questions, sampling, batch_size=None):
        calls.append((model, tokenizer, questions, sampling, batch_size))
        return [f"answer {i}" for i in range(len(questions))]

    monkeypatch.setattr(judge_module, "generate_responses", generate_responses)
    judge = JudgeReward(judge="unused", max_new_tokens=5, batch_size=3)
    judge.model, judge.judge_tokenizer = "the model", "the tokenizer"
    assert judge.ask(["q1", "q2"]) == ["answer 0", "answer 1"]
    ((model, tokenizer, questions, sampling, batch_size),) = calls
    assert (model, tokenizer, batch_size) == ("the model", "the tokenizer", 3)
    assert questions == [PromptExample([{"role": "user", "content": "q1"}]),
                         PromptExample([{"role": "user", "content": "q2"}])]
    assert sampling == SamplingConfig(max_new_tokens=5, temperature=0.0, seed=0)


def test_a_question_holds_the_prompt_and_the_response():
    judge = Echo(judge="unused", template="{prompt}|{response}")
    assert judge.verdicts(["p1", "p2"], ["r1", "r2"]) == ["p1|r1", "p2|r2"]
    with pytest.raises(ValueError):  # one response short: refused, not cut
        judge.verdicts(["p1", "p2"], ["r1"])


# ----------------------------------------------------------------------------------------------- reading
def test_a_score_is_mapped_from_low_high_to_unit():
    judge = JudgeReward(judge="unused", low=1.0, high=5.0)
    assert [judge.parse(v) for v in ("3", "1", "5", "0", "9", "4.5", "none")] == [0.5, 0.0, 1.0, 0.0, 1.0,
                                                                                  (4.5 - 1.0) / 4.0, None]


def test_no_parsed_score_names_the_start_of_one_answer():
    answer = "x" * 200
    judge = Echo(judge="unused", template="{response}")
    with pytest.raises(Exception, match=re.escape(f"one answer: {answer[:120]!r}. Check")):
        judge.score_texts(["p"], [answer])


def test_the_preferred_letter_is_the_patterns_group_or_whole_match():
    grouped = PairwiseJudgeReward(judge="unused", pattern=r"Answer: ([AB])")
    assert grouped.prefers("Answer: B") == "B" and grouped.prefers("B") is None
    whole = PairwiseJudgeReward(judge="unused", pattern=r"[AB]")
    assert whole.prefers("so B") == "B"


# ----------------------------------------------------------------------------------------------- pairwise
def test_pairwise_questions_show_the_prompt_with_the_response_first_then_second():
    judge = _pairwise(lambda q: "A" if q.split("|")[1] == "good" else "B")  # A when "good" is shown first
    scores, _ = judge.score_records(["P1", "P2"], ["good", "bad"], [{"ref": "R1"}, {"ref": "R2"}])
    assert judge.asked == [["P1|good|R1", "P2|bad|R2"], ["P1|R1|good", "P2|R2|bad"]]
    # "good" wins as A and as B (1); "bad" loses as A and wins as B (the judge says B whenever "good" is absent)
    assert scores == [1.0, 0.5]


def test_pairwise_without_records_is_refused_naming_the_prompt():
    judge = _pairwise(lambda q: "A")
    prompt = "a" * 20 + "b" * 80
    message = (f"reward 'judge_pairwise' (module.reward_model.reference_key) on the prompt {prompt[-80:]!r}: "
               "no prompt records were given")
    with pytest.raises(ValueError, match=re.escape(message)):
        judge.score_texts([prompt], ["x"])
    with pytest.raises(ValueError, match=re.escape(message)):
        judge.score_records([prompt], ["x"], None)
    assert judge.asked == []


def test_pairwise_lists_of_different_lengths_are_refused_before_the_judge_is_asked():
    judge = _pairwise(lambda q: "A")
    with pytest.raises(ValueError):  # more records than prompts
        judge.score_records(["p"], ["x"], [{"ref": "R"}, {"ref": "R"}])
    with pytest.raises(ValueError):  # more responses than prompts
        judge.score_records(["p"], ["x", "y"], [{"ref": "R"}])
    assert judge.asked == []


def test_pairwise_verdicts_missing_from_the_second_order_are_refused():
    class Short(PairwiseRecorder):
        def ask(self, questions):
            answers = super().ask(questions)
            return answers[:-1] if len(self.asked) == 2 else answers

    judge = Short(judge="unused", template="{prompt}|{a}|{b}", reference_key="ref")
    judge.asked, judge.rule = [], lambda q: "A"
    with pytest.raises(ValueError):
        judge.score_records(["p", "q"], ["x", "y"], [{"ref": "R"}] * 2)


def test_pairwise_without_a_letter_names_the_start_of_one_verdict():
    verdict = "x" * 200
    judge = _pairwise(lambda q: verdict)
    with pytest.raises(Exception, match=re.escape(f"one verdict: {verdict[:120]!r}. Check")):
        judge.score_records(["p"], ["r"], [{"ref": "R"}])
