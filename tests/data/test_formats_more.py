"""The formats users have (#15 item 3): LLaMA-Factory v1 typed parts with loss_weight, chosen_messages /
rejected_messages, KTO (never SFT by accident), tool-call roles, 0-based ranks, HH pairs as prompts. Each is read
into a normalised record checked against its source, or refused naming file, line and field."""

import dataclasses
import json

import pytest

from lrlhf.data.format_errors import DataFormatError
from lrlhf.data.formats import load_records
from lrlhf.data.records import PreferencePair, PromptExample, Ranking, UnpairedExample
from lrlhf.data.tokenize import ChatTemplateError, encode_ranking, encode_sft

from .conftest import make_tokenizer


def _file(tmp_path, name, rows):
    path = tmp_path / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _text(value):
    return [{"type": "text", "value": value}]


V1_SFT = {"messages": [
    {"role": "user", "content": _text("hi"), "loss_weight": 0.0},
    {"role": "assistant", "content": [{"type": "text", "value": "hello"}, {"type": "text", "text": " a"}],
     "loss_weight": 1.0},
    {"role": "user", "content": _text("how"), "loss_weight": 0.0},
    {"role": "assistant", "content": _text("b"), "loss_weight": 0.0},
    {"role": "user", "content": _text("what"), "loss_weight": 0.0},
    {"role": "assistant", "content": _text("fine"), "loss_weight": 1.0},
    {"role": "user", "content": _text("bye"), "loss_weight": 0.0},
    {"role": "assistant", "content": _text("ok"), "loss_weight": 0.0}]}


def test_typed_parts_are_joined_and_loss_weight_is_the_target_mask(tmp_path, chatml):
    (record,), summary = load_records(_file(tmp_path, "v1_sft_demo.jsonl", [V1_SFT]), "sft", verbose=False)
    assert summary.format == "messages"
    # the turns after the last supervised one are cut; the parts of one content are joined
    assert record.messages == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello a"},
                               {"role": "user", "content": "how"}, {"role": "assistant", "content": "b"},
                               {"role": "user", "content": "what"}, {"role": "assistant", "content": "fine"}]
    assert record.meta == {"loss_weights": [0.0, 1.0, 0.0, 0.0, 0.0, 1.0]}
    for loss_on in ("last", "all"):  # loss_weight decides, whatever loss_on says
        encoded = encode_sft(chatml, record, max_length=64, loss_on=loss_on)
        targets = [t for t, m in zip(chatml.convert_ids_to_tokens(encoded.input_ids.tolist()),
                                     encoded.loss_mask.tolist(), strict=True) if m]
        assert targets == ["hello", "a", "<|im_end|>", "fine", "<|im_end|>"], loss_on


def test_v1_records_that_cannot_be_read_are_named(tmp_path):
    image = {"messages": [{"role": "user", "content": [{"type": "image_url", "value": "x.png"}]},
                          {"role": "assistant", "content": _text("a")}]}
    with pytest.raises(DataFormatError, match=r"v1\.jsonl:1: messages\[0\]\.content\[0\]\.type is 'image_url'; "
                                              r"only text parts are read"):
        load_records(_file(tmp_path, "v1.jsonl", [image]), "sft", verbose=False)
    unsupervised = {"messages": [{"role": "user", "content": "hi", "loss_weight": 0},
                                 {"role": "assistant", "content": "a", "loss_weight": 0}]}
    with pytest.raises(DataFormatError, match=r"v1\.jsonl:2: no assistant turn has loss_weight > 0"):
        load_records(_file(tmp_path, "v1.jsonl", [V1_SFT, unsupervised]), "sft", verbose=False)


