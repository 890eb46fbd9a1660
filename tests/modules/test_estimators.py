"""Advantage estimators as objects (lrlhf.modules.advantages): each one's output worked out by hand, the interface
PPOModule reads (``needs_critic``, ``samples_per_prompt``, ``name``), and the errors that name the config keys."""

import re

import pytest
import torch

import lrlhf.modules.advantages as advantages_module
from lrlhf.functional import gae, masked_whiten
from lrlhf.modules.advantages import GAE, GRPO, RLOO, AdvantageEstimator, DynamicSampling, GroupAdvantage
from lrlhf.utils.errors import InvariantError

# two prompts x k = 2 samples; row lengths 2, 1, 3, 2 (a prefix mask)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.bool)
REWARDS = torch.tensor([[0.5, 1.0, 9.0], [2.0, 9.0, 9.0], [1.0, 1.0, 1.0], [0.0, -1.0, 9.0]])  # 9 = masked out
VALUES = torch.zeros(4, 3)


def test_group_estimators_compare_sequence_rewards_within_each_prompt():
    # sequence rewards (masked sums): 1.5, 2.0 | 3.0, -1.0
    adv, ret = RLOO(samples_per_prompt=2)(REWARDS, VALUES, MASK)
    # RLOO with k = 2: r_i - r_j -> -0.5, 0.5 | 4, -4, on every valid action of the row
    expected = torch.tensor([-0.5, 0.5, 4.0, -4.0])[:, None] * MASK
    assert torch.equal(adv, expected) and torch.equal(ret, torch.zeros(4, 3))
    # GRPO: (r - mean) / (std + 1e-6); a pair's unbiased std is |r_1 - r_2| / sqrt(2): 0.5/sqrt2 | 4/sqrt2
    adv, _ = GRPO(samples_per_prompt=2)(REWARDS, VALUES, MASK)
    s1, s2 = 0.5 / 2**0.5, 4.0 / 2**0.5
    expected = torch.tensor([-0.25 / (s1 + 1e-6), 0.25 / (s1 + 1e-6), 2.0 / (s2 + 1e-6), -2.0 / (s2 + 1e-6)])
    torch.testing.assert_close(adv, expected[:, None] * MASK, atol=0, rtol=2e-7)
    # Dr. GRPO: the group mean subtracted, no division by the std: -0.25, 0.25 | 2, -2
    adv, _ = GRPO(samples_per_prompt=2, scale_by_std=False)(REWARDS, VALUES, MASK)
    assert torch.equal(adv, torch.tensor([-0.25, 0.25, 2.0, -2.0])[:, None] * MASK)


def test_gae_is_the_functional_gae_whitened_over_valid_actions():
    values = torch.tensor([[0.1, 0.2, 0.0], [0.3, 0.0, 0.0], [0.0, 0.5, 0.1], [0.2, 0.2, 0.0]])
    raw, returns = gae(REWARDS, values, MASK, 0.9, 0.8)
    adv, ret = GAE(gamma=0.9, lam=0.8, whiten_scope="local")(REWARDS, values, MASK)
    assert torch.equal(ret, returns)
    valid = raw[MASK]
    torch.testing.assert_close(adv[MASK], (valid - valid.mean()) / (valid.var() + 1e-8).sqrt(), atol=1e-6, rtol=0)
    assert torch.equal(GAE(gamma=0.9, lam=0.8, whiten=False)(REWARDS, values, MASK)[0], raw)


