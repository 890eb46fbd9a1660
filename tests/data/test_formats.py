"""Every input format, detection and override, meta and source, and each bad input's error message."""

import json

import pytest

from lrlhf.data.format_errors import DataFormatError, EmptyDatasetError
from lrlhf.data.formats import FORMATS, load_records
from lrlhf.data.records import PreferencePair, PromptExample, Ranking, SFTExample


def write(tmp_path, rows, name="data.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def load(tmp_path, rows, kind, **kwargs):
    return load_records(write(tmp_path, rows), kind, verbose=False, **kwargs)


def user(text):
    return {"role": "user", "content": text}


def bot(text):
    return {"role": "assistant", "content": text}


# --- SFT -----------------------------------------------------------------------------------------------


def test_messages_format_keeps_turns_and_extra_keys_in_meta(tmp_path):
    row = {"messages": [{"role": "system", "content": "be brief"}, user("hi"), bot("hello")], "id": 7}
    records, summary = load(tmp_path, [row], "sft")
    assert records == [SFTExample(messages=row["messages"], source="data.jsonl", meta={"id": 7})]
    assert summary.format == "messages"


def test_prompt_completion_strings_become_user_and_assistant_turns(tmp_path):
    records, summary = load(tmp_path, [{"prompt": "2+2?", "completion": "4"}], "sft")
    assert summary.format == "prompt_completion"
    assert records[0].messages == [user("2+2?"), bot("4")]


def test_prompt_completion_accepts_message_lists(tmp_path):
    row = {"prompt": [user("a"), bot("b"), user("c")], "completion": [bot("d")]}
    records, _ = load(tmp_path, [row], "sft")
    assert records[0].messages == [user("a"), bot("b"), user("c"), bot("d")]


def test_alpaca_joins_instruction_and_input_with_a_newline_and_adds_system(tmp_path):
    rows = [
        {"instruction": "Translate.", "input": "chat", "output": "cat", "system": "You translate."},
        {"instruction": "Say hi.", "input": "  ", "output": "hi"},
    ]
    records, summary = load(tmp_path, rows, "sft")
    assert summary.format == "alpaca"
    assert records[0].messages == [
        {"role": "system", "content": "You translate."},
        user("Translate.\nchat"),
        bot("cat"),
    ]
    assert records[1].messages == [user("Say hi."), bot("hi")]  # a blank input adds nothing


def test_alpaca_history_becomes_earlier_turns(tmp_path):
    row = {"instruction": "and 3?", "output": "9", "history": [["square of 2?", "4"]]}
    records, _ = load(tmp_path, [row], "sft")
    assert records[0].messages == [user("square of 2?"), bot("4"), user("and 3?"), bot("9")]


def test_sharegpt_maps_roles_and_aliases(tmp_path):
    row = {
        "conversations": [
            {"from": "system", "value": "s"},
            {"from": "human", "value": "q1"},
            {"from": "gpt", "value": "a1"},
            {"from": "user", "value": "q2"},
            {"from": "assistant", "value": "a2"},
        ]
    }
    records, summary = load(tmp_path, [row], "sft")
    assert summary.format == "sharegpt"
    assert records[0].messages == [
        {"role": "system", "content": "s"},
        user("q1"),
        bot("a1"),
        user("q2"),
        bot("a2"),
    ]


def test_self_instruct_uses_the_first_instance(tmp_path):
    row = {
        "id": "t1",
        "instruction": "Antonym?",
        "is_classification": False,
        "instances": [{"input": "hot", "output": "cold"}, {"input": "up", "output": "down"}],
    }
    records, summary = load(tmp_path, [row], "sft")
    assert summary.format == "self_instruct"
    assert records[0].messages == [user("Antonym?\nhot"), bot("cold")]
    assert records[0].meta == {"id": "t1", "is_classification": False}


def test_sft_with_blank_target_is_dropped_and_counted(tmp_path):
    records, summary = load(
        tmp_path, [{"prompt": "x", "completion": " "}, {"prompt": "y", "completion": "z"}], "sft"
    )
    assert len(records) == 1
    assert summary.dropped == {"empty_response": 1}
    assert (summary.read, summary.kept) == (2, 1)


# --- preferences ---------------------------------------------------------------------------------------


def test_pairwise_strings(tmp_path):
    records, summary = load(
        tmp_path, [{"prompt": "p", "chosen": "good", "rejected": "bad", "task": {"n": 3}}], "preference"
    )
    assert summary.format == "pairwise"
    assert records == [
        PreferencePair(
            prompt=[user("p")],
            chosen=[bot("good")],
            rejected=[bot("bad")],
            source="data.jsonl",
            meta={"task": {"n": 3}},
        )
    ]


def test_pairwise_tie_and_target(tmp_path):
    rows = [
        {"prompt": "p", "chosen": "a", "rejected": "b", "tie": True},
        {"prompt": "p", "chosen": "a", "rejected": "c", "target": 0.75},
        {"prompt": "p", "chosen": "a", "rejected": "d", "tie": False},
    ]
    records, _ = load(tmp_path, rows, "preference")
    assert [r.target for r in records] == [0.5, 0.75, 1.0]


def test_pairwise_full_conversations_with_a_prompt_key_drop_the_repeated_prompt(tmp_path):
    row = {"prompt": "q", "chosen": [user("q"), bot("good")], "rejected": [user("q"), bot("bad")]}
    records, _ = load(tmp_path, [row], "preference")
    assert (records[0].prompt, records[0].chosen, records[0].rejected) == (
        [user("q")],
        [bot("good")],
        [bot("bad")],
    )


def test_pairwise_full_conversations_without_prompt_share_the_prefix(tmp_path):
    shared = [user("q1"), bot("a1"), user("q2")]
    row = {"chosen": shared + [bot("good")], "rejected": shared + [bot("bad")]}
    records, _ = load(tmp_path, [row], "preference")
    assert records[0].prompt == shared
    assert (records[0].chosen, records[0].rejected) == ([bot("good")], [bot("bad")])


def test_pairwise_full_conversations_with_different_prefixes_are_dropped_as_no_shared_prefix(tmp_path):
    rows = [
        {"chosen": [user("q"), bot("x"), user("r"), bot("good")], "rejected": [user("q"), bot("bad")]},
        {"chosen": [user("q"), bot("good")], "rejected": [user("q"), bot("bad")]},
    ]
    records, summary = load(tmp_path, rows, "preference", format="pairwise")
    assert len(records) == 1
    assert summary.dropped == {"no_shared_prefix": 1}


HH_CHOSEN = "\n\nHuman: Hi there\n\nAssistant: Hello!\n\nHuman: Tell me a joke.\n\nAssistant: Why did the..."
HH_REJECTED = "\n\nHuman: Hi there\n\nAssistant: Hello!\n\nHuman: Tell me a joke.\n\nAssistant: No."


def test_hh_rlhf_prompt_is_the_text_up_to_the_last_assistant_turn(tmp_path):
    records, summary = load(tmp_path, [{"chosen": HH_CHOSEN, "rejected": HH_REJECTED}], "preference")
    assert summary.format == "hh_rlhf"
    assert records[0].prompt == [user("Hi there"), bot("Hello!"), user("Tell me a joke.")]
    assert records[0].chosen == [bot("Why did the...")]
    assert records[0].rejected == [bot("No.")]


def test_hh_rlhf_pair_without_shared_prefix_is_dropped_and_counted(tmp_path):
    # The sides diverge at the first assistant turn, and the chosen side goes on for another exchange:
    # the two last assistant turns answer different conversations.
    diverging = {
        "chosen": "\n\nHuman: q\n\nAssistant: a\n\nHuman: r\n\nAssistant: b",
        "rejected": "\n\nHuman: q\n\nAssistant: c",
    }
    rows = [diverging, {"chosen": HH_CHOSEN, "rejected": HH_REJECTED}]
    records, summary = load(tmp_path, rows, "preference")
    assert len(records) == 1
    assert summary.dropped == {"no_shared_prefix": 1}


def test_sharegpt_pairwise(tmp_path):
    row = {
        "conversations": [{"from": "human", "value": "q"}],
        "chosen": {"from": "gpt", "value": "good"},
        "rejected": {"from": "gpt", "value": "bad"},
    }
    records, summary = load(tmp_path, [row], "preference")
    assert summary.format == "sharegpt_pairwise"
    assert (records[0].prompt, records[0].chosen, records[0].rejected) == (
        [user("q")],
        [bot("good")],
        [bot("bad")],
    )


def test_identical_chosen_and_rejected_are_dropped_and_counted_unless_asked_to_keep(tmp_path):
    rows = [
        {"prompt": "p", "chosen": "same", "rejected": "same"},
        {"prompt": "p", "chosen": "a", "rejected": "b"},
    ]
    records, summary = load(tmp_path, rows, "preference")
    assert len(records) == 1
    assert summary.dropped == {"identical_chosen_rejected": 1}
    records, summary = load(tmp_path, rows, "preference", drop_identical=False)
    assert len(records) == 2 and summary.dropped == {}


# --- rankings and prompts ------------------------------------------------------------------------------


def test_ranking_with_ties(tmp_path):
    row = {"prompt": "p", "completions": ["a", [bot("b")], "c"], "ranks": [2, 1, 2]}
    records, summary = load(tmp_path, [row], "ranking")
    assert summary.format == "ranking"
    assert records == [
        Ranking(
            prompt=[user("p")],
            completions=[[bot("a")], [bot("b")], [bot("c")]],
            ranks=[2, 1, 2],
            source="data.jsonl",
        )
    ]


def test_a_ranking_whose_candidates_all_tie_is_dropped_and_counted(tmp_path):
    rows = [
        {"prompt": "p", "completions": ["a", "b", "c"], "ranks": [1, 1, 1]},  # no order: nothing to learn
        {"prompt": "q", "completions": ["a", "b", "c"], "ranks": [1, 1, 2]},  # two strict pairs and a tie
        {"prompt": "r", "completions": ["a", "b"], "ranks": [3, 3]},
    ]
    records, summary = load(tmp_path, rows, "ranking")
    assert [r.prompt for r in records] == [[user("q")]] and records[0].ranks == [1, 1, 2]
    assert (summary.read, summary.kept, summary.dropped) == (3, 1, {"all_ranks_tied": 2})


def test_a_ranking_file_in_which_every_candidate_ties_is_an_error(tmp_path):
    rows = [{"prompt": "p", "completions": ["a", "b", "c"], "ranks": [1, 1, 1]}] * 2
    with pytest.raises(EmptyDatasetError) as error:
        load(tmp_path, rows, ("preference", "ranking"))
    assert str(error.value) == (
        "data.jsonl: all 2 records were removed by filters (all_ranks_tied: 2); nothing is left"
    )


def test_a_ranking_with_some_ties_gives_its_strict_pairs_and_its_ties_as_ties(tmp_path):
    import torch

    from lrlhf.modules.rm import ranking_pairs

    rows = [{"prompt": "q", "completions": ["a", "b", "c"], "ranks": [1, 1, 2]}]
    records, _ = load(tmp_path, rows, "ranking")
    first, second, target = ranking_pairs(torch.tensor(records[0].ranks), torch.zeros(3, dtype=torch.long))
    pairs = {(int(f), int(s)): float(t) for f, s, t in zip(first, second, target, strict=True)}
    assert pairs == {(0, 1): 0.5, (0, 2): 1.0, (1, 2): 1.0}  # a and b tie, both beat c


@pytest.mark.parametrize("ranks", [[1], [-1, 1], [1, True], [1, 1.5]])  # 0-based ranks are read (#15)
def test_ranking_rejects_bad_ranks(tmp_path, ranks):
    with pytest.raises(DataFormatError, match=r"data\.jsonl:1: .*'ranks'"):
        load(tmp_path, [{"prompt": "p", "completions": ["a", "b"], "ranks": ranks}], "ranking")


def test_prompt_format_keeps_task_data_in_meta(tmp_path):
    row = {"prompt": "sort 3 1 2", "task": {"kind": "sort", "items": [3, 1, 2]}}
    records, summary = load(tmp_path, [row], "prompt")
    assert summary.format == "prompt"
    assert records == [
        PromptExample(
            prompt=[user("sort 3 1 2")],
            source="data.jsonl",
            meta={"task": {"kind": "sort", "items": [3, 1, 2]}},
        )
    ]


def test_prompt_kind_reads_sft_formats_up_to_the_last_assistant_turn(tmp_path):
    row = {"messages": [user("q1"), bot("a1"), user("q2"), bot("a2")]}
    records, summary = load(tmp_path, [row], "prompt")
    assert summary.format == "messages"
    assert records[0].prompt == [user("q1"), bot("a1"), user("q2")]


# --- detection and override ----------------------------------------------------------------------------


def test_override_reads_a_row_detection_would_give_another_format(tmp_path):
    # Detection sends string chosen/rejected without a prompt to hh_rlhf; forcing pairwise asks for a prompt.
    with pytest.raises(DataFormatError, match="field 'prompt' is missing"):
        load(tmp_path, [{"chosen": HH_CHOSEN, "rejected": HH_REJECTED}], "preference", format="pairwise")
    records, summary = load(
        tmp_path, [{"prompt": "q", "completion": "a"}], "prompt", format="prompt_completion"
    )
    assert summary.format == "prompt_completion" and records[0].prompt == [user("q")]


def test_detection_order_per_kind():
    assert list(FORMATS["sft"]) == ["messages", "sharegpt", "alpaca", "self_instruct", "prompt_completion"]
    assert list(FORMATS["preference"]) == ["sharegpt_pairwise", "hh_rlhf", "pairwise", "chosen_rejected_messages"]
    assert list(FORMATS["kto"]) == ["kto_messages", "kto"]


# --- bad input -----------------------------------------------------------------------------------------


def test_unknown_format_lists_the_supported_ones(tmp_path):
    with pytest.raises(DataFormatError) as error:
        load(tmp_path, [{"prompt": "p", "completion": "c"}], "sft", format="openai")
    assert str(error.value) == (
        "unknown sft format 'openai'; supported: auto, messages, sharegpt, alpaca, "
        "self_instruct, prompt_completion"
    )


def test_unknown_kind_lists_the_kinds(tmp_path):
    with pytest.raises(
        ValueError, match="unknown record kind 'dpo'; allowed: sft, preference, ranking, prompt"
    ):
        load(tmp_path, [{"prompt": "p"}], "dpo")


def test_undetectable_first_record_names_its_keys_and_the_formats(tmp_path):
    with pytest.raises(DataFormatError) as error:
        load(tmp_path, [{"question": "q", "answer": "a"}], "sft")
    message = str(error.value)
    assert message.startswith(f"{tmp_path / 'data.jsonl'}:1: cannot detect the sft format")
    assert "['answer', 'question']" in message and "alpaca (instruction, output; optional" in message


def test_missing_field_names_record_field_and_formats(tmp_path):
    rows = [{"instruction": "a", "output": "b"}, {"instruction": "c", "input": "d"}]
    with pytest.raises(DataFormatError) as error:
        load(tmp_path, rows, "sft")
    message = str(error.value)
    assert message.startswith(f"{tmp_path / 'data.jsonl'}:2: field 'output' is missing.")
    assert "Format alpaca (instruction, output; optional input, system, history)" in message
    assert "supported sft formats: messages (messages); sharegpt (conversations; optional system)" in message


def test_mistyped_field_names_record_field_and_type(tmp_path):
    with pytest.raises(
        DataFormatError, match=r"data\.jsonl:1: field 'chosen' must be a string or messages, got int"
    ):
        load(tmp_path, [{"prompt": "p", "chosen": 3, "rejected": "b"}], "preference")


def test_target_out_of_range(tmp_path):
    with pytest.raises(DataFormatError, match=r"field 'target' is 1\.5; allowed: a number in \[0, 1\]"):
        load(tmp_path, [{"prompt": "p", "chosen": "a", "rejected": "b", "target": 1.5}], "preference")


def test_unknown_sharegpt_role_names_record_and_allowed_values(tmp_path):
    row = {"conversations": [{"from": "human", "value": "q"}, {"from": "robot", "value": "beep"}]}
    with pytest.raises(DataFormatError) as error:
        load(tmp_path, [row], "sft")
    assert str(error.value).startswith(
        f"{tmp_path / 'data.jsonl'}:1: conversations[1].from is 'robot'; "
        "allowed values: human, user, gpt, assistant, system, function_call, observation."
    )


def test_unknown_message_role_names_allowed_roles(tmp_path):
    with pytest.raises(
        DataFormatError, match=r"messages\[1\]\.role is 'bot'; allowed roles: system, user, assistant"
    ):
        load(tmp_path, [{"messages": [user("q"), {"role": "bot", "content": "a"}]}], "sft")


@pytest.mark.parametrize(
    ("row", "kind", "expected"),
    [
        (
            {"messages": [user("q"), {"role": "system", "content": "s"}, bot("a")]},
            "sft",
            r"messages\[1\] is a system turn \(only first\)",
        ),
        ({"messages": [user("q"), bot("a"), user("r")]}, "sft", "messages must end with an assistant turn"),
        (
            {"prompt": [user("q"), bot("a")], "chosen": "x", "rejected": "y"},
            "preference",
            r"prompt must end with a user turn \(or a tool's answer\), ends with assistant",
        ),
        (
            {"prompt": "q", "chosen": [user("x")], "rejected": "y"},
            "preference",
            "chosen must start with an assistant turn, not user",
        ),
    ],
)
def test_invalid_role_sequences(tmp_path, row, kind, expected):
    with pytest.raises(DataFormatError, match=r"data\.jsonl:1: role sequence invalid: " + expected):
        load(tmp_path, [row], kind)


def test_empty_after_filtering_gives_the_count_per_filter(tmp_path):
    rows = [{"prompt": "p", "chosen": "s", "rejected": "s"}] * 2 + [
        {"chosen": [user("q"), bot("x"), user("r"), bot("a")], "rejected": [user("q"), bot("b")]}
    ]
    with pytest.raises(EmptyDatasetError) as error:
        load(tmp_path, rows, "preference", format="pairwise")
    assert str(error.value) == (
        "data.jsonl: all 3 records were removed by filters "
        "(identical_chosen_rejected: 2, no_shared_prefix: 1); nothing is left"
    )


def test_empty_file_is_an_error(tmp_path):
    with pytest.raises(EmptyDatasetError, match="data.jsonl: no records read"):
        load(tmp_path, [], "sft")


def test_load_records_prints_the_summary_when_verbose(tmp_path, capsys):
    load_records(write(tmp_path, [{"prompt": "q", "completion": "a"}]), "sft")
    assert capsys.readouterr().out.startswith("data summary: data.jsonl (sft, format prompt_completion)\n")


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"target": True}, "field 'target' must be a number in \\[0, 1\\], got bool"),
        ({"tie": True, "target": 0.9}, "fields 'tie' \\(true\\) and 'target' \\(0.9\\) disagree"),
        ({"tie": "yes"}, "field 'tie' must be true or false, got str"),
    ],
)
def test_bad_labels_are_named(tmp_path, extra, expected):
    with pytest.raises(DataFormatError, match=r"data\.jsonl:1: " + expected):
        load(tmp_path, [{"prompt": "p", "chosen": "a", "rejected": "b", **extra}], "preference")


