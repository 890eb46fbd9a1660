"""IFEval-style constraints (lrlhf.data.constraints): each kind's check on hand-written responses (one that meets
it, ones that do not, the edge a careless check gets wrong), the instruction wording, the world's files (every
prompt carries its constraint, the splits disjoint, the draw seeded), the rule reading the record, bad input."""

import json
import random

import pytest

from lrlhf.data.constraints import (
    KINDS,
    ConstraintsWorld,
    attach,
    constraint_judge,
    credit,
    draw,
    instruction,
    satisfied,
)

CASES = [  # (constraint, response, met)
    ({"kind": "lowercase"}, "all small letters here, 42 too.", True),
    ({"kind": "lowercase"}, "One capital.", False),
    ({"kind": "lowercase"}, "123 !!", False),  # no letters at all: not a lowercase English response
    ({"kind": "no_commas"}, "No commas in this one.", True),
    ({"kind": "no_commas"}, "One, comma.", False),
    ({"kind": "no_commas"}, "   ", False),  # empty
    ({"kind": "keyword", "word": "simple"}, "It is Simple enough.", True),
    ({"kind": "keyword", "word": "simple"}, "Simplest of all.", False),  # a whole word only
    ({"kind": "max_words", "n": 3}, "one two three", True),
    ({"kind": "max_words", "n": 3}, "one two three four", False),
    ({"kind": "max_words", "n": 3}, "", False),
    ({"kind": "end_phrase", "phrase": "That is all."}, "Done. That is all.  \n", True),
    ({"kind": "end_phrase", "phrase": "That is all."}, "That is all. More.", False),
    ({"kind": "quotation"}, '"wrapped"', True),
    ({"kind": "quotation"}, '"not wrapped', False),
    ({"kind": "quotation"}, '"', False),  # one mark is not a wrap
    ({"kind": "bullets", "n": 2}, "Intro\n* one\n- two\n", True),
    ({"kind": "bullets", "n": 2}, "* one\n* two\n* three", False),
    ({"kind": "bullets", "n": 2}, "* one *two*", False),
    ({"kind": "json"}, '{"a": 1}', True),
    ({"kind": "json"}, '```json\n{"a": [1, 2]}\n```', True),
    ({"kind": "json"}, "{'a': 1}", False),
    # the three disagreements with IFEval's own checker on 968 real answers (issue #48 item 5), as IFEval decides
    ({"kind": "json"}, '```Json\n{"name": "Ada", "born": 1815}\n```', True),  # a fence's tag in any case
    ({"kind": "keyword", "word": "indicator"}, "이 indicator를 보면 추세가 보입니다.", True),  # Korean after it
    ({"kind": "keyword", "word": "indicator"}, "The indicators agree.", False),  # still a whole word among Latin
    ({"kind": "end_phrase", "phrase": "Is there anything else I can help with?"},
     'Paris is the capital.\n\n"Is there anything else I can help with?"', True),  # the phrase in its quotes
    ({"kind": "end_phrase", "phrase": "Is there anything else I can help with?"},
     '"Paris. is there anything else i can help with?"', True),  # the whole answer quoted, another case
]


@pytest.mark.parametrize(("constraint", "response", "met"), CASES)
def test_each_kind_by_hand(constraint, response, met):
    assert satisfied(constraint, response) is met


def test_every_kind_has_cases_and_an_instruction():
    assert {c["kind"] for c, _, _ in CASES} == set(KINDS)
    for kind in KINDS:
        constraint = draw(random.Random(0), (kind,))
        assert constraint["kind"] == kind and instruction(constraint)
        assert attach("Say hi.", constraint) == f"Say hi.\n\n{instruction(constraint)}"
    with pytest.raises(ValueError, match="unknown constraint kind 'shout'"):
        satisfied({"kind": "shout"}, "HI")


def test_the_judge_reads_the_record_and_names_a_record_without_one():
    assert constraint_judge({"constraint": {"kind": "no_commas"}}, "fine") == 1.0
    with pytest.raises(ValueError, match="has no constraint"):
        constraint_judge({"answer": "#### 3"}, "fine")


