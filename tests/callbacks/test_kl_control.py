"""KLControlCallback: beta's direction against the target, one update per rollout, state across a resume."""

from types import SimpleNamespace

import pytest

from lrlhf.callbacks import KLControlCallback
from lrlhf.modules import PPOConfig


def _module(**config):
    return SimpleNamespace(config=PPOConfig(**config), kl_controller=None)


def _feed(callback, module, kl, n=16):
    """What PPOModule.update_kl_controller does once per rollout."""
    module.kl_controller.update(kl, n_steps=n)


@pytest.mark.parametrize("kl, direction", [(9.0, 1), (3.0, -1), (6.0, 0)])
def test_adaptive_beta_moves_towards_the_target(kl, direction):
    cb = KLControlCallback("adaptive", init_kl_coef=0.1, target=6.0, horizon=100.0)
    module = _module()
    cb.setup(None, module, "fit")
    assert module.kl_controller is cb.controller
    _feed(cb, module, kl)
    # e = clip(kl / 6 - 1, +-0.2): 9 -> +0.2, 3 -> -0.2, 6 -> 0; beta = 0.1 * (1 + e * 16 / 100)
    expected = {1: 0.1 * (1 + 0.2 * 0.16), -1: 0.1 * (1 - 0.2 * 0.16), 0: 0.1}[direction]
    assert module.kl_controller.value == pytest.approx(expected, rel=1e-12)
    assert cb.controller.last_kl == kl


def test_fixed_beta_never_moves_and_defaults_to_the_module_coef():
    cb = KLControlCallback("fixed")
    module = _module(kl_coef=0.3)
    cb.setup(None, module, "fit")
    for kl in (0.0, 50.0):
        _feed(cb, module, kl)
    assert module.kl_controller.value == 0.3


def test_state_is_restored_on_resume_and_never_reset():
    cb = KLControlCallback("adaptive", init_kl_coef=0.1, target=1.0, horizon=10.0)
    module = _module()
    cb.setup(None, module, "fit")
    for _ in range(3):
        _feed(cb, module, 5.0, n=4)
    state = cb.state_dict()
    # a new run: Lightning restores callback state before or after setup; both keep the beta
    for before_setup in (True, False):
        fresh, fresh_module = KLControlCallback("adaptive", init_kl_coef=0.1, target=1.0, horizon=10.0), _module()
        if before_setup:
            fresh.load_state_dict(state)
        fresh.setup(None, fresh_module, "fit")
        if not before_setup:
            fresh.load_state_dict(state)
        assert fresh_module.kl_controller.value == module.kl_controller.value == 0.1 * 1.08 ** 3
        _feed(fresh, fresh_module, 5.0, n=4)
        assert fresh_module.kl_controller.value == pytest.approx(0.1 * 1.08 ** 4, rel=1e-12)


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match="callbacks.kl_control.controller"):
        KLControlCallback("pid")
    cb = KLControlCallback("fixed", estimator="k3")
    with pytest.raises(ValueError, match="ppo.kl_estimator='k1'"):
        cb.setup(None, _module(), "fit")
    with pytest.raises(ValueError, match="cannot resume the KL controller"):
        fixed = KLControlCallback("fixed")
        fixed.setup(None, _module(), "fit")
        fixed.load_state_dict({"kind": "adaptive", "value": 1.0, "target": 1.0, "horizon": 1.0, "clip": 0.2})
