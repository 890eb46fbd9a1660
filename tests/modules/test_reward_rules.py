"""Rewards beyond one reward model (#32, first part): rule rewards and calibrated mixtures, each against a
hand-computed case, and through PPOModule (the mixture's scales measured on reference samples before the first
update, logged per rollout, kept in the checkpoint)."""

import math

import pytest
import torch

from lrlhf.functional import ResponseMasks
from lrlhf.rewards.calibration import ReferenceBatch, ReferenceSamples
from lrlhf.rewards.mixture import Mixture
from lrlhf.rewards.protocol import FunctionReward, RewardScores, RewardSource
from lrlhf.rewards.rules import Forbidden, JsonParses, LengthWords, Regex, RuleReward, ToolCall

from .test_ppo import _fit, _module, tokenizer, world  # noqa: F401 (fixtures)


def test_each_rule_by_hand():
    assert JsonParses().check("", '{"a": 1}') == 1.0 and JsonParses().check("", "{a: 1}") == 0.0
    assert JsonParses().check("", '```json\n{"a": 1}\n```') == 1.0  # a fenced block counts
    assert JsonParses(required_keys=["a", "b"]).check("", '{"a": 1}') == 0.0
    assert JsonParses(required_keys=["a"]).check("", "[1]") == 0.0
    assert Regex(r"^\d+$").check("", "123") == 1.0 and Regex(r"^\d+$").check("", "12 3") == 0.0
    assert Regex(r"sorry", must=False).check("", "I am sorry") == 0.0
    with pytest.raises(ValueError, match="pattern '\\(' is not a regular expression"):
        Regex("(")
    assert Forbidden(["As an AI"]).check("", "as an ai model") == 0.0
    assert Forbidden(["As an AI"], case_sensitive=True).check("", "as an ai model") == 1.0
    assert LengthWords(max_words=3).check("", "a b c") == 1.0 and LengthWords(max_words=3).check("", "a b c d") == 0.0
    assert LengthWords(min_words=2).check("", "a") == 0.0
    with pytest.raises(ValueError, match="set min_words, max_words or both"):
        LengthWords()
    call = '{"name": "search", "arguments": {"q": "x"}}'
    assert ToolCall("search").check("", call) == 1.0 and ToolCall("lookup").check("", call) == 0.0
    assert ToolCall("search").check("", f"[{call}]") == 1.0
    assert ToolCall("search").check("", '{"name": "search", "arguments": "x"}') == 0.0  # arguments must be an object


def test_rule_reward_weighs_gates_and_logs_each_rule():
    reward = RuleReward([Regex(r"\d", name="digit"), LengthWords(max_words=2, name="short"),
                         Forbidden(["bad"], name="clean", gate=True)], weights=[3.0, 1.0, 0.0], floor=-1.0)
    scores, parts = reward.score_texts(["p"] * 4, ["1", "1 2 3", "x", "1 bad"])
    assert scores == [1.0, 0.75, 0.25, -1.0]  # (3 d + 1 s) / 4; a gate's violation is the floor
    assert parts == {"digit": [1.0, 1.0, 0.0, 1.0], "short": [1.0, 0.0, 1.0, 1.0], "clean": [1.0, 1.0, 1.0, 0.0]}
    with pytest.raises(ValueError, match="two rules share a name"):
        RuleReward([Regex("a"), Regex("b")])
    with pytest.raises(ValueError, match="module.reward_model.weights must be 2 numbers"):
        RuleReward([Regex("a", name="a"), Regex("b", name="b")], weights=[1.0])


class Fixed(RewardSource):
    """Scores the rows with given values (cycled), with a component of its own."""

    def __init__(self, values):
        self.values = torch.tensor(values, dtype=torch.float32)

    def build(self, model, tokenizer):  # noqa: F811
        return None

    def score(self, query_ids, query_mask, response_ids, masks, meta=None):
        scores = self.values[torch.arange(len(query_ids)) % len(self.values)]
        return RewardScores(scores, components={"half": scores / 2})


class StubCalibrate:
    """Hands the mixture a batch of ``n`` rows as reference samples."""

    def __init__(self, n):
        self.n = n

    def reference_batch(self, module, datamodule):
        ids = torch.zeros(self.n, 2, dtype=torch.long)
        masks = ResponseMasks(*(torch.zeros(self.n, 2, dtype=torch.bool),) * 2, torch.zeros(self.n, dtype=torch.long),
                              torch.ones(self.n, dtype=torch.bool), torch.ones(self.n, dtype=torch.long))
        return ReferenceBatch(ids, ids, ids, masks)