def test_the_rule_reads_the_prompt_record():
    from lrlhf.rewards.constraint_reward import InstructionConstraint
    from lrlhf.rewards.rules import RuleReward

    reward = RuleReward(rules=[InstructionConstraint()])
    meta = [{"constraint": {"kind": "lowercase"}}, {"constraint": {"kind": "max_words", "n": 2}}]
    scores, components = reward.score_records(["p", "q"], ["all lower", "three words here"], meta)
    assert scores == [1.0, 0.0] and components == {"constraint": [1.0, 0.0]}
    with pytest.raises(ValueError, match="reward rule 'constraint' on the response 'x'"):
        reward.score_records(["p"], ["x"], None)


PARTIAL = [  # (constraint, a response that does not meet it, its credit by hand)
    ({"kind": "lowercase"}, "One Capital in twenty letters here", 0.45 * 27 / 29),  # 29 letters, 2 capitals
    ({"kind": "no_commas"}, "a, b, c", 0.45 / 2),
    ({"kind": "max_words", "n": 3}, "one two three four five six", 0.45 * 3 / 6),
    ({"kind": "max_words", "n": 3}, "", 0.0),
    ({"kind": "end_phrase", "phrase": "That is all."}, "That is all. More.", 0.45),  # there, but not last
    ({"kind": "end_phrase", "phrase": "That is all."}, "Well, it is all", 0.15 * 2 / 3),  # is, all among the last 3
    ({"kind": "end_phrase", "phrase": "That is all."}, "Nothing like it", 0.0),
    ({"kind": "quotation"}, '"opened only', 0.2),
    ({"kind": "quotation"}, 'closed only"', 0.2),
    ({"kind": "quotation"}, "bare", 0.0),
    ({"kind": "bullets", "n": 2}, "* one\n* two\n* three", 0.3),
    ({"kind": "bullets", "n": 2}, "no list", 0.0),
    ({"kind": "json"}, "{'a': 1}", 0.2),  # braces, but not JSON
    ({"kind": "json"}, "plain words", 0.0),
    ({"kind": "keyword", "word": "simple"}, "Simplest of all.", 0.0),
]


@pytest.mark.parametrize(("constraint", "response", "expected"), PARTIAL)
def test_partial_credit_by_hand(constraint, response, expected):
    assert credit(constraint, response) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(("constraint", "response", "met"), CASES)
def test_partial_credit_is_one_exactly_when_met(constraint, response, met):
    value = credit(constraint, response)
    assert value == 1.0 if met else 0.0 <= value < 0.5


def test_the_rule_gives_partial_credit_when_asked():
    from lrlhf.rewards.constraint_reward import InstructionConstraint
    from lrlhf.rewards.rules import RuleReward

    meta = [{"constraint": {"kind": "quotation"}}, {"constraint": {"kind": "quotation"}}]
    responses = ['"wrapped"', '"half']
    assert RuleReward(rules=[InstructionConstraint(partial=True)]).score_records(["p", "q"], responses, meta)[0] == [
        1.0, 0.2]
    assert RuleReward(rules=[InstructionConstraint()]).score_records(["p", "q"], responses, meta)[0] == [1.0, 0.0]