def test_the_interface_the_module_reads():
    assert (GAE().needs_critic, GAE().name, GAE().samples_per_prompt) == (True, "ppo", 1)
    assert (RLOO().needs_critic, RLOO().name, RLOO().samples_per_prompt) == (False, "rloo", 4)
    assert (GRPO().name, GRPO(samples_per_prompt=8).samples_per_prompt) == ("grpo", 8)
    assert issubclass(GroupAdvantage, AdvantageEstimator)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: GAE(gamma=1.5), "module.advantage.gamma must be in [0, 1], got 1.5"),
    (lambda: GAE(lam=-0.1), "module.advantage.lam must be in [0, 1], got -0.1"),
    (lambda: GAE(whiten_scope="world"), "module.advantage.whiten_scope must be one of ['global', 'local']"),
    (lambda: GAE(samples_per_prompt=0), "module.advantage.samples_per_prompt must be >= 1, got 0"),
    (lambda: RLOO(samples_per_prompt=1), "module.advantage.samples_per_prompt must be >= 2 for RLOO"),
    (lambda: GRPO(samples_per_prompt=1), "module.advantage.samples_per_prompt must be >= 2 for GRPO"),
])
def test_errors_name_the_key(make, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        make()


def test_gae_accepts_the_ends_of_its_ranges():
    for gamma, lam in ((0.0, 0.0), (1.0, 1.0), (0.0, 1.0)):
        assert (GAE(gamma=gamma, lam=lam).gamma, GAE(gamma=gamma, lam=lam).lam) == (gamma, lam)


# --- whitening scope: a stand-in for a second rank holding the same rollout, so every all-reduced sum doubles -----
def _twin_rank(monkeypatch):
    """Patch the estimator's ``global_all_reduce`` to a world of two ranks with identical rollouts (the global batch
    is this one twice); returns the list of tensors it reduced."""
    reduced = []

    def all_reduce(x):
        reduced.append(x)
        return 2 * x

    monkeypatch.setattr(advantages_module, "global_all_reduce", lambda: all_reduce)
    return reduced


def _values():
    return torch.tensor([[0.1, 0.2, 0.0], [0.3, 0.0, 0.0], [0.0, 0.5, 0.1], [0.2, 0.2, 0.0]])


def test_global_whitening_uses_the_statistics_of_every_rank(monkeypatch):
    reduced = _twin_rank(monkeypatch)
    raw, _ = gae(REWARDS, _values(), MASK, 0.9, 0.8)
    adv, _ = GAE(gamma=0.9, lam=0.8)(REWARDS, _values(), MASK)  # "global" is the default
    expected = masked_whiten(torch.cat([raw, raw]), torch.cat([MASK, MASK]))[:4]  # the concatenated global batch
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=0)
    assert reduced and (adv - masked_whiten(raw, MASK)).abs().max() > 1e-2  # not the local statistics


def test_local_whitening_never_reduces_across_ranks(monkeypatch):
    reduced = _twin_rank(monkeypatch)
    raw, _ = gae(REWARDS, _values(), MASK, 0.9, 0.8)
    adv, _ = GAE(gamma=0.9, lam=0.8, whiten_scope="local")(REWARDS, _values(), MASK)
    torch.testing.assert_close(adv, masked_whiten(raw, MASK), atol=1e-6, rtol=0)
    assert reduced == []


def test_whitening_needs_two_valid_actions_counted_over_every_rank(monkeypatch):
    one = torch.tensor([[True, False, False], [False, False, False]])
    rewards, values = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]), torch.zeros(2, 3)
    raw, _ = gae(rewards, values, one, 1.0, 0.95)
    # one valid action in a single process: left as it is (there is no variance to whiten by)
    assert torch.equal(GAE(whiten_scope="local")(rewards, values, one)[0], raw)
    # the same action on each of two ranks: two in the global rollout, whitened with the global statistics
    _twin_rank(monkeypatch)
    expected = masked_whiten(torch.cat([raw, raw]), torch.cat([one, one]))[:2]
    assert raw[0, 0] == 2.0 and torch.equal(GAE()(rewards, values, one)[0], expected)


def test_two_valid_actions_are_whitened():
    two = torch.tensor([[True, True, False]])
    rewards, values = torch.tensor([[1.0, 3.0, 0.0]]), torch.zeros(1, 3)
    raw, _ = gae(rewards, values, two, 1.0, 0.95)
    adv, _ = GAE(whiten_scope="local")(rewards, values, two)
    torch.testing.assert_close(adv, masked_whiten(raw, two), atol=1e-6, rtol=0)
    assert (adv - raw).abs().max() > 1  # 3.85 and 3 become about +-0.71