def test_mixture_normalises_each_source_by_its_reference_scale():
    from types import SimpleNamespace

    rm, rule = Fixed([10.0, -2.0, 4.0, 0.0]), Fixed([1.0, 0.0])
    mixture = Mixture({"rm": {"source": rm, "weight": 1.0}, "rule": {"source": rule, "weight": 0.5},
                       "flat": {"source": Fixed([3.0]), "weight": 2.0}}, calibrate=StubCalibrate(4))
    masks = StubCalibrate(4).reference_batch(None, None)[3]
    ids = torch.zeros(4, 2, dtype=torch.long)
    with pytest.raises(RuntimeError, match="measured by prepare"):
        mixture.score(ids, ids, ids, masks)
    module = SimpleNamespace(config=SimpleNamespace(forward_batch_size=4))
    mixture.prepare(module, None)
    rm_mean, rm_std = 3.0, torch.tensor([10.0, -2.0, 4.0, 0.0], dtype=torch.float64).std().item()
    rule_std = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64).std().item()
    assert mixture.stats["rm"] == pytest.approx((rm_mean, rm_std)) and mixture.stats["rule"] == pytest.approx(
        (0.5, rule_std))
    assert mixture.stats["flat"] == (3.0, 1.0)  # the same score everywhere: centred only
    out = mixture.score(ids, ids, ids, masks)
    expected = [(r - rm_mean) / rm_std + 0.5 * (u - 0.5) / rule_std + 2.0 * 0.0
                for r, u in zip([10.0, -2.0, 4.0, 0.0], [1.0, 0.0, 1.0, 0.0], strict=True)]
    assert out.scores.tolist() == pytest.approx(expected, abs=1e-5)
    assert out.components["rm"].tolist() == [10.0, -2.0, 4.0, 0.0]
    assert out.components["rule/half"].tolist() == [0.5, 0.0, 0.5, 0.0]
    state = mixture.calibration_state()
    again = Mixture({"rm": {"source": rm}, "rule": {"source": rule}, "flat": {"source": Fixed([3.0])}},
                    calibrate=StubCalibrate(4))
    again.load_calibration_state(state)
    again.prepare(module, None)  # a resumed run keeps its scales
    assert again.stats == mixture.stats
    raw = Mixture({"rm": {"source": rm, "weight": 1.0}, "rule": {"source": rule, "weight": 0.5}})
    assert raw.score(ids, ids, ids, masks).scores.tolist() == pytest.approx([10.5, -2.0, 4.5, 0.0])
    with pytest.raises(ValueError, match="parts.rm needs a source"):
        Mixture({"rm": {"weight": 1.0}})


def test_a_mixture_in_ppo_is_measured_on_reference_samples_logged_and_checkpointed(
        world, tokenizer, tmp_path):  # noqa: F811
    digits = RuleReward([Regex(r"\d", name="digit")])
    length = FunctionReward(lambda p, r: float(len(r.split())), name="words")
    mixture = Mixture({"words": {"source": length, "weight": 1.0}, "format": {"source": digits, "weight": 1.0}},
                      calibrate=ReferenceSamples(n_prompts=8, seed=0))
    module = _module(world, tokenizer, reward=mixture)
    trainer = _fit(module, world, tokenizer, 1, tmp_path)
    assert set(mixture.stats) == {"words", "format"} and mixture.stats["words"][1] > 0
    logged = trainer.logged_metrics
    assert {"reward/words", "reward/format", "reward/format/digit"} <= set(logged)
    assert 0.0 <= float(logged["reward/format/digit"]) <= 1.0
    checkpoint = {}
    module.on_save_checkpoint(checkpoint)
    assert checkpoint["reward_calibration"] == {k: list(v) for k, v in mixture.stats.items()}
    assert all(math.isfinite(v) for pair in mixture.stats.values() for v in pair)


# ------------------------------------------------------------------------------------------ a judge (direct RLAIF)
class CannedJudge:
    """JudgeReward with canned answers instead of a model's."""

    @staticmethod
    def make(answers, **kw):
        from lrlhf.rewards.judge import JudgeReward

        class Canned(JudgeReward):
            def verdicts(self, prompts, responses):
                return answers[:len(responses)]

        return Canned(judge="unused", **kw)