def test_chosen_and_rejected_messages_are_a_pair_and_its_prompt(tmp_path):
    row = {"chosen_messages": [{"role": "user", "content": _text("hi"), "loss_weight": 0.0},
                               {"role": "assistant", "content": _text("hello"), "loss_weight": 1.0}],
           "rejected_messages": [{"role": "user", "content": _text("hi"), "loss_weight": 0.0},
                                 {"role": "assistant", "content": _text("bye"), "loss_weight": 1.0}]}
    path = _file(tmp_path, "v1_dpo_demo.jsonl", [row])
    (pair,), summary = load_records(path, "preference", verbose=False)
    assert summary.format == "chosen_rejected_messages"
    assert pair == PreferencePair([{"role": "user", "content": "hi"}], [{"role": "assistant", "content": "hello"}],
                                  [{"role": "assistant", "content": "bye"}], 1.0, "v1_dpo_demo.jsonl", {})
    (prompt,), _ = load_records(path, "prompt", verbose=False)
    assert prompt == PromptExample([{"role": "user", "content": "hi"}], "v1_dpo_demo.jsonl", {})


def test_hh_pairs_serve_as_rl_prompts(tmp_path):
    row = {"chosen": "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how\n\nAssistant: fine",
           "rejected": "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how\n\nAssistant: bye"}
    (prompt,), summary = load_records(_file(tmp_path, "hh.jsonl", [row]), "prompt", verbose=False)
    assert summary.format == "hh_rlhf"
    assert prompt.prompt == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                             {"role": "user", "content": "how"}]


def test_kto_is_its_own_kind_and_never_sft_data(tmp_path):
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "bye"}],
             "label": False}]
    path = _file(tmp_path, "kto_en_demo.jsonl", rows)
    (record,), summary = load_records(path, "kto", verbose=False)
    assert summary.format == "kto_messages"
    assert record == UnpairedExample([{"role": "user", "content": "hi"}], [{"role": "assistant", "content": "bye"}],
                                     False, "kto_en_demo.jsonl", {})
    with pytest.raises(DataFormatError, match=r"kto_en_demo\.jsonl:1: this is a KTO record .*read it as kind 'kto'"):
        load_records(path, "sft", verbose=False)  # before: read as SFT, the undesirable answer a target
    trl = _file(tmp_path, "kto_trl.jsonl", [{"prompt": "hi", "completion": "ok", "label": True}])
    (record,), summary = load_records(trl, "kto", verbose=False)
    assert summary.format == "kto" and record.label is True and record.completion[0]["content"] == "ok"
    with pytest.raises(DataFormatError, match=r"kto_bad\.jsonl:1: field 'label' must be true \(desirable\)"):
        load_records(_file(tmp_path, "kto_bad.jsonl", [{"prompt": "hi", "completion": "ok", "label": 1}]), "kto",
                     verbose=False)


TOOLS_ROW = {"conversations": [{"from": "human", "value": "what is two plus three"},
                               {"from": "function_call", "value": '{"name": "add", "arguments": {"a": 2, "b": 3}}'},
                               {"from": "observation", "value": "five"},
                               {"from": "gpt", "value": "five"}],
             "tools": '[{"name": "add"}]'}


def test_tool_calls_map_to_the_templates_tool_role_or_are_refused(tmp_path, chatml):
    (record,), _ = load_records(_file(tmp_path, "glaive_toolcall.jsonl", [TOOLS_ROW]), "sft", verbose=False)
    assert [m["role"] for m in record.messages] == ["user", "assistant", "tool", "assistant"]
    assert record.messages[2]["content"] == "five" and record.meta == {"tools": '[{"name": "add"}]'}
    encoded = encode_sft(chatml, dataclasses.replace(record, meta={}), max_length=64)  # ChatML writes any role
    assert encoded is not None  # (its tools: test_tool_schemas_are_rendered_...)
    no_tool = make_tokenizer(
        "{% for m in messages %}{% if m['role'] == 'user' %}User : {{ m['content'] }}\n{% elif m['role'] == "
        "'assistant' %}Assistant : {{ m['content'] }}\n{% endif %}{% endfor %}", eos="</s>")
    with pytest.raises(ChatTemplateError, match="has no tool role: a tool's answer"):
        encode_sft(no_tool, dataclasses.replace(record, meta={}), max_length=64)


