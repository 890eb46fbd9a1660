"""PPO's efficiency levers (issue #31): the toy world's verifiable reward (``reward=gold``), the epoch early stop at a
target approximate KL, and the critic's warm-up before the first policy update; and the reward protocol they plug
into (``build`` and ``score``, the scores' extras reaching the rollout statistics)."""

import random

import pytest
import torch

from lrlhf.data.toy import TaskConfig, gold_utility, ideal_answer, prompt_text, sample_task
from lrlhf.data.toy.tasks import task_from_prompt
from lrlhf.data.toy.utility import verifiable_reward
from lrlhf.functional import AdaptiveKLController
from lrlhf.models import LoraSpec
from lrlhf.modules import PPOModule
from lrlhf.modules.critic import SharedTrunk, ValueAdapter
from lrlhf.rewards.protocol import FunctionReward, RewardScores, RewardSource
from lrlhf.utils.errors import InvariantError

from .test_ppo import _batch, _fit, _module, _snapshot, tokenizer, world  # noqa: F401 (fixtures)


# ------------------------------------------------------------------------------------ the verifier
def test_task_from_prompt_inverts_prompt_text():
    rng = random.Random(0)
    for _ in range(200):
        task = sample_task(rng, TaskConfig())
        assert task_from_prompt(prompt_text(task)) == task
        # inside a transcript: the last request is the one asked
        assert task_from_prompt("how many items : fig cat\n" + prompt_text(task)) == task


def test_task_from_prompt_refuses_a_prompt_without_a_request():
    with pytest.raises(ValueError, match="no toy-world request in the prompt 'hello there'"):
        task_from_prompt("hello there")
    with pytest.raises(ValueError, match="must be a non-empty list"):
        task_from_prompt("sort these numbers :")


def test_verifiable_reward_is_the_gold_utility_from_the_texts():
    task = {"kind": "sort", "items": [5, 3, 8, 1]}
    assert verifiable_reward(prompt_text(task), ideal_answer(task)) == 1.0
    for response in ("1 3 8 5", "1 3 5 8 thanks", "", "3"):
        assert verifiable_reward(prompt_text(task), response) == gold_utility(task, response)
    count = {"kind": "count", "items": ["fig", "cat", "fig"]}
    assert verifiable_reward(prompt_text(count), "2") == pytest.approx(2 / 3)


class Recorder:
    """A reward function that records what it was shown."""

    def __init__(self, value=0.25):
        self.seen, self.value = [], value

    def __call__(self, prompt: str, response: str) -> float:
        self.seen.append((prompt, response))
        return self.value


def test_function_reward_sees_the_prompt_and_the_response_cut_at_the_stop(world, tokenizer):  # noqa: F811
    fn = Recorder()
    module = _module(world, tokenizer, reward=FunctionReward(fn, name="recorder"))
    assert module.reward_model is None and module.reward.tokenizer is tokenizer  # built by configure_model
    batch = _batch(world, tokenizer)
    rollout = module.make_rollout(batch)
    assert torch.equal(rollout.raw_scores, torch.full((len(rollout),), 0.25))
    assert [p for p, _ in fn.seen] == [prompt[-1]["content"] for prompt in batch["prompts"]]
    eos = set(module.eos_token_ids)
    for (_, response), ids, n in zip(fn.seen, rollout.response_ids.tolist(), rollout.masks.lengths.tolist(),
                                     strict=True):
        kept = ids[:n]
        kept = kept[:-1] if kept and kept[-1] in eos else kept  # the EOS is not part of the text
        assert response == tokenizer.decode(kept, skip_special_tokens=True).strip()


def test_function_reward_refuses_a_non_finite_score(world, tokenizer):  # noqa: F811
    module = _module(world, tokenizer, reward=FunctionReward(Recorder(float("nan")), name="broken"))
    assert module.reward_model is None and module.reward.tokenizer is tokenizer  # built by configure_model
    with pytest.raises(InvariantError, match="reward 'broken' returned nan for the response"):
        module.make_rollout(_batch(world, tokenizer))


