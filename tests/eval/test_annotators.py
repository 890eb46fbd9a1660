"""The annotators of iterative RLHF (lrlhf.eval.annotators): the toy world's simulated label model, a judge, a
pairwise callable, and the file exchange with people (its bad lines name file and line)."""

import json
import random

import pytest

from lrlhf.data.records import PromptExample
from lrlhf.data.toy.annotators import AnnotatorConfig, label_probabilities
from lrlhf.data.toy.utility import gold_utility, response_tokens
from lrlhf.eval.annotators import (
    FileExchange,
    JudgeAnnotator,
    Pair,
    PairwiseAnnotator,
    SimulatedAnnotators,
    as_label,
    preference_record,
    read_labels,
)

TASK = {"kind": "count", "items": ["apple", "pig", "dog"]}
PROMPT = PromptExample([{"role": "user", "content": "how many items : apple pig dog"}], meta={"task": TASK})


def test_simulated_annotators_follow_the_world_label_model():
    # a clear gap (right count vs wrong), equal length: the label frequencies match the model's probabilities
    a, b = "3", "5"
    cfg = AnnotatorConfig()
    p_a, p_b, p_tie = label_probabilities(gold_utility(TASK, a), gold_utility(TASK, b), len(response_tokens(a)),
                                          len(response_tokens(b)), cfg)
    labels = SimulatedAnnotators(seed=0).label([Pair(PROMPT, a, b)] * 4000, round_index=2)
    n = len(labels)
    for value, p in ((1.0, p_a), (0.0, p_b), (0.5, p_tie)):
        share = labels.count(value) / n
        assert abs(share - p) <= 4 * (p * (1 - p) / n) ** 0.5 + 1e-9, (value, share, p)
    assert SimulatedAnnotators(seed=0).label([Pair(PROMPT, a, b)] * 50, 2) == labels[:50]  # seeded per round
    assert SimulatedAnnotators(seed=0).label([Pair(PROMPT, a, b)] * 50, 3) != labels[:50]
    with pytest.raises(ValueError, match="rounds.annotator: SimulatedAnnotators .* prompt 0 has no task"):
        SimulatedAnnotators().label([Pair(PromptExample(PROMPT.prompt), a, b)], 2)


def test_judge_and_pairwise_annotators():
    pairs = [Pair(PROMPT, "3", "5"), Pair(PROMPT, "5", "3"), Pair(PROMPT, "3", "3")]
    assert JudgeAnnotator("toy_gold").label(pairs, 2) == [1.0, 0.0, 0.5]

    def judge(prompt, a, b):
        return "tie" if a == b else "a" if a < b else "b"

    assert PairwiseAnnotator(judge).label(pairs, 2) == [1.0, 0.0, 0.5]
    with pytest.raises(ValueError, match="pair 0: label 'left' must be"):
        PairwiseAnnotator(lambda p, a, b: "left").label(pairs, 2)
    with pytest.raises(ValueError, match="rounds.annotator.tie_margin must be >= 0"):
        JudgeAnnotator("toy_gold", tie_margin=-1)


def test_preference_record_puts_the_preferred_response_first():
    pair = Pair(PROMPT, "3", "5")
    assert preference_record(pair, 1.0)["chosen"][0]["content"] == "3"
    flipped = preference_record(pair, 0.0, round=2)
    assert (flipped["chosen"][0]["content"], flipped["rejected"][0]["content"], flipped["target"]) == ("5", "3", 1.0)
    assert flipped["round"] == 2 and flipped["task"] == TASK and flipped["prompt"] == PROMPT.prompt
    assert preference_record(pair, 0.5)["target"] == 0.5


def test_file_exchange_writes_pairs_and_reads_labels(tmp_path):
    exchange = FileExchange(str(tmp_path), timeout_seconds=0)
    pairs = [Pair(PROMPT, "3", "5"), Pair(PROMPT, "4", "3"), Pair(PROMPT, "1", "2")]
    with pytest.raises(FileNotFoundError, match=r"label the 3 pairs of .*round_2.to_label.jsonl and write them to "
                                                r".*round_2.labelled"):
        exchange.label(pairs, 2)
    out, back = exchange.files(2)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["chosen"][0]["content"], r["label"]) for r in rows] == [(0, "3", None), (1, "4", None),
                                                                                 (2, "1", None)]
    rows[0]["label"], rows[1]["label"] = 1, 0  # pair 2 left unlabelled
    random.Random(0).shuffle(rows)
    back.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert exchange.label(pairs, 2) == [1.0, 0.0, None]


PAIRS = [Pair(PROMPT, "3", "5"), Pair(PROMPT, "4", "3")]


def _line(pair_id: int, label, chosen: str | None = None) -> str:
    pair = PAIRS[pair_id]
    return json.dumps({**preference_record(pair, 1.0), "id": pair_id, "label": label,
                       **({"chosen": [{"role": "assistant", "content": chosen}]} if chosen is not None else {})})


@pytest.mark.parametrize(("line", "message"), [
    ("{", "not JSON"),
    ('{"id": 7, "label": 1}', "`id` must be the id of one of the 2 pairs"),
    (_line(0, "maybe"), "label 'maybe' must be"),
    (_line(0, True), "label True must be"),
    (_line(0, [1]), r"label \[1\] must be"),
    (_line(0, 1, chosen="5"), "pair 0's `chosen` and `rejected` are not the responses written to label"),
])
def test_a_bad_labelled_line_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "labelled.jsonl"
    path.write_text(_line(1, 0.5) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=f"{path}:2: .*{message}"):
        read_labels(path, PAIRS)


def test_a_pair_labelled_twice_is_refused(tmp_path):
    path = tmp_path / "labelled.jsonl"
    path.write_text(_line(1, 0.5) + "\n" + _line(1, 1) + "\n")
    with pytest.raises(ValueError, match="labelled.jsonl:2: pair 1 is labelled twice"):
        read_labels(path, PAIRS)
    assert as_label("TIE", "x") == 0.5