def test_zero_based_ranks_order_like_one_based_ones(tmp_path, chatml):
    rows = [{"prompt": "hi", "completions": ["a", "b", "c"], "ranks": [1, 0, 2]}]
    (ranking,), _ = load_records(_file(tmp_path, "ranks.jsonl", rows), "ranking", verbose=False)
    assert ranking == Ranking([{"role": "user", "content": "hi"}], [[{"role": "assistant", "content": t}]
                                                                    for t in "abc"], [1, 0, 2], "ranks.jsonl", {})
    assert encode_ranking(chatml, ranking, max_length=32).ranks == [1, 0, 2]
    with pytest.raises(DataFormatError, match=r"ranks\.jsonl:1: field 'ranks' is \[1, -1\]; allowed: integers >= 0"):
        load_records(_file(tmp_path, "ranks.jsonl", [{"prompt": "hi", "completions": ["a", "b"], "ranks": [1, -1]}]),
                     "ranking", verbose=False)


TOOLS_TEMPLATE = ("{% if tools %}<tools>{{ tools | tojson }}</tools>\n{% endif %}{% for m in messages %}<|im_start|>"
                  "{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
                  "<|im_start|>assistant\n{% endif %}")


def test_tool_schemas_are_rendered_by_the_template_or_refused_with_the_count(tmp_path, chatml):
    # #36 item 5: ShareGPT 'tools' were kept aside in meta and never reached the encoded text (300 of 300)
    from lrlhf.data.datamodules import SFTDataModule
    from lrlhf.data.tokenize import renders_tools, with_tools

    path = _file(tmp_path, "glaive_toolcall.jsonl", [TOOLS_ROW, {**TOOLS_ROW, "tools": ""}])
    (record, plain), _ = load_records(path, "sft", verbose=False)
    tools = make_tokenizer(TOOLS_TEMPLATE, eos="<|im_end|>")
    assert renders_tools(tools) and not renders_tools(chatml)
    rendered = with_tools(tools, record.meta).apply_chat_template(record.messages, tokenize=False)
    assert rendered.startswith('<tools>[{"name": "add"}]</tools>\n<|im_start|>user\nwhat is two plus three')
    encoded = encode_sft(tools, record, max_length=128)  # the ids of that text, the schemas in them
    assert encoded.input_ids.tolist() == tools(rendered, add_special_tokens=False)["input_ids"]
    assert tools.decode(encoded.input_ids[encoded.loss_mask]).split() == ["five", "<|im_end|>"]  # targets as before
    bare = tools.apply_chat_template(plain.messages, tokenize=False)  # a record without tools: no <tools> block
    assert encode_sft(tools, plain, max_length=128).input_ids.tolist() == tools(bare, add_special_tokens=False)[
        "input_ids"] and not bare.startswith("<tools>")
    with pytest.raises(ChatTemplateError, match="does not render tool schemas"):
        encode_sft(chatml, record, max_length=128)
    dm = SFTDataModule(chatml, train=path, batch_size=2, max_length=128)
    with pytest.raises(ValueError, match=r"train split: 1 of 2 records carry tool schemas \('tools'\)"):
        dm.setup("fit")


def test_a_persons_label_decides_a_pair_and_null_drops_it(tmp_path):
    """Issue #49: `label` (what `lrlhf label` writes) was never read: a file labelled "rejected is better" trained
    as chosen-wins, and unlabelled pairs trained too."""
    rows = [{"prompt": "q0", "chosen": "a", "rejected": "b", "target": 1.0, "label": 0},  # over the input's target
            {"prompt": "q1", "chosen": "a", "rejected": "b", "label": None},  # nobody labelled it
            {"prompt": "q2", "chosen": "a", "rejected": "b", "label": 0.5, "tie": False},  # over tie
            {"prompt": "q3", "chosen": "a", "rejected": "b", "label": "A"},
            {"prompt": "q4", "chosen": "a", "rejected": "b", "target": 0.7}]  # no label: the target as before
    path = _file(tmp_path, "labelled.jsonl", rows)
    pairs, summary = load_records(path, "preference", verbose=False)
    assert [(p.prompt[0]["content"], p.chosen[0]["content"], p.target, p.labelled) for p in pairs] == [
        ("q0", "b", 1.0, True), ("q2", "a", 0.5, True), ("q3", "a", 1.0, True), ("q4", "a", 0.7, False)]
    assert summary.dropped == {"unlabelled": 1} and summary.labelled == 3
    assert "kept pairs labelled by people" in str(summary) and summary.as_dict()["labelled"] == 3
    # written back (a world's splits), the pairs read as labelled again, the same way round
    from lrlhf.data.formats import write_jsonl

    again, summary = load_records(write_jsonl(pairs, tmp_path / "split.jsonl"), "preference", verbose=False)
    assert [(p.chosen, p.target, p.labelled) for p in again] == [(p.chosen, p.target, p.labelled) for p in pairs]
    assert summary.labelled == 3
    bad = _file(tmp_path, "bad.jsonl", [{"prompt": "q", "chosen": "a", "rejected": "b", "label": True}])
    with pytest.raises(DataFormatError, match=r"bad\.jsonl:1: field label True must be 1 \(a / chosen preferred\)"):
        load_records(bad, "preference", verbose=False)