def test_a_judges_scores_are_parsed_and_an_unparsed_answer_is_counted_not_zeroed():
    judge = CannedJudge.make(["8", "score: 12", "I cannot rate this", "2.5 out of 10"])
    scores, parts = judge.score_texts(["p"] * 4, ["a", "b", "c", "d"])
    assert scores[:2] == [0.8, 1.0] and scores[3] == 0.25  # clamped to [0, 10], mapped to [0, 1]
    assert scores[2] == pytest.approx((0.8 + 1.0 + 0.25) / 3)  # the batch's parsed mean: pushes neither way
    assert parts == {"judge_unparsed": [0.0, 0.0, 1.0, 0.0]}
    with pytest.raises(Exception, match="none of the judge's 2 answers holds a score .* one answer: 'no'"):
        CannedJudge.make(["no", "never"]).score_texts(["p"] * 2, ["a", "b"])
    for kw, message in (({"template": "{prompt}"}, "must hold {response}"), ({"low": 1.0, "high": 1.0},
                                                                            "high must be > low")):
        with pytest.raises(ValueError, match=message):
            CannedJudge.make([], **kw)


def test_a_judge_model_is_loaded_frozen_and_its_answers_read(world, tokenizer):  # noqa: F811
    from lrlhf.rewards.judge import JudgeReward

    judge = JudgeReward(judge=str(world.model), template="sort these numbers : {prompt} {response}")
    module = judge.build(None, tokenizer)
    assert module is judge.model and not any(p.requires_grad for p in module.parameters())
    answers = judge.verdicts(["3 1 2"], ["1 2 3"])
    assert len(answers) == 1 and isinstance(answers[0], str)  # the untrained toy model's words
    if judge.parse(answers[0]) is None:
        with pytest.raises(Exception, match="none of the judge's 1 answers holds a score"):
            judge.score_texts(["3 1 2"], ["1 2 3"])


def test_a_pairwise_judge_against_the_reference_asks_both_orders():
    from lrlhf.rewards.judge import PairwiseJudgeReward

    class Canned(PairwiseJudgeReward):  # the judge's answer is a function of the two answers as shown
        def ask(self, questions):
            return [self.rule(*q.split("|")) for q in questions]

    def make(rule):
        judge = Canned(judge="unused", template="{a}|{b}", reference_key="ref")
        judge.rule = rule
        return judge

    meta = [{"ref": "REF"}] * 3
    fair = make(lambda a, b: "A" if a == "good" else "B" if b == "good" else "Answer: A" if a == "REF" else "B")
    scores, parts = fair.score_records(["p"] * 3, ["good", "bad", "also bad"], meta)
    # good beats the reference in both orders (1); bad loses both (0); so does "also bad"
    assert scores == [1.0, 0.0, 0.0] and parts["judge_pairwise_consistent"] == [1.0, 1.0, 1.0]
    biased = make(lambda a, b: "A")  # always the first shown: one win, one loss for every response
    scores, parts = biased.score_records(["p"] * 2, ["x", "y"], meta[:2])
    assert scores == [0.5, 0.5] and parts["judge_pairwise_consistent"] == [0.0, 0.0]
    # an unparsed verdict is counted and leaves the other; two unparsed get the batch's mean
    shy = make(lambda a, b: {"x|REF": "A", "REF|x": "hmm", "y|REF": "B", "REF|y": "A", "z|REF": "?", "REF|z": "?"}
               [f"{a}|{b}"])
    scores, parts = shy.score_records(["p"] * 3, ["x", "y", "z"], [{"ref": "REF"}] * 3)
    assert scores == [1.0, 0.0, pytest.approx(1 / 3)] and parts["judge_pairwise_unparsed"] == [0.5, 0.0, 1.0]
    with pytest.raises(Exception, match="none of the judge's 2 verdicts names A or B"):
        make(lambda a, b: "neither").score_records(["p"], ["x"], meta[:1])
    with pytest.raises(ValueError, match="has no reference answer .ref."):
        fair.score_records(["p"], ["x"], [{"answer": "1"}])
    with pytest.raises(ValueError, match="must hold {a} and {b}"):
        Canned(judge="unused", template="{response}")


def test_a_source_whose_score_takes_no_meta_is_refused_naming_the_signature():
    from lrlhf.rewards.protocol import reward_source

    class NoMeta:
        def build(self, model, tok):
            return None

        def score(self, query_ids, query_mask, response_ids, masks):
            return RewardScores(masks.lengths.float())

    with pytest.raises(TypeError, match=r"module.reward_model: NoMeta.score must take .*meta=None"):
        reward_source(NoMeta())
    current = FunctionReward(lambda p, r: 0.0)
    assert reward_source(current) is current  # a source that takes meta is used as it is
