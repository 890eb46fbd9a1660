"""The update's terms in PPOModule (#33): micro-batches that do not change the step, the KL in the loss, the
off-policy correction against a sampler whose log-probs differ from the trainer's, and the overlong rule. Each is
checked through the module (a mutant of its wiring fails here), in fp64 where gradients are compared."""

import dataclasses

import pytest
import torch

from lrlhf.functional import GSPO, ClipPPO, KLInLoss, SequenceMean, SequenceSumNorm, TokenMean, response_masks
from lrlhf.functional.off_policy import MaskedIS, TruncatedIS
from lrlhf.functional.rewards import OverlongMask, SoftOverlongPenalty
from lrlhf.models import LoraSpec
from lrlhf.modules import PPOModule
from lrlhf.modules.advantages import GRPO, DynamicSampling
from lrlhf.modules.rollout import Sampled
from lrlhf.rewards.protocol import FunctionReward, RewardScores, RewardSource
from lrlhf.utils.errors import InvariantError

from .test_ppo import _batch, _fit, _module, tokenizer, world  # noqa: F401 (fixtures)


def _fp64(module):
    """The module in fp64 with a moved policy adapter (the policy then differs from the reference), outside a
    Trainer: ``manual_backward`` is a plain backward."""
    module.double()
    if module.reward_model is not None:
        module.reward_model.double()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in module.model.named_parameters():
            if "lora_B" in name and ".policy" in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.2)
    module.manual_backward = lambda loss: loss.backward()
    return module


def _grads(module, mb, first=False) -> dict[str, torch.Tensor]:
    module.zero_grad(set_to_none=True)
    stats = module.minibatch_backward(mb, first=first)
    grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}  # the critic's head too
    assert grads, "no gradient reached the adapters"
    return grads | {"_stats": stats}


def _rollout(module, world, tokenizer, vary=False):  # noqa: F811
    """A rollout of the module's; ``vary``: with responses cut at different lengths (an EOS written at 1, 3, 5, ...
    tokens; the untrained toy model rarely stops by itself), every token in the policy loss."""
    torch.manual_seed(3)
    rollout = module.make_rollout(_batch(world, tokenizer))
    if vary:
        ids = rollout.response_ids.clone()
        for row in range(len(ids)):
            ids[row, min(2 * row, ids.shape[1] - 1)] = module.eos_token_ids[0]
        masks = response_masks(ids, module.eos_token_ids, module.pad_token_id)
        rollout = dataclasses.replace(rollout, response_ids=ids, masks=masks, policy_mask=masks.action_mask)
        assert len(set(masks.lengths.tolist())) > 2
    return rollout


def _same(a, b, rtol=1e-10):
    assert a.keys() == b.keys()
    for name in a:
        if name != "_stats":
            assert torch.allclose(a[name], b[name], rtol=rtol, atol=1e-13), name


# ------------------------------------------------------------------------------------------ micro-batches
@pytest.mark.parametrize("aggregation", [TokenMean(), SequenceMean(), SequenceSumNorm(tokens=8)])
def test_micro_batches_give_the_minibatchs_gradient(world, tokenizer, aggregation):  # noqa: F811
    """The step of a minibatch does not depend on how it is cut into micro-batches: the policy loss's aggregation,
    the value loss and the entropy bonus are each normalised over the whole minibatch (with unequal lengths per
    micro-batch, a per-micro-batch normalisation gives another gradient)."""
    module = _fp64(_module(world, tokenizer, entropy_coef=0.01, minibatch_size=4,
                           parts={"policy_loss": ClipPPO(0.2, aggregation)}))
    rollout = _rollout(module, world, tokenizer, vary=True)
    whole = _grads(module, rollout)
    for micro in (1, 3):
        module.config.micro_batch_size = micro
        _same(_grads(module, rollout), whole)
        assert _grads(module, rollout)["_stats"]["ppo/policy_loss"] == pytest.approx(
            whole["_stats"]["ppo/policy_loss"], abs=1e-12)


