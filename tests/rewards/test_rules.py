"""Rule rewards (lrlhf.rewards.rules) and the constraint rule (lrlhf.rewards.constraint_reward) at their edges: each
rule's boundary case, a rule object that is not a :class:`Rule`, the weighted mean's corner cases, the messages that
name a bad rule or a sample without its record (cut to the response's first and the prompt's last 80 characters)."""

import sys

import pytest

from lrlhf.data.constraints import KINDS
from lrlhf.rewards.constraint_reward import InstructionConstraint
from lrlhf.rewards.rules import Forbidden, JsonParses, LengthWords, MathAnswer, Regex, Rule, RuleReward

LONG_RESPONSE = "r" * 80 + "S"  # 81 characters: the message shows the first 80
LONG_PROMPT = "P" + "p" * 80  # 81 characters: the message shows the last 80


class Prefix:
    """A rule object with only ``check`` (not a Rule): the response starts with the prompt."""

    name, gate = "prefix", False

    def check(self, prompt, response):
        return float(response.startswith(prompt))


class RecordOnly:
    """A rule object with only ``check_record``: the record's ``ok`` field."""

    name, gate = "record_only", False

    def check_record(self, prompt, response, meta):
        return float(meta["ok"])


class Echo(Rule):
    """A Rule that writes ``check`` alone: the response repeats the prompt."""

    name = "echo"

    def check(self, prompt, response):
        return float(response == prompt)


class Score:
    """A reward, not a rule: it has ``score`` and a name."""

    name = "rm"

    def score(self, *args):
        return 0.0


def test_each_rules_boundary():
    assert JsonParses().check("", "[1]") == 1.0  # any JSON value without required keys
    assert JsonParses(required_keys=["a"]).check("", '{"a": 1, "b": 2}') == 1.0
    assert JsonParses().check("", '```json\n{\n  "a": 1\n}\n```') == 1.0  # a fenced block over several lines
    assert Forbidden(["As an AI"], case_sensitive=True).check("", "As an AI model") == 0.0
    assert Forbidden(["as an ai"]).check("", "As An AI model") == 0.0  # the response's case ignored too
    assert LengthWords(min_words=2).check("", "a b") == 1.0 and LengthWords(max_words=2).check("", "a b") == 1.0


def test_a_rule_writing_check_alone_is_given_the_prompt_through_check_record():
    assert Echo().check_record("same", "same", None) == 1.0 and Echo().check_record("one", "two", None) == 0.0


def test_rule_objects_without_check_record_or_check_are_scored():
    reward = RuleReward([Prefix(), RecordOnly()])
    scores, parts = reward.score_records(["ab", "ab"], ["abc", "ba"], [{"ok": True}, {"ok": False}])
    assert scores == [1.0, 0.0] and parts == {"prefix": [1.0, 0.0], "record_only": [1.0, 0.0]}


@pytest.mark.parametrize(("rule", "hint"), [
    (Score(), " (a reward: put it in module.reward_model itself, or as a part of reward=mixture)"),
    (object(), ""),
])
def test_a_non_rule_is_refused_by_its_place_and_type(rule, hint):
    with pytest.raises(TypeError) as error:
        RuleReward([Regex("a", name="a"), rule])
    assert str(error.value) == (f"module.reward_model.rules[1] is a {type(rule).__name__}, not a rule{hint}: a rule "
                                "has `name`, `gate` and check(prompt, response) -> 1.0 or 0.0 "
                                "(lrlhf.rewards.rules.Rule)")


def test_a_rule_needs_a_string_name():
    bad = Prefix()
    bad.name = 3
    with pytest.raises(TypeError, match=r"module.reward_model.rules\[0\] is a Prefix, not a rule: "):
        RuleReward([bad])


def test_no_rules_are_refused():
    with pytest.raises(ValueError) as error:
        RuleReward([])
    assert str(error.value) == "module.reward_model.rules must hold at least one rule"


def test_gates_alone_score_one_when_they_hold():
    reward = RuleReward([Regex(r"\d", name="digit", gate=True), Forbidden(["bad"], gate=True)], floor=-1.0)
    assert reward.score_texts(["p"] * 2, ["1 ok", "1 bad"])[0] == [1.0, -1.0]


def test_equal_weights_give_the_check_itself_at_any_magnitude():
    class Huge(Rule):
        name = "huge"

        def check(self, prompt, response):
            return sys.float_info.max

    assert RuleReward([Huge()]).score_texts(["p"], ["r"])[0] == [sys.float_info.max]


def test_mismatched_lengths_are_refused():
    reward = RuleReward([Regex("a", name="a"), Regex("b", name="b")])
    with pytest.raises(ValueError):
        reward.score_texts(["p", "q"], ["a"])
    with pytest.raises(ValueError):
        reward.score_records(["p"], ["a"], [None, None])
    reward.weights = [1.0]  # changed after it was checked
    with pytest.raises(ValueError):
        reward.score_texts(["p"], ["a"])


def test_the_constraint_rule_without_a_record_names_its_sample():
    known = ", ".join(KINDS)
    with pytest.raises(ValueError) as error:
        InstructionConstraint().check(LONG_PROMPT, LONG_RESPONSE)
    assert str(error.value) == (f"reward rule 'constraint' on the response {'r' * 80!r} to {'p' * 80!r}: the prompt "
                                f"record has no constraint (meta.constraint with a kind of {known}): world=constraints "
                                "writes one per prompt")


def test_the_math_rule_without_a_record_names_its_sample():
    pytest.importorskip("math_verify")
    with pytest.raises(ValueError) as error:
        MathAnswer().check(LONG_PROMPT, LONG_RESPONSE)
    assert str(error.value).startswith(f"reward rule 'math_answer' (key 'answer') on the response {'r' * 80!r} to "
                                       f"{'p' * 80!r}: ")