def test_gold_reward_through_the_module_equals_gold_on_the_records(world, tokenizer):  # noqa: F811
    module = _module(world, tokenizer, reward=FunctionReward(verifiable_reward, name="gold"))
    assert module.reward_model is None and module.reward.tokenizer is tokenizer  # built by configure_model
    batch = _batch(world, tokenizer)
    rollout = module.make_rollout(batch)
    _, texts = module.reward.texts(rollout.query_ids, rollout.query_mask, rollout.response_ids, rollout.masks)
    expected = [gold_utility(meta["task"], text) for meta, text in zip(batch["meta"], texts, strict=True)]
    assert rollout.raw_scores.tolist() == pytest.approx(expected, abs=1e-7)


# ------------------------------------------------------------------------------- the reward protocol
class CountingReward(RewardSource):
    """A reward source of its own: builds nothing, scores each response by its length, and says a disagreement of
    one tenth of the row index (an extra the rollout's statistics read, as an ensemble's)."""

    def build(self, model, tokenizer):  # noqa: F811
        self.built_with = (model, tokenizer)
        return None

    def score(self, query_ids, query_mask, response_ids, masks, meta=None):
        rows = torch.arange(len(response_ids), dtype=torch.float32)
        return RewardScores(masks.lengths.float(), 0.1 * rows)


def test_any_object_with_build_and_score_is_the_reward_and_its_extras_reach_the_rollout_stats(
        world, tokenizer, tmp_path):  # noqa: F811
    reward = CountingReward()
    module = _module(world, tokenizer, reward=reward, forward_batch_size=3)
    assert module.reward is reward and module.reward_model is None
    assert reward.built_with == (module.model, tokenizer)  # the policy's peft model and the tokenizer
    rollout = module.make_rollout(_batch(world, tokenizer))
    assert torch.equal(rollout.raw_scores, rollout.masks.lengths.float())
    # scored in chunks of 3 rows (forward_batch_size): each chunk's extras, in order
    assert torch.equal(rollout.disagreement, torch.tensor([0.0, 0.1, 0.2, 0.0]))
    assert module.rollout_stats(rollout)["reward/ensemble_std"] == pytest.approx(0.075)
    trainer = _fit(module, world, tokenizer, 1, tmp_path)
    assert trainer.logged_metrics["reward/ensemble_std"] == pytest.approx(0.075)


def test_a_subclass_score_is_the_reward_without_extras(world, tokenizer):  # noqa: F811
    class Constant(PPOModule):
        def score(self, query_ids, query_mask, response_ids, masks):
            return torch.full((len(response_ids),), 2.0)

    module = _module(world, tokenizer, cls=Constant, reward=CountingReward())
    rollout = module.make_rollout(_batch(world, tokenizer))
    assert torch.equal(rollout.raw_scores, torch.full((len(rollout),), 2.0))
    assert rollout.disagreement is None and "reward/ensemble_std" not in module.rollout_stats(rollout)


def test_a_reward_that_is_no_source_is_refused_naming_the_key(world, tokenizer):  # noqa: F811
    with pytest.raises(TypeError, match="module.reward_model must be a reward-model folder, a ScalarModel or a "
                                        "reward source"):
        _module(world, tokenizer, reward=42)


# ---------------------------------------------------------------------------------- epoch early stop
def test_target_kl_stops_the_update_at_the_first_minibatch_past_it(world, tokenizer, tmp_path):  # noqa: F811
    # 4 prompts, minibatch 2, 2 epochs: 4 steps without the stop. Before the first step the approximate KL is second
    # order in the sampler/forward rounding (ratios 1 within ~1e-6 in fp32: KL <= ~1e-12; 3e-14 measured); after one
    # step at lr 5e-2 it is first order in the move (1e-2 measured). 1e-7 sits five decades from either: the first
    # minibatch steps, the second stops the rollout's update.
    module = _module(world, tokenizer, target_kl=1e-7)
    trainer = _fit(module, world, tokenizer, 1, tmp_path)
    metrics = trainer.callback_metrics
    assert metrics["ppo/optimizer_steps"].item() == 1 and metrics["ppo/stopped_early"].item() == 1
    assert trainer.global_step == 1
    free = _module(world, tokenizer, target_kl=None)
    trainer = _fit(free, world, tokenizer, 1, tmp_path)
    assert trainer.callback_metrics["ppo/optimizer_steps"].item() == 4
    assert trainer.callback_metrics["ppo/stopped_early"].item() == 0