# --- group estimators -------------------------------------------------------------------------------------------
def test_grpo_adds_its_eps_to_the_groups_std():
    adv, _ = GRPO(samples_per_prompt=2, eps=0.5)(REWARDS, VALUES, MASK)
    s1, s2 = 0.5 / 2**0.5, 4.0 / 2**0.5  # see above
    expected = torch.tensor([-0.25 / (s1 + 0.5), 0.25 / (s1 + 0.5), 2.0 / (s2 + 0.5), -2.0 / (s2 + 0.5)])
    torch.testing.assert_close(adv, expected[:, None] * MASK, atol=0, rtol=2e-7)


@pytest.mark.parametrize(("rewards_dtype", "mask_dtype"), [(torch.float32, torch.float64),
                                                           (torch.bfloat16, torch.float32)])
def test_group_advantages_keep_the_rewards_dtype_whatever_the_masks(rewards_dtype, mask_dtype):
    adv, ret = RLOO(samples_per_prompt=2)(REWARDS.to(rewards_dtype), VALUES, MASK.to(mask_dtype))
    assert adv.dtype == ret.dtype == rewards_dtype
    expected = torch.tensor([-0.5, 0.5, 4.0, -4.0], dtype=rewards_dtype)[:, None] * MASK
    assert torch.equal(adv, expected)


# --- dynamic sampling -------------------------------------------------------------------------------------------
def test_dynamic_sampling_drops_groups_within_the_tolerance():
    scores = torch.tensor([1.0, 1.05, 0.0, 1.0, 2.0, 2.5])  # ranges 0.05, 1, 0.5
    rows, stats = DynamicSampling(tolerance=0.1).rows(scores, 2)
    assert rows.tolist() == [2, 3, 4, 5]
    assert stats["rollout/groups_informative_frac"] == pytest.approx(2 / 3)
    assert DynamicSampling().rows(scores, 2)[0].tolist() == [0, 1, 2, 3, 4, 5]


def test_dynamic_sampling_of_an_empty_rollout():
    rows, stats = DynamicSampling().rows(torch.zeros(0), 2)
    assert rows.tolist() == []
    assert stats == {"rollout/groups_sampled": 0.0, "rollout/groups_informative_frac": 0.0, "rollout/groups_kept": 0.0}


def test_dynamic_sampling_rows_stay_on_the_scores_device_whatever_the_default_device():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.5])
    with torch.device("meta"):  # a factory call without an explicit device lands here
        rows, _ = DynamicSampling().rows(scores, 2)
    assert rows.device.type == "cpu" and rows.tolist() == [2, 3, 4, 5]


@pytest.mark.parametrize(("settings", "message"), [
    (dict(tolerance=-0.1), "module.group_filter.tolerance must be >= 0, got -0.1"),
    (dict(tolerance=float("nan")), "module.group_filter.tolerance must be >= 0, got nan"),
    (dict(max_empty=0), "module.group_filter.max_empty must be >= 1, got 0"),
])
def test_dynamic_sampling_settings_name_the_key(settings, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        DynamicSampling(**settings)


def test_dynamic_sampling_stops_after_max_empty_rollouts_in_a_row():
    sampling = DynamicSampling(max_empty=1)  # the smallest allowed: the first empty rollout stops
    with pytest.raises(InvariantError) as caught:
        sampling.check_empty(1, 7)
    message = str(caught.value)
    assert "no group with unequal scores in 1 rollouts in a row (rollout 7)" in message
    assert message.endswith("Stop here, or raise module.group_filter.max_empty, or lower "
                            "module.group_filter.tolerance")
    DynamicSampling(max_empty=2).check_empty(1, 7)  # one empty rollout of two allowed: no stop
