"""KL control is the module's: its controller (by ``_target_``) moves beta towards the target once per rollout, the
module logs what the controller decided, and beta is checkpointed once (test_checkpoint.py)."""

from types import SimpleNamespace

import pytest

from lrlhf.functional import AdaptiveKLController, FixedKLController, KLInReward
from lrlhf.modules import PPOConfig, PPOModule

from .conftest import make_data, make_module, make_trainer


def _update(controller, kl, n=16, estimator="k1"):
    """PPOModule.update_kl_controller, once, on a stand-in module (one process: the global mean is the KL)."""
    module = SimpleNamespace(kl_controller=controller, config=PPOConfig(), kl_penalty=KLInReward(estimator))
    return PPOModule.update_kl_controller(module, {"rollout/kl_seq": kl, "rollout/size": float(n)})


@pytest.mark.parametrize("kl, direction", [(9.0, 1), (3.0, -1), (6.0, 0)])
def test_adaptive_beta_moves_towards_the_target_and_the_module_logs_why(kl, direction):
    controller = AdaptiveKLController(0.1, target=6.0, horizon=100.0)
    logged = _update(controller, kl)
    # e = clip(kl / 6 - 1, +-0.2): 9 -> +0.2, 3 -> -0.2, 6 -> 0; beta = 0.1 * (1 + e * 16 / 100)
    error = {1: 0.2, -1: -0.2, 0: 0.0}[direction]
    assert controller.value == pytest.approx(0.1 * (1 + error * 0.16), rel=1e-12)
    assert logged == {"kl/beta_next": controller.value, "kl/seq_sum_k1": kl, "kl/target": 6.0, "kl/error": error}


def test_fixed_beta_never_moves_and_logs_only_itself():
    controller = FixedKLController(0.3)
    for kl in (0.0, 50.0):
        logged = _update(controller, kl, estimator="k3")
    assert controller.value == 0.3 and logged == {"kl/beta_next": 0.3, "kl/seq_sum_k3": 50.0}


class CountedAdaptive(AdaptiveKLController):
    def update(self, current_kl, n_steps):
        self.seen = [*getattr(self, "seen", []), (current_kl, n_steps)]
        return super().update(current_kl, n_steps)


def test_one_update_per_rollout_in_a_fit_and_the_next_rollout_uses_it(world, tokenizer, tmp_path):
    controller = CountedAdaptive(0.1, target=0.5, horizon=20.0)
    module = make_module(world, tokenizer, kl_controller=controller)
    trainer = make_trainer(tmp_path, 2, module)
    trainer.fit(module, datamodule=make_data(world, tokenizer))
    assert module.kl_controller is controller and len(controller.seen) == 2  # once per rollout, by the module
    replay = AdaptiveKLController(0.1, target=0.5, horizon=20.0)
    for kl, n in controller.seen:
        replay.update(kl, n)
    assert controller.value == replay.value != 0.1 and controller.seen[0][1] == 4  # n_steps: the rollout's rows
    metrics = trainer.callback_metrics
    assert metrics["kl/beta_next"].item() == pytest.approx(controller.value, rel=1e-6)
    assert metrics["kl/seq_sum_k1"].item() == pytest.approx(controller.seen[-1][0], rel=1e-6)
