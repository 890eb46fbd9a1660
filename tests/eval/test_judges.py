"""Judges: pairwise judging randomises and undoes the A/B order; judges resolve from their config values."""

import pytest

from lrlhf.data.records import PromptExample
from lrlhf.eval.best_of_n import toy_gold_judge
from lrlhf.eval.judges import judge_pairs, resolve_judge, score_responses

PROMPT = PromptExample([{"role": "user", "content": "q"}])


class FirstPositionJudge:
    """A maximally position-biased pairwise judge: the first answer it sees always wins."""

    pairwise = True

    def __init__(self):
        self.seen = []

    def __call__(self, prompt, first, second):
        self.seen.append((first, second))
        return 1.0, 0.0


def test_pairwise_judge_sees_a_and_b_in_random_order_and_answers_are_unswapped():
    judge = FirstPositionJudge()
    n = 200
    a = [f"a{i}" for i in range(n)]
    b = [f"b{i}" for i in range(n)]
    u_a, u_b, swapped = judge_pairs([PROMPT] * n, a, b, judge, seed=3)
    for i in range(n):
        assert judge.seen[i] == ((b[i], a[i]) if swapped[i] else (a[i], b[i]))
        assert (u_a[i], u_b[i]) == ((0.0, 1.0) if swapped[i] else (1.0, 0.0))
    assert 70 <= sum(swapped) <= 130  # a fair coin: the bias splits between A and B (binomial sd 7)
    assert judge_pairs([PROMPT] * n, a, b, FirstPositionJudge(), seed=3)[2] == swapped  # seeded


def test_pointwise_judge_scores_each_response_alone():
    u_a, u_b, swapped = judge_pairs([PROMPT] * 2, ["x", "xyz"], ["xy", ""], lambda p, r: float(len(r)))
    assert (u_a, u_b, swapped) == ([1.0, 3.0], [2.0, 0.0], [False, False])
    with pytest.raises(ValueError, match="one each"):
        judge_pairs([PROMPT], ["x"], [], len)


def test_resolve_judge():
    assert resolve_judge("toy_gold") is toy_gold_judge
    assert resolve_judge("math:fabs")(-2.0) == 2.0
    assert resolve_judge(len) is len
    with pytest.raises(ValueError, match="eval.judge"):
        resolve_judge("nonsense")
    with pytest.raises(ValueError, match="eval.judge='math:nope'"):
        resolve_judge("math:nope")


class LengthBatch:
    """A pointwise judge that scores a batch at once (no ``__call__``)."""

    def score_batch(self, records, texts):
        return [len(t) for t in texts]


def test_one_resolver_for_eval_judge_and_the_early_stopping_utility():
    key = "callbacks.early_stopping.utility"
    assert resolve_judge("toy_gold", key=key) is toy_gold_judge
    batch = LengthBatch()
    assert resolve_judge(batch, key=key) is batch
    assert score_responses(batch, [PROMPT] * 2, ["ab", ""]) == [2.0, 0.0]
    assert score_responses(lambda p, r: len(r) + 1, [PROMPT] * 2, ["ab", ""]) == [3.0, 1.0]
    assert judge_pairs([PROMPT], ["abc"], ["a"], batch) == ([3.0], [1.0], [False])  # batch judges compare too
    with pytest.raises(ValueError, match=r"callbacks\.early_stopping\.utility must be toy_gold, rm:<folder> or "):
        resolve_judge("gold", key=key)
    with pytest.raises(ValueError, match=r"callbacks\.early_stopping\.utility must be .*score_batch; got 3"):
        resolve_judge(3, key=key)
    with pytest.raises(ValueError, match=r"callbacks\.early_stopping\.utility='math:pi' is not callable"):
        resolve_judge("math:pi", key=key)


# ---------------------------------------------------------------------------------- what a judge can see
def test_a_reward_model_judge_brings_its_stage_s_held_out_accuracy(tmp_path):
    import json

    from lrlhf.eval.best_of_n import toy_gold_judge
    from lrlhf.eval.judges import judge_accuracy

    stage = tmp_path / "judge_rm-abc"
    (stage / "model").mkdir(parents=True)
    (stage / "summary.json").write_text(json.dumps({"test/pair_accuracy": 0.61, "test/accuracy_interval": [0.55, 0.67],
                                                    "test/pairs": 240, "test/longer_wins": 0.52}))

    def judge(prompt, response):
        return 0.0

    judge.folder = str(stage / "model")  # as reward_model_judge marks the one it builds
    assert judge_accuracy(judge) == {"judge/accuracy": 0.61, "judge/accuracy_interval": [0.55, 0.67],
                                     "judge/pairs": 240, "judge/longer_wins": 0.52,
                                     "judge/source": str(stage / "summary.json")}
    judge.folder = str(tmp_path / "elsewhere")
    assert judge_accuracy(judge) == {"judge/accuracy": None}  # nothing known, said as such
    judge.heldout = {"accuracy": 0.7, "pairs": 50}  # a user's judge may carry its own figures
    assert judge_accuracy(judge)["judge/accuracy"] == 0.7 and judge_accuracy(judge)["judge/pairs"] == 50
    assert judge_accuracy(toy_gold_judge) == {}  # the toy world's gold is exact


@pytest.mark.parametrize(("figures", "warning"), [
    ({"judge/accuracy": 0.61, "judge/accuracy_interval": [0.55, 0.67], "judge/longer_wins": 0.52}, None),
    ({"judge/accuracy": 0.56, "judge/accuracy_interval": [0.50, 0.62], "judge/longer_wins": 0.40}, "chance"),
    ({"judge/accuracy": 0.56, "judge/accuracy_interval": [0.49, 0.62]}, "chance"),
    ({"judge/accuracy": 0.60, "judge/accuracy_interval": [0.51, 0.69], "judge/longer_wins": 0.60}, "length"),
    ({"judge/accuracy": 0.60, "judge/accuracy_interval": [0.51, 0.69], "judge/longer_wins": 0.601}, "length"),
    ({"judge/accuracy": None}, "not known"),
])
def test_the_verdict_line_says_what_the_judge_can_see_and_warns_near_chance(figures, warning):
    from lrlhf.utils.console import judge_lines

    text = "\n".join(judge_lines(figures))
    if figures["judge/accuracy"] is not None:
        assert f"held-out pairwise accuracy: {figures['judge/accuracy']:.3f}" in text
    assert ("cannot be told from chance" in text) == (warning == "chance")
    assert ("may measure length" in text) == (warning == "length")
    assert ("not known" in text) == (warning == "not known")
    assert judge_lines({"gold/sft": 0.5}) == []  # no judge, nothing said
