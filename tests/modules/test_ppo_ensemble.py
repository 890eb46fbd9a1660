"""PPO with a reward-model ensemble: the rollout's score is the rule applied to the calibrated members, the members'
disagreement is logged per rollout, and the ensemble folder loads through ``RewardEnsemble``."""
# ruff: noqa: F811 -- the world / tokenizer fixtures come from test_ppo

import lightning.pytorch as pl
import torch

from lrlhf.functional import FixedKLController, MeanMinusStd, WorstCase, disagreement
from lrlhf.models import LoraSpec, ModelConfig, ScalarModel, load_causal_lm
from lrlhf.models.ensemble import RewardEnsembleModel, write_ensemble
from lrlhf.models.reward import RewardCalibration
from lrlhf.modules import PPOConfig, PPOModule, RewardConfig, RewardEnsemble, RewardModule
from lrlhf.modules.advantages import GAE
from lrlhf.modules.critic import ValueAdapter

from .test_ppo import _batch, _fit, tokenizer, world  # noqa: F401 (fixtures)


def _members(world, n=3):
    models, calibrations = [], []
    for i in range(n):
        torch.manual_seed(20 + i)
        member = ScalarModel(load_causal_lm(ModelConfig(str(world.model))))
        with torch.no_grad():
            member.head.linear.weight.normal_(0, 1.0)
        models.append(member.eval())
        calibrations.append(RewardCalibration(mean=0.1 * i, std=0.5 + i, count=4))
    return models, calibrations


def _ppo(world, tokenizer, reward, calibration=None):
    torch.manual_seed(0)
    config = PPOConfig(max_new_tokens=8, ppo_epochs=1, minibatch_size=2, forward_batch_size=3, lr=5e-2,
                       policy_lora=LoraSpec(r=4))
    module = PPOModule(load_causal_lm(ModelConfig(str(world.model))), reward, tokenizer, config,
                       calibration=calibration, advantage=GAE(), critic=ValueAdapter(LoraSpec(r=4)),
                       kl_controller=FixedKLController(0.05))
    module.configure_model()
    return module


def test_rollout_scores_are_the_rule_of_the_calibrated_members(world, tokenizer):
    models, calibrations = _members(world)
    ensemble = RewardEnsembleModel(models, calibrations, WorstCase())
    module = _ppo(world, tokenizer, ensemble)
    torch.manual_seed(1)
    rollout = module.make_rollout(_batch(world, tokenizer))
    ids = torch.cat([rollout.query_ids, rollout.response_ids], dim=1)
    mask = torch.cat([rollout.query_mask, rollout.masks.action_mask.to(rollout.query_mask.dtype)], dim=1)
    with torch.no_grad():  # by hand: each member alone, its own calibration, then the worst
        members = torch.stack([(m.score(ids, mask) - c.mean) / c.std
                               for m, c in zip(models, calibrations, strict=True)])
    # The rollout scores its rows in chunks of 3 (forward_batch_size), the check all 4 at once: fp32 kernels round
    # another batch shape differently, by a few epsilons (1.2e-7) of the scores' size (here ~20, so 2-3 ulps is
    # ~5e-6). 1e-5 of the largest calibrated score bounds that, while a wrong rule (the mean instead of the worst)
    # or a member's calibration left out moves scores by O(0.1-10).
    tol = 1e-5 * float(members.abs().max())
    torch.testing.assert_close(rollout.raw_scores, members.min(dim=0).values, rtol=0, atol=tol)
    stats = module.rollout_stats(rollout)
    assert abs(stats["reward/ensemble_std"] - float(disagreement(members).mean())) < tol
    assert stats["reward/ensemble_std"] > 0


def test_a_single_reward_model_logs_no_disagreement(world, tokenizer):
    models, _ = _members(world, 1)
    module = _ppo(world, tokenizer, models[0])
    rollout = module.make_rollout(_batch(world, tokenizer))
    assert "reward/ensemble_std" not in module.rollout_stats(rollout)


def test_the_ensemble_folder_through_reward_ensemble_and_a_fit(world, tokenizer, tmp_path):
    folders = []
    for i in range(2):
        torch.manual_seed(30 + i)
        rm = RewardModule(ModelConfig(str(world.model)), RewardConfig(), tokenizer=world.tokenizer)
        rm.configure_model()
        with torch.no_grad():
            rm.model.head.linear.weight.normal_(0, 1.0)
        rm.calibration = RewardCalibration(mean=0.0, std=1.0 + i, count=4)
        folders.append(rm.export(tmp_path / f"m{i}"))
    folder = write_ensemble(tmp_path / "ensemble", folders)
    module = _ppo(world, tokenizer, RewardEnsemble(str(folder), MeanMinusStd(2.0)), calibration=folder)
    assert isinstance(module.reward_model, RewardEnsembleModel) and module.reward_model.combine.coef == 2.0
    assert module.reward_model.combine is module._reward_source.combine
    trainer = _fit(module, world, tokenizer, 2, tmp_path)
    assert trainer.logged_metrics["reward/ensemble_std"] > 0


def test_the_audit_callback_writes_the_top_samples_with_gold_and_rescored_deltas(world, tokenizer, tmp_path):
    import csv

    from lrlhf.callbacks import HighRewardAudit
    from lrlhf.eval.counterfactual import PadFiller

    models, calibrations = _members(world, 2)
    module = _ppo(world, tokenizer, RewardEnsembleModel(models, calibrations))
    audit = HighRewardAudit(every_n_rollouts=2, top_k=3, judge="toy_gold", transforms=[PadFiller()],
                            path=str(tmp_path / "audit.md"))
    from lightning.pytorch.loggers import CSVLogger

    seen = []  # what the callbacks were given after each rollout

    class Outputs(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.append(outputs["rollout"])

    trainer = _fit(module, world, tokenizer, 2, tmp_path, logger=CSVLogger(tmp_path), callbacks=[audit, Outputs()])
    text = (tmp_path / "audit.md").read_text()
    assert text.count("## rollout") == 1 and "## rollout 2 (step" in text  # rollouts 2, 4, ...: one here
    rows = list(csv.DictReader(open(f"{trainer.log_dir}/audit.csv")))
    assert [int(r["rank"]) for r in rows] == [1, 2, 3]
    rewards = [float(r["reward"]) for r in rows]
    assert rewards == sorted(rewards, reverse=True)
    rollout = seen[-1]
    spread = rollout.disagreement
    assert rewards[0] == float(rollout.scores.max())
    assert all(r["judge"] != "" and r["disagreement"] != "" and r["d_pad_filler"] != "" for r in rows)
    assert any(float(r["d_pad_filler"]) != 0.0 for r in rows)  # padding moves a random-head reward
    assert float(rows[0]["disagreement"]) == float(spread[rollout.scores.argmax()])