def test_gspos_sequence_ratio_is_cut_by_whole_sequences(world, tokenizer):  # noqa: F811
    module = _fp64(_module(world, tokenizer, advantage=GRPO(samples_per_prompt=2), critic=None, minibatch_size=4,
                           prefix_sharing=False, parts={"policy_loss": GSPO(0.2, 0.2)}))
    rollout = _rollout(module, world, tokenizer, vary=True)
    whole = _grads(module, rollout)
    module.config.micro_batch_size = 1
    _same(_grads(module, rollout), whole)


# ------------------------------------------------------------------------------------------ KL in the loss
def test_kl_in_the_loss_leaves_the_reward_and_pulls_with_the_estimators_gradient(world, tokenizer):  # noqa: F811
    beta = 0.3
    module = _fp64(_module(world, tokenizer, advantage=GRPO(samples_per_prompt=2), critic=None, kl_coef=beta,
                           prefix_sharing=False, minibatch_size=4, parts={"kl_penalty": KLInLoss("k3+")}))
    rollout = _rollout(module, world, tokenizer, vary=True)
    # the reward carries no KL: each row's rewards are its score at the terminal action, 0 elsewhere
    assert torch.equal(rollout.rewards.sum(-1), rollout.scores)
    assert (rollout.kl[rollout.action_mask] != 0).any()  # still measured (k3), for the log and the controller
    # with no advantage, the gradient is beta x the token mean of k2's gradient
    zero = dataclasses.replace(rollout, advantages=torch.zeros_like(rollout.advantages))
    got = _grads(module, zero)
    module.zero_grad(set_to_none=True)
    logprobs, _ = module.policy_forward(zero.query_ids, zero.query_mask, zero.response_ids)
    k2 = 0.5 * (logprobs - zero.ref_logprobs) ** 2
    (beta * TokenMean()(k2, zero.action_mask)).backward()
    _same(got, {n: p.grad for n, p in module.named_parameters() if p.grad is not None} | {"_stats": None})
    k3 = torch.expm1(zero.ref_logprobs - logprobs) - (zero.ref_logprobs - logprobs)  # the logged value: k3's
    assert got["_stats"]["ppo/kl_loss"] == pytest.approx(beta * TokenMean()(k3.detach(), zero.action_mask).item(),
                                                         rel=1e-9)


# ------------------------------------------------------------------------------------------ off-policy
class SkewedSampler(PPOModule):
    """A sampler whose log-probs are off the trainer's by ``delta`` per token (as a half-precision or compiled
    decoder's may be): the tokens drawn are the policy's own."""

    delta = 1.0

    def sample(self, query_ids, query_mask, max_new_tokens=None):
        out = super().sample(query_ids, query_mask, max_new_tokens)
        return Sampled(out.response_ids, out.logprobs - self.delta, out.values)


def _grpo(world, tokenizer, cls=PPOModule, parts=None, **config):  # noqa: F811
    return _fp64(_module(world, tokenizer, cls=cls, advantage=GRPO(samples_per_prompt=2), critic=None,
                         prefix_sharing=False, minibatch_size=4, parts=parts, **config))


def test_without_the_correction_a_skewed_sampler_stops_the_run(world, tokenizer):  # noqa: F811
    module = _grpo(world, tokenizer, cls=SkewedSampler)
    rollout = _rollout(module, world, tokenizer)
    with pytest.raises(InvariantError, match="ratio"):
        _grads(module, rollout, first=True)


def test_the_correction_takes_the_trainers_old_logprobs_and_weighs_by_the_gap(world, tokenizer):  # noqa: F811
    exact = _grpo(world, tokenizer, recompute_old_logprobs=True)  # its old log-probs the trainer's too
    skewed = _grpo(world, tokenizer, cls=SkewedSampler, parts={"off_policy": TruncatedIS(cap=2.0)})
    ref_rollout, rollout = _rollout(exact, world, tokenizer), _rollout(skewed, world, tokenizer)
    assert torch.equal(rollout.response_ids, ref_rollout.response_ids)
    assert torch.equal(rollout.logprobs, ref_rollout.logprobs)  # the trainer's forward
    valid = rollout.action_mask  # the sampler's, as it gave them (fp32)
    assert torch.allclose(rollout.sampler_logprobs[valid].double(), rollout.logprobs[valid] - 1.0, atol=1e-5)
    # every token's weight is e^1 truncated at 2: the gradient is twice the exact sampler's, and the guard passes
    _same(_grads(skewed, rollout, first=True), {k: 2 * v for k, v in _grads(exact, ref_rollout).items()
                                                 if k != "_stats"} | {"_stats": None}, rtol=1e-9)
    stats = skewed.rollout_stats(rollout)
    assert stats["offpolicy/truncated_frac"] == 1.0 and stats["offpolicy/log_ratio_abs_mean"] == pytest.approx(1.0)
    # masked above the cap: nothing is learnt from the policy term
    masked = _grpo(world, tokenizer, cls=SkewedSampler, parts={"off_policy": MaskedIS(cap=2.0)})
    grads = _grads(masked, _rollout(masked, world, tokenizer))
    assert all(torch.count_nonzero(g) == 0 for k, g in grads.items() if k != "_stats")


