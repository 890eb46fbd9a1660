"""A reward the user writes (issue #49 item 8): its calibration is its own and no unrelated reward model is built,
said in one line; a node given anew replaces the old one; the scores' number and shape and a rule's interface are
checked with an error naming the reward and the contract."""

import pytest
import torch
from test_cli import _compose, _tiny, _train

from lrlhf.functional import response_masks
from lrlhf.rewards.protocol import FunctionReward, RewardScores, TextReward, checked_scores
from lrlhf.rewards.rules import RuleReward
from lrlhf.run.own_reward import replace_target_nodes, settle_own_reward

MINE = ("module.reward_model={_target_: lrlhf.rewards.protocol.FunctionReward, name: mine, "
        "fn: {_target_: hydra.utils.get_method, path: lrlhf.data.toy.verifiable_reward}}")


def test_a_reward_of_ones_own_is_not_rescaled_by_the_recipes_reward_model():
    cfg = _compose(["recipe=ppo_lora", MINE])
    assert "deps.rm" in str(cfg.module._get_node("calibration")._value()) or cfg.module.calibration is not None
    line = settle_own_reward(cfg, ["recipe=ppo_lora", MINE])
    assert cfg.module.calibration is None and cfg.needs.rm is None
    assert line == ("reward: your module.reward_model (FunctionReward): its raw scores, uncalibrated "
                    "(module.calibration=null; set it to calibrate, e.g. module.calibration={_target_: "
                    "lrlhf.rewards.calibration.ReferenceSamples}); no reward-model stage built (needs.rm=null)")
    # what the config says wins: a calibration given, the RM stage asked for
    given = ["recipe=ppo_lora", MINE, "module.calibration={_target_: lrlhf.rewards.calibration.ReferenceSamples}",
             "needs.rm=rm"]
    cfg = _compose(given)
    assert settle_own_reward(cfg, given) is None and cfg.needs.rm == "rm"
    # a reward-model folder of one's own: calibrated by that folder's statistics
    folder = ["recipe=ppo_lora", "module.reward_model=/models/my_rm"]
    cfg = _compose(folder)
    assert "its own folder's statistics" in settle_own_reward(cfg, folder) and \
        cfg.module.calibration == "/models/my_rm" and cfg.needs.rm is None
    # the recipe's own reward and a reward= config are left as they are
    for overrides in (["recipe=ppo_lora"], ["recipe=ppo_lora", "reward=rules", "module.reward_model.floor=0.1"]):
        cfg = _compose(overrides)
        before = (str(cfg.module._get_node("calibration")._value()), cfg.needs.get("rm"))
        assert settle_own_reward(cfg, overrides) is None
        assert (str(cfg.module._get_node("calibration")._value()), cfg.needs.get("rm")) == before


def test_a_node_given_anew_replaces_the_old_one():
    override = ("++module.reward_model.parts.format.source={_target_: lrlhf.rewards.protocol.FunctionReward, "
                "fn: {_target_: hydra.utils.get_method, path: lrlhf.data.toy.verifiable_reward}}")
    cfg = _compose(["recipe=ppo_lora", "reward=mixture", override])
    assert "rules" in cfg.module.reward_model.parts.format.source  # Hydra merged the old rule reward's keys in
    replace_target_nodes(cfg, ["recipe=ppo_lora", "reward=mixture", override])
    assert set(cfg.module.reward_model.parts.format.source) == {"_target_", "fn"}


@pytest.mark.slow
def test_train_with_ones_own_reward_builds_no_reward_model(tmp_path):
    out = _train(tmp_path, "recipe=ppo_lora", MINE, "logger=none", f"hydra.run.dir={tmp_path / 'run'}",
                 *_tiny("ppo_lora"))
    assert "reward: your module.reward_model (FunctionReward): its raw scores, uncalibrated" in out.stdout
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "cache" / "stages").iterdir()) == ["sft"]
    assert "calibration: null" in (tmp_path / "run" / ".hydra" / "config.yaml").read_text() or \
        "building the `rm` stage" not in out.stdout