def _write_sources(tmp_path, n=40):
    alpaca = tmp_path / "alpaca.json"
    alpaca.write_text(json.dumps([{"instruction": f"Task {i}.", "input": "" if i % 4 else "with input",
                                   "output": f"Answer {i}."} for i in range(n)]))
    seed = tmp_path / "seed.jsonl"
    seed.write_text("".join(json.dumps({"instruction": f"Seed {i}.", "instances": [{"input": "", "output": "o"}]})
                            + "\n" for i in range(n // 2)))
    return alpaca, seed


def test_the_world_writes_each_prompt_with_its_constraint(tmp_path):
    alpaca, seed = _write_sources(tmp_path)
    world = ConstraintsWorld(alpaca=str(alpaca), self_instruct=str(seed), val_prompts=4, eval_share=0.25)
    world.check()
    world.build(tmp_path / "w")
    files = {name: [json.loads(x) for x in (tmp_path / "w" / f"{name}.jsonl").read_text().splitlines()]
             for name in ConstraintsWorld.FILES}
    assert {k: len(v) for k, v in files.items()} == {"sft_train": 34, "sft_val": 4, "rl_prompts": 34,
                                                     "eval_prompts": 12}  # 30 alpaca without input + 20 seed tasks
    prompts = {name: [(r.get("prompt") or r.get("messages"))[0]["content"] for r in rows]
               for name, rows in files.items()}
    assert not set(prompts["rl_prompts"]) & set(prompts["eval_prompts"])
    assert not set(prompts["sft_val"]) & (set(prompts["rl_prompts"]) | set(prompts["eval_prompts"]))
    for row in files["rl_prompts"] + files["eval_prompts"]:
        assert row["prompt"][0]["content"].endswith(instruction(row["constraint"]))
    again = ConstraintsWorld(alpaca=str(alpaca), self_instruct=str(seed), val_prompts=4, eval_share=0.25)
    again.build(tmp_path / "w2")
    assert (tmp_path / "w2" / "eval_prompts.jsonl").read_text() == (tmp_path / "w" / "eval_prompts.jsonl").read_text()
    assert world.key() == again.key() != ConstraintsWorld(alpaca=str(alpaca), self_instruct=str(seed), seed=1).key()


def test_bad_world_settings_name_the_key(tmp_path):
    with pytest.raises(ValueError, match="world.kinds"):
        ConstraintsWorld(alpaca="x", kinds=("shout",))
    with pytest.raises(ValueError, match="both null"):
        ConstraintsWorld()
    with pytest.raises(FileNotFoundError, match="world.alpaca='missing.json'"):
        ConstraintsWorld(alpaca="missing.json").check()


# ------------------------------------------------------------------------------------------ the edges
KNOWN = "lowercase, no_commas, keyword, max_words, end_phrase, quotation, bullets, json"


def test_the_draw_covers_each_parameter_choice():
    drawn = [draw(random.Random(seed), ("max_words", "bullets")) for seed in range(200)]
    assert {c["n"] for c in drawn if c["kind"] == "max_words"} == {10, 15, 20}
    assert {c["n"] for c in drawn if c["kind"] == "bullets"} == {2, 3}


def test_the_instructions_word_for_word():
    assert instruction({"kind": "lowercase"}) == ("Your entire response should be in English, and in all lowercase "
                                                  "letters. No capital letters are allowed.")
    assert instruction({"kind": "no_commas"}) == "In your entire response, refrain from the use of any commas."
    assert instruction({"kind": "keyword", "word": "today"}) == 'Include the keyword "today" in the response.'
    assert instruction({"kind": "max_words", "n": 15}) == "Answer with at most 15 words."
    assert instruction({"kind": "end_phrase", "phrase": "That is all."}) == (
        'Finish your response with this exact phrase "That is all.". No other words should follow this phrase.')
    assert instruction({"kind": "quotation"}) == "Wrap your entire response with double quotation marks."
    assert instruction({"kind": "bullets", "n": 3}) == (
        "Your answer must contain exactly 3 bullet points. Use the markdown bullet points such as:\n"
        "* This is point 1.\n* This is point 2")
    assert instruction({"kind": "json"}) == ("Entire output should be wrapped in JSON format. You can use markdown "
                                             "ticks such as ```.")


def test_an_unknown_kind_is_named_with_the_known_ones():
    for check in (instruction, lambda c: satisfied(c, "HI")):
        with pytest.raises(ValueError) as error:
            check({"kind": "shout"})
        assert str(error.value) == f"unknown constraint kind 'shout'; known: {KNOWN}"


def test_the_edges_of_the_checks():
    assert satisfied({"kind": "max_words", "n": 3}, "Hello.")  # one word is an answer
    assert satisfied({"kind": "quotation"}, '""')  # two marks wrap an empty response
    assert satisfied({"kind": "end_phrase", "phrase": "Sent from my iPhone X"}, "Bye.\nSent from my iPhone X")
    assert not satisfied({"kind": "end_phrase", "phrase": "That is all."}, '"Done. That is all."X')


def test_partial_credit_reads_every_line():
    assert credit({"kind": "bullets", "n": 2}, "Intro\n* one") == 0.3  # a bullet on a later line
    assert credit({"kind": "json"}, "{\n'a': 1\n}") == 0.2  # brackets on different lines


def test_attach_strips_only_the_prompts_end():
    constraint = {"kind": "quotation"}
    assert attach("  Say hi. \n", constraint) == f"  Say hi.\n\n{instruction(constraint)}"


def test_the_judge_reads_a_records_meta_and_names_itself():
    from lrlhf.data.records import PromptExample

    record = PromptExample([{"role": "user", "content": "Say hi."}], meta={"constraint": {"kind": "no_commas"}})
    assert constraint_judge(record, "hi there") == 1.0 and constraint_judge(record, "hi, there") == 0.0
    with pytest.raises(ValueError) as error:
        constraint_judge(PromptExample([{"role": "user", "content": "Say hi."}]), "hi")
    assert str(error.value) == ("judge lrlhf.data.constraints:constraint_judge: the prompt record has no constraint "
                                f"(meta.constraint with a kind of {KNOWN}): world=constraints writes one per prompt")


def test_bad_world_settings_word_for_word():
    with pytest.raises(ValueError) as error:
        ConstraintsWorld(alpaca="x", kinds=("shout", "json"))
    assert str(error.value) == f"world.kinds: ['shout']: choose among {KNOWN}"
    with pytest.raises(ValueError) as error:
        ConstraintsWorld(alpaca="x", kinds=())
    assert str(error.value) == f"world.kinds: empty: choose among {KNOWN}"
    for share in (0, 1, 1.5):
        with pytest.raises(ValueError) as error:
            ConstraintsWorld(alpaca="x", eval_share=share)
        assert str(error.value) == f"world.eval_share must be in (0, 1), got {share}"
    with pytest.raises(ValueError) as error:
        ConstraintsWorld()
    assert str(error.value) == "world.alpaca and world.self_instruct are both null: give at least one prompt source"


def test_the_world_needs_a_prompt_left_for_rl(tmp_path):
    alpaca, seed = _write_sources(tmp_path)  # 50 prompts, 12 of them held out
    with pytest.raises(ValueError) as error:
        ConstraintsWorld(alpaca=str(alpaca), self_instruct=str(seed), val_prompts=38).build(tmp_path / "w")
    assert str(error.value) == "50 prompts: too few for eval_share=0.25 and val_prompts=38"
    ConstraintsWorld(alpaca=str(alpaca), self_instruct=str(seed), val_prompts=37).build(tmp_path / "w")
    assert len((tmp_path / "w" / "rl_prompts.jsonl").read_text().splitlines()) == 1


def test_the_worlds_records_and_report(tmp_path):
    alpaca, seed = _write_sources(tmp_path)
    world = ConstraintsWorld(alpaca=str(alpaca), self_instruct=str(seed), kinds=("no_commas", "json"),
                             eval_share=0.01, val_prompts=4)  # 0.5 of a prompt held out: still one
    world.build(tmp_path / "w")
    files = {name: [json.loads(x) for x in (tmp_path / "w" / f"{name}.jsonl").read_text().splitlines()]
             for name in ConstraintsWorld.FILES}
    assert {k: len(v) for k, v in files.items()} == {"sft_train": 45, "sft_val": 4, "rl_prompts": 45,
                                                     "eval_prompts": 1}
    for row in files["rl_prompts"] + files["eval_prompts"]:
        assert row["constraint"]["kind"] in ("no_commas", "json")
        assert row["prompt"] == [{"role": "user", "content": attach(row["prompt"][0]["content"].split("\n\n")[0],
                                                                     row["constraint"])}]
    answers = {f"Task {i}.": f"Answer {i}." for i in range(40)} | {f"Seed {i}.": "o" for i in range(20)}
    for row in files["sft_train"] + files["sft_val"]:
        user, assistant = row["messages"]
        assert user == {"role": "user", "content": attach(user["content"].split("\n\n")[0], row["constraint"])}
        assert assistant == {"role": "assistant", "content": answers[user["content"].split("\n\n")[0]]}
    report = json.loads((tmp_path / "w" / "world.json").read_text())
    kinds = [row["constraint"]["kind"] for row in files["eval_prompts"]]
    assert report["prompts"] == 50
    assert report["eval_kinds"] == {"no_commas": kinds.count("no_commas"), "json": kinds.count("json")}
