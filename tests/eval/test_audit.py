"""The high-reward audit table: its columns, the top-k order, counterfactual deltas by hand."""

from lrlhf.data.records import PromptExample
from lrlhf.eval.audit import audit_markdown, audit_rows
from lrlhf.eval.counterfactual import PadFiller, Truncate


def test_audit_rows_by_hand():
    prompts = [PromptExample([{"role": "user", "content": f"q{i}"}]) for i in range(4)]
    responses = ["a b c d", "x", "y y", "z"]
    rewards = [0.5, 2.0, 1.0, -1.0]

    def rescore(indices, texts):  # a reward of 0.1 per word plus the sample's index
        return [0.1 * len(t.split()) + i for i, t in zip(indices, texts, strict=True)]

    def judge(prompts, responses):  # a batch scorer
        return [-float(len(r.split())) for r in responses]

    columns, rows = audit_rows(prompts, responses, rewards, [4, 1, 2, 1], rescore, disagreement=[0.1, 0.2, 0.3, 0.4],
                               judge=judge, transforms=(PadFiller("pad", times=3), Truncate(0.5)), top_k=3)
    assert columns == ["rank", "reward", "disagreement", "length", "judge", "d_pad_filler", "d_truncate_50%",
                       "prompt", "response"]
    assert [r[0] for r in rows] == [1, 2, 3] and [r[-1] for r in rows] == ["x", "y y", "a b c d"]  # by reward
    best, second, third = rows
    assert best[1:5] == [2.0, 0.2, 1, -1.0] and best[-2] == "q1"
    assert abs(best[5] - 0.3) < 1e-12 and best[6] is None  # three pad words; one word cannot be truncated
    assert abs(second[6] - (-0.1)) < 1e-12  # "y y" -> "y"
    assert abs(third[6] - (-0.2)) < 1e-12  # "a b c d" -> "a b"
    md = audit_markdown(columns, rows, "rollout 5")
    assert md.startswith("## rollout 5\n") and "| 1 | +2.000 | +0.200 | 1 | -1.000 | +0.300 | - | q1 | x |" in md


def test_without_judge_or_ensemble_the_columns_stay_and_read_none():
    prompts = [PromptExample([{"role": "user", "content": "q"}])]
    columns, rows = audit_rows(prompts, ["r"], [1.0], [1], lambda idx, texts: [0.0] * len(idx), transforms=())
    assert columns == ["rank", "reward", "disagreement", "length", "judge", "prompt", "response"]
    assert rows == [[1, 1.0, None, 1, None, "q", "r"]]