def test_the_correction_needs_the_samplers_logprobs(world, tokenizer):  # noqa: F811
    class NoLogprobs(PPOModule):
        def sample(self, query_ids, query_mask, max_new_tokens=None):
            return Sampled(super().sample(query_ids, query_mask, max_new_tokens).response_ids)

    module = _grpo(world, tokenizer, cls=NoLogprobs, parts={"off_policy": TruncatedIS()})
    with pytest.raises(ValueError, match="module.off_policy needs the sampler's log-probs"):
        module.make_rollout(_batch(world, tokenizer))
    with pytest.raises(ValueError, match="module.config.recompute_old_logprobs=null or true"):
        _module(world, tokenizer, recompute_old_logprobs=False, parts={"off_policy": TruncatedIS()})


# ------------------------------------------------------------------------------------------ overlong
def test_overlong_mask_drops_truncated_rows_from_the_policy_loss(world, tokenizer):  # noqa: F811
    module = _grpo(world, tokenizer, parts={"overlong": OverlongMask()})
    module.config.max_new_tokens = 3  # most responses are cut
    rollout = _rollout(module, world, tokenizer)
    kept = rollout.masks.has_eos
    assert (~kept).any() and torch.equal(rollout.policy_mask, rollout.action_mask & kept[:, None])
    assert module.rollout_stats(rollout)["rollout/policy_token_frac"] < 1
    # the gradient is the one of the kept rows alone, over their tokens
    got = _grads(module, rollout)
    plain = _grpo(world, tokenizer)
    rows = torch.nonzero(kept).squeeze(-1)
    assert len(rows) > 0, "the test needs a finished response"
    expected = _grads(plain, rollout.select(rows))
    _same({k: v for k, v in got.items() if k in expected}, expected)


def test_soft_overlong_penalty_reaches_the_scores(world, tokenizer):  # noqa: F811
    module = _grpo(world, tokenizer, parts={"overlong": SoftOverlongPenalty(cache_tokens=2, penalty=0.5)})
    module.config.max_new_tokens = 3
    rollout = _rollout(module, world, tokenizer)
    ramp = ((rollout.masks.lengths.double() - 1) / 2).clamp(0, 1) * 0.5
    assert torch.allclose(rollout.scores.double(), rollout.raw_scores.double() - ramp, atol=1e-6)


def test_the_new_parts_train_end_to_end(world, tokenizer, tmp_path):  # noqa: F811
    module = _module(world, tokenizer, advantage=GRPO(samples_per_prompt=2), critic=None, micro_batch_size=1,
                     policy_lora=LoraSpec(r=4), parts={"kl_penalty": KLInLoss(), "off_policy": TruncatedIS(),
                                                       "overlong": OverlongMask()})
    trainer = _fit(module, world, tokenizer, 2, tmp_path)
    logged = trainer.logged_metrics
    assert {"ppo/kl_loss", "offpolicy/truncated_frac", "rollout/policy_token_frac", "kl/seq_sum_k3"} <= set(logged)
    assert float(logged["offpolicy/log_ratio_abs_mean"]) < 1e-4  # the toy sampler agrees with the trainer