def test_hh_transcript_without_markers_is_an_error(tmp_path):
    with pytest.raises(DataFormatError, match=r"data\.jsonl:1: field 'chosen' is not an HH transcript"):
        load(tmp_path, [{"chosen": "Human: hi Assistant: yo", "rejected": HH_REJECTED}], "preference")


# --- several kinds -------------------------------------------------------------------------------------


def test_several_kinds_read_the_first_that_matches(tmp_path):
    pair = {"prompt": "p", "chosen": "a", "rejected": "b"}
    ranking = {"prompt": "p", "completions": ["a", "b", "c"], "ranks": [1, 2, 2]}
    records, summary = load(tmp_path, [pair], ("preference", "ranking"))
    assert (summary.kind, summary.format) == ("preference", "pairwise") and isinstance(records[0], PreferencePair)
    records, summary = load(tmp_path, [ranking], ("preference", "ranking"))
    assert (summary.kind, summary.format) == ("ranking", "ranking")
    assert records[0].ranks == [1, 2, 2] and len(records[0].completions) == 3
    records, summary = load(tmp_path, [ranking], ("preference", "ranking"), format="ranking")
    assert summary.kind == "ranking"


def test_several_kinds_errors_name_every_kind(tmp_path):
    with pytest.raises(DataFormatError) as error:
        load(tmp_path, [{"question": "q"}], ("preference", "ranking"))
    message = str(error.value)
    assert message.startswith(f"{tmp_path / 'data.jsonl'}:1: cannot detect the preference or ranking format")
    assert "['question']" in message and "ranking: ranking (prompt, completions, ranks)" in message
    with pytest.raises(DataFormatError, match="unknown format 'alpaca' for preference or ranking records"):
        load(tmp_path, [{"question": "q"}], ("preference", "ranking"), format="alpaca")


# ------------------------------------------------------------------------ rankings wherever pairs are read
