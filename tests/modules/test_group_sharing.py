"""PPOModule with a group estimator (RLOO, GRPO) encodes each prompt once for its k samples (its ``sharing``
collaborator, lrlhf.modules.group_sharing.GroupSharing, module.config.prefix_sharing): the rollout's scores and
log-probs, and the update's log-probs and gradients, equal the unshared computation; update minibatches hold whole
groups; ``auto`` decides by the prompts' share of the columns; a setting that cannot share is refused naming its key.
The decisions are the collaborator's alone, tested without a PPOModule."""
# ruff: noqa: F811 -- the world / tokenizer fixtures come from test_ppo

import re
import warnings
from types import SimpleNamespace

import pytest
import torch

from lrlhf.data.datamodules import PromptDataModule
from lrlhf.data.shared_batches import AUTO_MIN_SHARE
from lrlhf.functional import FixedKLController
from lrlhf.models import LoraSpec, ModelConfig, ScalarModel, load_causal_lm
from lrlhf.modules import PPOConfig, PPOModule
from lrlhf.modules import group_sharing as gs
from lrlhf.modules.advantages import GAE, GRPO, RLOO
from lrlhf.modules.critic import ValueAdapter

from .test_ppo import tokenizer, world  # noqa: F401 (fixtures)

K = 2


@pytest.fixture
def batch(world, tokenizer):
    data = PromptDataModule(tokenizer, train=str(world.rl_prompts), batch_size=4, max_length=64)
    data.setup("fit")
    out = next(iter(data.train_dataloader()))
    assert len(set(out["prompt_lengths"].tolist())) > 1, "the test needs left padding of different lengths"
    return out


def _module(world, tokenizer, sharing="auto", advantage=None, critic=None, **overrides):
    config = dict(max_new_tokens=8, ppo_epochs=1, minibatch_size=4, forward_batch_size=3, lr=5e-2,
                  policy_lora=LoraSpec(r=4), prefix_sharing=sharing)
    config.update(overrides)
    torch.manual_seed(0)
    module = PPOModule(load_causal_lm(ModelConfig(str(world.model))),
                       ScalarModel(load_causal_lm(ModelConfig(str(world.model)))), tokenizer, PPOConfig(**config),
                       advantage=advantage or RLOO(samples_per_prompt=K), critic=critic,
                       kl_controller=FixedKLController(0.05))
    module.configure_model()
    return module


def _sharing(prefix_sharing="auto", k=K, minibatch_size=4, has_critic=False):
    return gs.GroupSharing(prefix_sharing, k, minibatch_size, has_critic)


def _model(attention="sdpa", **config):
    """What the sharing decision reads of a model: its config (attention, sliding window, model type)."""
    return SimpleNamespace(config=SimpleNamespace(_attn_implementation=attention, model_type="llama", **config))


class CountShared:
    """Counts the forwards that ran shared (GroupSharing.response_logits returned logits)."""

    def __init__(self, monkeypatch):
        self.calls, real = [], gs.GroupSharing.response_logits

        def counted(sharing, *args):
            out = real(sharing, *args)
            self.calls.append(out is not None)
            return out

        monkeypatch.setattr(gs.GroupSharing, "response_logits", counted)


def _close(got, expected, name=""):
    """1e-5 of the largest entry: the layouts sum the same fp32 terms in another order (tests/models/
    test_group_sharing.py), while a layout error moves entries by their own size."""
    scale = float(expected.abs().max().clamp_min(1e-12))
    error = float((got - expected).abs().max())
    assert error <= 1e-5 * scale, f"{name}: max |difference| {error:.3g} > 1e-5 x {scale:.3g}"


def test_the_rollout_scores_shared_as_it_would_unshared(world, tokenizer, batch, monkeypatch):
    counter = CountShared(monkeypatch)
    rollouts, calls = {}, {}
    for sharing in (False, True):
        module = _module(world, tokenizer, sharing, recompute_old_logprobs=True,  # the old policy forward too
                         max_new_tokens=24)
        torch.manual_seed(1)
        rollouts[sharing] = module.make_rollout(batch)
        calls[sharing], counter.calls = counter.calls, []
    plain, shared = rollouts[False], rollouts[True]
    # false never shares (8 rows in chunks of 3: 3 x 2 forwards); true shares every chunk (forward_batch_size 3
    # -> chunks of 2 rows, one group: 4 x 2 forwards)
    assert calls == {False: [False] * 6, True: [True] * 8}
    assert torch.equal(plain.response_ids, shared.response_ids)  # the sampler is untouched
    assert (~plain.action_mask).any(), "the test needs a response that stopped early"
    for name in ("logprobs", "ref_logprobs"):
        _close(torch.where(shared.action_mask, getattr(shared, name), 0),
               torch.where(plain.action_mask, getattr(plain, name), 0), name)
    _close(shared.advantages, plain.advantages, "advantages")