class _Texts(TextReward):
    name = "mine"

    def __init__(self, result):
        self.result, self.tokenizer = result, type("T", (), {"batch_decode": lambda self, ids, **k: ["x"] * len(ids)})()

    def score_records(self, prompts, responses, meta):
        return self.result


@pytest.mark.parametrize(("result", "message"), [
    (([1.0], {}), r"reward 'mine' \(_Texts\) returned 1 scores for 2 responses: score_texts / score_records return "
                  r"\(scores, components\)"),
    ([1.0, 0.0], r"reward 'mine' \(_Texts\) returned a list of 2 for 2 responses"),
    ((["good", 0.0], {}), r"returned the score 'good' \(str\)"),
    (([1.0, 0.0], {"part": [1.0]}), r"components dict not of 2 values each"),
])
def test_a_text_reward_that_breaks_the_contract_is_named(result, message):
    ids, mask = torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long)
    masks = response_masks(ids, eos_token_id=99)
    with pytest.raises((TypeError, ValueError), match=message):
        _Texts(result).score(ids, mask, ids, masks)


def test_a_source_that_breaks_the_contract_is_named():
    good = checked_scores(object(), torch.zeros(3), 3)  # a bare tensor of scores is taken as the scores
    assert isinstance(good, RewardScores) and good.scores.shape == (3,)
    with pytest.raises(ValueError, match=r"module.reward_model \(object\) returned scores of shape \(2,\) for 3 "
                                         r"responses: a reward source's score"):
        checked_scores(object(), RewardScores(torch.zeros(2)), 3)
    with pytest.raises(TypeError, match=r"returned a list: a reward source's score"):
        checked_scores(object(), [0.0, 1.0, 2.0], 3)


def test_a_reward_where_a_rule_belongs_is_refused_when_planning():
    reward = FunctionReward(fn=lambda p, r: 1.0)
    with pytest.raises(TypeError, match=r"module.reward_model.rules\[0\] is a FunctionReward, not a rule \(a reward: "
                                        r"put it in module.reward_model itself"):
        RuleReward(rules=[reward])


def test_a_calibration_measured_on_the_rewards_own_samples_stays():
    """On a real scale the calibration is measured on the reference's samples with the module's own reward: it is
    the reward's own, so it stays; only the RM stage's statistics (the toy scale's) are refused."""
    overrides = ["recipe=ppo_lora", "hparams=smollm2", MINE]
    cfg = _compose(overrides)
    line = settle_own_reward(cfg, overrides)
    assert cfg.module.calibration._target_ == "lrlhf.rewards.calibration.ReferenceSamples" and cfg.needs.rm is None
    assert line == "reward: your module.reward_model (FunctionReward): no reward-model stage built (needs.rm=null)"


@pytest.mark.parametrize("hparams", ["toy", "cpu", "smollm2", "hf"])
@pytest.mark.parametrize(("reward", "cls"), [("gold", "FunctionReward"), ("rules", "RuleReward"),
                                             ("mixture", "Mixture"), ("judge", "JudgeReward"),
                                             ("judge_pairwise", "PairwiseJudgeReward"), ("constraints", "RuleReward"),
                                             ("math", "RuleReward")])
def test_every_reward_config_builds_its_own_node_at_every_scale(hparams, reward, cls):
    """#32: a reward=... node merged onto a scale's own reward node (hparams=smollm2's RewardAdapter dict) mixed their
    keys (RuleReward(path=...)); each reward config's node is its own at every scale."""
    from hydra.utils import instantiate

    extra = ["module.reward_model.judge=/a/judge"] if reward.startswith("judge") else []
    cfg = _compose(["recipe=grpo_lora", f"reward={reward}", f"hparams={hparams}", "paths.run_dir=.", *extra])
    source = instantiate(cfg.module.reward_model, _convert_="all")
    assert type(source).__name__ == cls
    if reward == "mixture":  # the scale's reward model is the mixture's `rm`: a LoRA RM's adapter where it is one
        rm = type(source.sources["rm"]).__name__
        assert rm == ("FrozenRewardModel" if hparams == "toy" else "RewardAdapter"), rm
    rows = cfg.data.batch_size * 4  # RLOO / GRPO: as many responses per rollout as ppo_lora at the scale
    assert rows == cfg.hparams.ppo.batch_size