def test_a_blank_preferred_answer_is_dropped_and_counted(tmp_path):
    rows = [{"prompt": "q0", "chosen": "  ", "rejected": "b"}, {"prompt": "q1", "chosen": "a", "rejected": ""},
            {"prompt": "q2", "chosen": "", "rejected": "b", "label": 0}]
    pairs, summary = load_records(_file(tmp_path, "blank.jsonl", rows), "preference", verbose=False)
    assert [p.prompt[0]["content"] for p in pairs] == ["q1", "q2"] and summary.dropped == {"empty_chosen": 1}


def test_ranking_pairs_put_the_better_completion_first():
    from lrlhf.data.records import as_pairs, ranking_pairs

    user = [{"role": "user", "content": "q"}]
    answers = [[{"role": "assistant", "content": c}] for c in "abcd"]
    ranking = Ranking(user, answers, [2, 1, 3, 1], source="s", meta={"group": "g"})
    got = [(p.chosen[0]["content"], p.rejected[0]["content"]) for p in ranking_pairs(ranking)]
    # (a,b): b better; (a,c); (a,d): d better; (b,c); (b,d) tie: none; (c,d): d better
    assert got == [("b", "a"), ("a", "c"), ("d", "a"), ("b", "c"), ("d", "c")]
    pairs = ranking_pairs(ranking)
    assert all(p.target == 1.0 and p.prompt == user and p.source == "s" and p.meta["group"] == "g" for p in pairs)
    assert [p.meta["ranking_pair"] for p in pairs] == [[1, 0], [0, 2], [3, 0], [1, 2], [3, 2]]
    (extremes,) = ranking_pairs(ranking, "extremes")
    assert (extremes.chosen[0]["content"], extremes.rejected[0]["content"]) == ("b", "c")
    assert ranking_pairs(Ranking(user, answers[:2], [1, 1]), "extremes") == []  # all tied: orders nothing
    pair = PreferencePair(user, answers[0], answers[1])
    assert as_pairs([pair, ranking], "extremes") == [pair, extremes]
    with pytest.raises(ValueError, match="which must be 'all' or 'extremes', got 'best'"):
        ranking_pairs(ranking, "best")


def test_equal_scores_are_a_tie_and_a_lower_scored_chosen_is_refused(tmp_path):
    # #36 item 5: UltraFeedback-style rows (score_chosen 7.0, score_rejected 7.0) were read as "chosen wins"
    path = tmp_path / "uf.jsonl"
    rows = [{"prompt": "q", "chosen": "a", "rejected": "b", "score_chosen": 7.0, "score_rejected": 7.0},
            {"prompt": "q2", "chosen": "a", "rejected": "b", "score_chosen": 8.5, "score_rejected": 6},
            {"prompt": "q3", "chosen": "a", "rejected": "b", "score_chosen": 7, "score_rejected": 7, "target": 0.8}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs, _ = load_records(str(path), "preference", verbose=False)
    assert [p.target for p in pairs] == [0.5, 1.0, 0.8]  # an explicit target wins over the scores
    assert all("score_chosen" not in p.meta for p in pairs)  # read as labels, not carried as meta
    path.write_text(json.dumps({"prompt": "q", "chosen": "a", "rejected": "b", "score_chosen": 3,
                                "score_rejected": 7.5}) + "\n")
    with pytest.raises(DataFormatError, match=r"uf.jsonl:1: field 'score_chosen' \(3\) is below 'score_rejected'"):
        load_records(str(path), "preference", verbose=False)