def test_the_update_shares_whole_groups_with_the_unshared_gradients(world, tokenizer, batch):
    module = _module(world, tokenizer, True)
    rollout = module.make_rollout(batch)
    order = module.sharing.minibatch_order(len(rollout), K, "cpu")
    assert sorted(order.tolist()) == list(range(len(rollout)))
    assert (order.reshape(-1, K) == order.reshape(-1, K)[:, :1] + torch.arange(K)).all(), "whole groups, in order"
    assert (order.reshape(-1, K)[:, 0] % K == 0).all()
    mb = rollout.select(order[:4])
    results = {}
    for sharing in (False, True):
        module.sharing = _sharing(sharing)
        module.model.zero_grad()
        logprobs, logits = module.policy_forward(mb.query_ids, mb.query_mask, mb.response_ids)
        loss, _ = module.policy_loss(logprobs, mb.logprobs, mb.advantages, mb.action_mask)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in module.model.named_parameters() if p.grad is not None}
        results[sharing] = (logprobs.detach(), logits.detach(), loss.detach(), grads)
    (lp, logits, loss, grads), (s_lp, s_logits, s_loss, s_grads) = results[False], results[True]
    mask = mb.action_mask
    _close(torch.where(mask, s_lp, 0), torch.where(mask, lp, 0), "logprobs")
    _close(s_logits[mask], logits[mask], "logits")
    # the first update's loss is -mean(A) (ratio 1), near 0: its scale is the advantages'
    assert abs(float(s_loss - loss)) <= 1e-5 * float(mb.advantages[mask].abs().mean())
    assert grads.keys() == s_grads.keys() and any("lora_" in n for n in grads)
    for name in grads:
        _close(s_grads[name], grads[name], name)
    # rows that are not whole groups of one prompt run unshared
    assert module.sharing.response_logits(module.model, mb.query_ids[1:3], mb.query_mask[1:3],
                                          mb.response_ids[1:3]) is None


def test_a_shared_run_trains_through_the_first_ratio_guard(world, tokenizer, tmp_path, monkeypatch):
    import lightning.pytorch as pl

    counter = CountShared(monkeypatch)
    module = _module(world, tokenizer, "auto", advantage=GRPO(samples_per_prompt=K), ppo_epochs=2)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, limit_train_batches=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=PromptDataModule(tokenizer, train=str(world.rl_prompts), batch_size=4,
                                                    max_length=64))
    # First the sampler self-check's forward (one row per prompt: nothing to share). Then per rollout the rollout
    # engine's weight-sync check (2 rows, not whole groups: unshared), and auto shares on the toy prompts: the
    # reference's 4 scoring chunks (fp32: the sampler's old log-probs are kept, no policy scoring forward) and the
    # update's 2 epochs x 2 minibatches of 2 whole groups.
    assert counter.calls == [False] + ([False] + [True] * (4 + 4)) * 2, counter.calls
    assert trainer.callback_metrics["guard/first_ratio_deviation"] < 1e-5


def test_auto_decides_by_the_prompts_share_of_the_columns():
    model = _model()
    # (k - 1) P / (k (P + R)) with k = 2: P = 2 R / 3 gives 0.2; the boundary sits at AUTO_MIN_SHARE
    assert gs.group_prompt_share(16, 24, 2) == pytest.approx(0.2)
    resp = 40
    prompt = 2 * AUTO_MIN_SHARE * resp / (1 - 2 * AUTO_MIN_SHARE)  # share exactly AUTO_MIN_SHARE
    assert gs.group_prompt_share(prompt, resp, 2) == pytest.approx(AUTO_MIN_SHARE)
    auto = _sharing("auto")
    assert auto.groups(model, int(prompt) + 1, resp) == K and auto.groups(model, int(prompt) - 1, resp) == 1
    assert _sharing(True).groups(model, 1, resp) == K
    assert _sharing(False).groups(model, 64, 1) == 1


def test_no_sharing_with_a_critic_or_one_sample():
    assert _sharing("auto", has_critic=True).groups(_model(), 64, 1) == 1
    assert _sharing("auto", k=1, has_critic=True).groups(_model(), 64, 1) == 1
    assert _sharing("auto", k=1).groups(_model(), 64, 1) == 1


def test_the_module_builds_its_sharing_from_its_settings(world, tokenizer):
    module = _module(world, tokenizer, "auto", advantage=GAE(samples_per_prompt=K), critic=ValueAdapter(LoraSpec(r=4)))
    assert module.sharing.scoring_group_size == 1 and module.sharing.groups(module.model, 64, 1) == 1
    module = _module(world, tokenizer, True, minibatch_size=6)
    assert (module.sharing.prefix_sharing, module.sharing.minibatch_size, module.sharing.scoring_group_size) == (
        True, 6, K)