def test_target_kl_must_be_positive():
    from lrlhf.modules import PPOConfig

    with pytest.raises(ValueError, match=r"module.config.target_kl must be > 0 or None \(off\), got 0"):
        PPOConfig(target_kl=0)


# -------------------------------------------------------------------------------------- value warm-up
def test_value_warmup_trains_the_critic_alone_and_leaves_beta(world, tokenizer, tmp_path):  # noqa: F811
    module = _module(world, tokenizer, critic=ValueAdapter(LoraSpec(r=4), warmup_rollouts=1))
    module.kl_controller = AdaptiveKLController(kl_coef=0.05, target=4.0, horizon=10)
    before = _snapshot(module)
    trainer = _fit(module, world, tokenizer, 1, tmp_path)
    after = _snapshot(module)
    policy = [n for n in after if ".policy." in n]
    value = [n for n in after if ".value." in n]
    assert policy and value
    assert all(torch.equal(after[n], before[n]) for n in policy), "the policy moved during the critic's warm-up"
    assert any(not torch.equal(after[n], before[n]) for n in value), "the critic did not train"
    assert module.critic.head.linear.weight.abs().sum() > 0, "the zero-initialised value head did not train"
    assert trainer.callback_metrics["ppo/value_warmup"].item() == 1
    assert module.kl_controller.value == 0.05, "a warm-up rollout (KL 0 by construction) fed the KL controller"
    # the next rollout is past the warm-up: the policy moves and the controller is fed
    trainer = _fit(module, world, tokenizer, 1, tmp_path)
    moved = _snapshot(module)
    assert any(not torch.equal(moved[n], after[n]) for n in policy)
    assert trainer.callback_metrics["ppo/value_warmup"].item() == 0
    assert module.kl_controller.value != 0.05


def test_value_warmup_is_refused_on_a_shared_trunk():
    with pytest.raises(ValueError, match="module.critic.warmup_rollouts must be 0 with SharedTrunk"):
        SharedTrunk(warmup_rollouts=2)
    with pytest.raises(ValueError, match="module.critic.warmup_rollouts must be an integer >= 0, got -1"):
        ValueAdapter(warmup_rollouts=-1)
    assert ValueAdapter(warmup_rollouts=3).settings()["warmup_rollouts"] == 3


# ------------------------------------------------------------------------------- the decay's fixed length
def test_linear_decay_runs_over_total_steps_and_refuses_a_longer_run(world, tokenizer, tmp_path):  # noqa: F811
    # 4 prompts, minibatch 2, 2 epochs: 4 optimiser steps in one rollout; linear over total_steps=4 -> lr 0 after
    module = _module(world, tokenizer, scheduler="linear", total_steps=4)
    trainer = _fit(module, world, tokenizer, 1, tmp_path, max_steps=4)
    assert trainer.global_step == 4
    assert trainer.optimizers[0].param_groups[0]["lr"] == 0.0  # 5e-2 * (1 - 4/4)
    # the length is the config's, not the trainer's: a longer run would train at lr 0 past it, so it is refused
    module = _module(world, tokenizer, scheduler="linear", total_steps=4)
    with pytest.raises(ValueError, match=r"trainer.max_steps=8 is past module.config.total_steps=4: the 'linear'"):
        _fit(module, world, tokenizer, 1, tmp_path, max_steps=8)
    module = _module(world, tokenizer, scheduler="cosine", total_steps=4)
    with pytest.raises(ValueError, match=r"trainer.max_steps=-1 is past module.config.total_steps=4"):
        _fit(module, world, tokenizer, 1, tmp_path)  # max_epochs only: no step bound
    _fit(_module(world, tokenizer, total_steps=4), world, tokenizer, 1, tmp_path, max_steps=8)  # constant: any length