# ------------------------------------------------------------------------------------------ dynamic sampling
def test_dynamic_sampling_rows_by_hand():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.0, 3.0, 0.0])
    rows, stats = DynamicSampling(groups=1).rows(scores, 2)
    assert rows.tolist() == [2, 3]  # the first informative group, at most one
    assert stats == {"rollout/groups_sampled": 4.0, "rollout/groups_informative_frac": 0.5, "rollout/groups_kept": 1.0}
    assert DynamicSampling().rows(scores, 2)[0].tolist() == [2, 3, 6, 7]
    with pytest.raises(ValueError, match="module.group_filter.groups must be >= 1"):
        DynamicSampling(groups=0)


class HalfDegenerate(RewardSource):
    """Scores the rows of even groups all the same, those of odd groups by their row index."""

    def __init__(self, k):
        self.k = k

    def build(self, model, tokenizer):  # noqa: F811
        return None

    def score(self, query_ids, query_mask, response_ids, masks, meta=None):
        rows = torch.arange(len(response_ids), dtype=torch.float32)
        return RewardScores(torch.where((rows // self.k) % 2 == 0, 1.0, rows), rows / 10, {"row": rows})


def test_dynamic_sampling_drops_the_degenerate_groups_before_the_advantages(world, tokenizer, tmp_path):  # noqa: F811
    module = _module(world, tokenizer, advantage=GRPO(samples_per_prompt=2), critic=None, reward=HalfDegenerate(2),
                     forward_batch_size=8, parts={"group_filter": DynamicSampling()})  # one scoring chunk
    reference_rows = []
    reference = module.reference_logprobs
    module.reference_logprobs = lambda q, qm, r: reference_rows.append(len(q)) or reference(q, qm, r)
    torch.manual_seed(0)
    rollout = module.make_rollout(_batch(world, tokenizer))  # 4 prompts x 2 samples: groups 1 and 3 informative
    assert reference_rows == [4]  # the degenerate groups left before the reference's forward
    assert rollout.raw_scores.tolist() == [2.0, 3.0, 6.0, 7.0]
    assert torch.allclose(rollout.advantages[:, 0], torch.tensor([-1.0, 1.0, -1.0, 1.0]) / 2 ** 0.5, atol=1e-4)
    assert rollout.filter_stats["rollout/groups_kept"] == 2.0
    # every product of the rollout is selected with its rows: the reward's disagreement and components too
    assert rollout.components["row"].tolist() == [2.0, 3.0, 6.0, 7.0]
    assert rollout.prompt_index.tolist() == [1, 1, 3, 3]  # each kept row's prompt (the audit reads it)
    assert rollout.disagreement.tolist() == pytest.approx([0.2, 0.3, 0.6, 0.7])
    assert module.rollout_stats(rollout)["reward/row"] == 4.5
    kept = _module(world, tokenizer, advantage=GRPO(samples_per_prompt=2), critic=None, reward=HalfDegenerate(2),
                   forward_batch_size=8, parts={"group_filter": DynamicSampling()})
    assert _fit(kept, world, tokenizer, 1, tmp_path / "kept").logged_metrics["rollout/skipped_update"] == 0.0
    # nothing informative: the rollout is empty and its update skipped, the run goes on
    flat = _module(world, tokenizer, advantage=GRPO(samples_per_prompt=2), critic=None,
                   reward=FunctionReward(lambda p, r: 0.5, name="flat"), parts={"group_filter": DynamicSampling()})
    trainer = _fit(flat, world, tokenizer, 2, tmp_path)
    assert trainer.logged_metrics["rollout/skipped_update"] == 1.0 and flat.rollouts_done == 2
    assert trainer.global_step == 0
    # empty rollouts make no optimiser step: max_empty of them in a row stop the run instead of looping for ever
    stuck = _module(world, tokenizer, advantage=GRPO(samples_per_prompt=2), critic=None,
                    reward=FunctionReward(lambda p, r: 0.5, name="flat"),
                    parts={"group_filter": DynamicSampling(max_empty=2)})
    with pytest.raises(InvariantError, match="no group with unequal scores in 2 rollouts in a row"):
        _fit(stuck, world, tokenizer, 3, tmp_path)
    with pytest.raises(ValueError, match="module.group_filter needs a group estimator"):
        _module(world, tokenizer, parts={"group_filter": DynamicSampling()})