def test_a_model_that_cannot_take_the_mask_runs_unshared_warning_once():
    sharing, model = _sharing(True), _model("flash_attention_2")
    with pytest.warns(UserWarning, match="the rollouts' forwards run unshared: the model's attention"):
        assert sharing.groups(model, 64, 1) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sharing.groups(model, 64, 1) == 1


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(sharing="yes"), "module.config.prefix_sharing must be auto, true or false, got 'yes'"),
    (dict(sharing=True, advantage=GAE(), critic=ValueAdapter(LoraSpec(r=4))),
     "module.config.prefix_sharing=true shares the prompt of k samples without a critic"),
    (dict(sharing=True, minibatch_size=3),
     "module.config.minibatch_size=3 must be a multiple of module.advantage.samples_per_prompt=2"),
])
def test_settings_that_cannot_share_are_refused_naming_the_key(world, tokenizer, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _module(world, tokenizer, **kwargs)


def test_the_sharing_refuses_what_cannot_share_without_a_module():
    with pytest.raises(ValueError, match="prefix_sharing=true shares the prompt of k samples without a critic"):
        _sharing(True, has_critic=True)
    with pytest.raises(ValueError, match="prefix_sharing=true shares the prompt of k samples without a critic"):
        _sharing(True, k=1)
    with pytest.raises(ValueError, match=re.escape("module.config.minibatch_size=3 must be a multiple of")):
        _sharing(True, minibatch_size=3)
    assert _sharing("auto", minibatch_size=3).scoring_group_size == K  # auto: a minibatch of part groups is fine


def test_whole_groups_need_one_prompt_and_mask_per_group_and_a_real_last_column():
    ids = torch.tensor([[5, 6, 7], [5, 6, 7], [4, 6, 7], [4, 6, 7]])
    mask = torch.ones_like(ids)
    assert gs.whole_groups(ids, mask, 2) and not gs.whole_groups(ids, mask, 3) and not gs.whole_groups(ids, mask, 4)
    other = mask.clone()
    other[1, 0] = 0  # the same ids (a pad id that is also a real token), another mask
    assert not gs.whole_groups(ids, other, 2)
    empty = mask.clone()
    empty[2:] = 0  # a prompt with no real token: its last column is padding
    assert not gs.whole_groups(ids, empty, 2)


def test_scoring_chunks_are_whole_groups_on_every_rank_whatever_the_rollout_decides(world, tokenizer, batch,
                                                                                     monkeypatch):
    class Rows(PPOModule):
        def reference_logprobs(self, query_ids, query_mask, response_ids):
            self.chunks.append(query_ids.shape[0])
            return super().reference_logprobs(query_ids, query_mask, response_ids)

    # auto that does not share this rollout (threshold out of reach): chunks of whole groups all the same, so a
    # rank that shares and one that does not run as many forwards (collectives under FSDP)
    monkeypatch.setattr(gs, "AUTO_MIN_SHARE", 0.99)
    config = PPOConfig(max_new_tokens=8, minibatch_size=4, forward_batch_size=3, policy_lora=LoraSpec(r=4))
    module = Rows(load_causal_lm(ModelConfig(str(world.model))),
                  ScalarModel(load_causal_lm(ModelConfig(str(world.model)))), tokenizer, config,
                  advantage=RLOO(samples_per_prompt=K))
    module.configure_model()
    module.chunks = []
    module.make_rollout(batch)
    assert module.sharing.groups(module.model, batch["input_ids"].shape[1], 8) == 1
    assert module.chunks == [2, 2, 2, 2]
    assert module.sharing.scoring_group_size == K
    assert _sharing(False).scoring_group_size == 1


def test_auto_with_a_minibatch_of_part_groups_shuffles_rows():
    sharing = _sharing("auto", minibatch_size=3)
    torch.manual_seed(3)
    order = sharing.minibatch_order(8, K, "cpu")
    torch.manual_seed(3)
    assert torch.equal(order, torch.randperm(8))


def test_a_sliding_window_narrower_than_the_shared_row_runs_unshared(world, tokenizer):
    module = _module(world, tokenizer, True)
    module.model.get_base_model().config.sliding_window = 40
    assert module.sharing.groups(module.model, 20, 10) == K  # the shared row: 20 + 2 x 10 = 40 columns, in the window
    with pytest.warns(UserWarning, match=r"sliding window \(40 tokens\) is narrower than the shared row \(41\)"):
        assert module.sharing.groups(module.model, 21, 10) == 1  # 41 columns (an unshared row, 31, would fit)
