"""DPOModule: loss and implicit rewards by hand on a bigram stub, ties dropped, policy == reference at init, one
forward for chosen + rejected, base frozen / adapter trained, export, a Trainer run on the toy world, config."""

import math
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import Trainer
from oracles import require_oracle
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from lrlhf.data.datamodules import PreferenceDataModule
from lrlhf.data.toy import WorldSizes, build_world
from lrlhf.functional import DPOLoss, IPOLoss, SimPOLoss
from lrlhf.models import LoraSpec, ModelConfig, load_causal_lm
from lrlhf.modules import DPOConfig, DPOModule

# ------------------------------------------------------------------------------------ a bigram stub
# Tokens: 0 pad, 1 prompt word P, 2 answer word A, 3 EOS. log p(next | prev) = log PROBS[prev, next] exactly.
PROBS = torch.tensor([
    [0.25, 0.25, 0.25, 0.25],  # after pad
    [0.1, 0.2, 0.5, 0.2],      # after P: P->A 0.5
    [0.1, 0.1, 0.3, 0.5],      # after A: A->A 0.3, A->EOS 0.5
    [0.7, 0.1, 0.1, 0.1],      # after EOS
])  # fmt: skip


class Bigram(nn.Module):
    def __init__(self, probs):
        super().__init__()
        self.table = nn.Parameter(probs.log())

    def forward(self, input_ids, attention_mask=None, **kwargs):
        return SimpleNamespace(logits=self.table[input_ids])  # (B, T, V)


class StubDPO(DPOModule):
    """The policy is the bigram as is (no adapter); the reference a second, uniform bigram."""

    def _with_adapter(self, model):
        self.reference = Bigram(torch.full((4, 4), 0.25))
        return model

    @torch.no_grad()
    def reference_logprobs(self, batch):
        policy, self.model = self.model, self.reference
        try:
            return self.sequence_logprobs(batch)
        finally:
            self.model = policy


def _stub_batch():
    # pair 0: prompt P, chosen "A EOS", rejected "A A EOS" (label); pair 1: a tie (prompt P, "A EOS" vs "EOS")
    ids = torch.tensor([
        [1, 2, 3, 0],  # chosen 0
        [1, 2, 3, 0],  # chosen 1 (tie)
        [1, 2, 2, 3],  # rejected 0
        [1, 3, 0, 0],  # rejected 1 (tie)
    ])  # fmt: skip
    loss_mask = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 0], [0, 1, 1, 1], [0, 1, 0, 0]], dtype=torch.bool)
    return {"input_ids": ids, "attention_mask": (ids != 0).long(), "loss_mask": loss_mask,
            "pair_targets": torch.tensor([1.0, 0.5])}


def test_loss_and_implicit_rewards_by_hand_with_the_tie_dropped():
    module = StubDPO(Bigram(PROBS), config=DPOConfig(beta=0.1))
    batch = _stub_batch()
    policy = module.sequence_logprobs(batch)
    # chosen 0: P->A 0.5, A->EOS 0.5; rejected 0: P->A 0.5, A->A 0.3, A->EOS 0.5 (the shifted mask; pads out)
    assert policy.chosen[0].item() == pytest.approx(2 * math.log(0.5), abs=1e-6)
    assert policy.rejected[0].item() == pytest.approx(math.log(0.5 * 0.3 * 0.5), abs=1e-6)
    logged = {}
    module.log = lambda name, value, **kw: logged.__setitem__(name, float(value))
    loss = module.shared_step(batch, "train")
    # log-ratios against the uniform reference (0.25 per token): chosen log(0.25 / 0.25^2) = log 4,
    # rejected log(0.075 / 0.25^3) = log 4.8; beta h = 0.1 log(4 / 4.8), loss = log(1 + 1.2^0.1)
    assert loss.item() == pytest.approx(math.log1p(1.2**0.1), abs=1e-6)
    assert logged["train/rewards_chosen"] == pytest.approx(0.1 * math.log(4), abs=1e-6)
    assert logged["train/rewards_rejected"] == pytest.approx(0.1 * math.log(4.8), abs=1e-6)
    assert logged["train/reward_margin"] == pytest.approx(0.1 * math.log(4 / 4.8), abs=1e-6)
    assert logged["train/accuracy"] == 0.0
    assert logged["train/logp_margin"] == pytest.approx(math.log(0.25 / 0.075), abs=1e-6)
    assert logged["train/ref_logp_margin"] == pytest.approx(math.log(4), abs=1e-6)  # 2 vs 3 tokens of 1/4
    assert logged["train/ties_dropped"] == 1.0
    loss.backward()
    assert module.model.table.grad is not None


def test_label_smoothing_by_hand():
    module = StubDPO(Bigram(PROBS), config=DPOConfig(beta=0.1), preference_loss=DPOLoss(label_smoothing=0.2))
    module.log = lambda *a, **kw: None
    z = 0.1 * math.log(4 / 4.8)
    # -(1 - s) log sigmoid(z) - s log sigmoid(-z), with -log sigmoid(x) = log(1 + e^-x)
    expected = 0.8 * math.log1p(math.exp(-z)) + 0.2 * math.log1p(math.exp(z))
    assert module.shared_step(_stub_batch(), "train").item() == pytest.approx(expected, abs=1e-6)


def test_ipo_divides_by_each_completions_target_tokens_from_the_loss_mask():
    module = StubDPO(Bigram(PROBS), config=DPOConfig(beta=0.5), preference_loss=IPOLoss())
    module.log = lambda *a, **kw: None
    # pair 0 (the tie is dropped): chosen 2 target tokens, log-ratio log 4; rejected 3, log 4.8
    margin = math.log(4) / 2 - math.log(4.8) / 3
    assert module.shared_step(_stub_batch(), "train").item() == pytest.approx((margin - 1.0) ** 2, abs=1e-6)


def test_simpo_runs_no_reference_pass():
    module = StubDPO(Bigram(PROBS), config=DPOConfig(beta=2.0), preference_loss=SimPOLoss(gamma=0.5))
    logged = {}
    module.log = lambda name, value, **kw: logged.__setitem__(name, float(value))

    def no_reference(batch):
        raise AssertionError("a reference-free loss must not run the reference")

    module.reference_logprobs = no_reference
    d = math.log(0.25) / 2 - math.log(0.075) / 3  # mean token log-probs of the policy alone
    loss = module.shared_step(_stub_batch(), "train")
    assert loss.item() == pytest.approx(math.log1p(math.exp(-(2.0 * d - 0.5))), abs=1e-6)
    assert "train/ref_logp_margin" not in logged
    assert logged["train/rewards_chosen"] == pytest.approx(2.0 * math.log(0.25) / 2, abs=1e-6)


def test_a_preference_loss_must_be_one():
    with pytest.raises(ValueError, match="module.preference_loss must be a PreferenceLoss"):
        StubDPO(Bigram(PROBS), preference_loss=lambda *a: None)


def test_a_batch_of_ties_gives_a_zero_loss():
    module = StubDPO(Bigram(PROBS))
    module.log = lambda *a, **kw: None
    batch = {**_stub_batch(), "pair_targets": torch.tensor([0.5, 0.5])}
    loss = module.shared_step(batch, "train")
    assert loss.item() == 0.0
    loss.backward()
    assert torch.count_nonzero(module.model.table.grad) == 0


# ------------------------------------------------------------------------------------ a tiny llama
VOCAB = 64


def tiny_llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                      vocab_size=VOCAB, bos_token_id=1, eos_token_id=1, pad_token_id=0)
    return LlamaForCausalLM(cfg)


def pair_batch(b=3, t=8, seed=1):
    """B right-padded random pairs; completion = every real token after the 2-token prompt; the last is a tie."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, t + 1, (2 * b,), generator=g)
    ids = torch.randint(2, VOCAB, (2 * b, t), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).long()
    targets = torch.ones(b)
    targets[-1] = 0.5
    return {"input_ids": ids * mask, "attention_mask": mask, "loss_mask": mask.bool() & (torch.arange(t) >= 2),
            "pair_targets": targets}


def test_policy_equals_reference_at_init():
    module = DPOModule(tiny_llama(), config=DPOConfig(beta=0.5, lora=LoraSpec(r=4)))
    logged = {}
    module.log = lambda name, value, **kw: logged.__setitem__(name, float(value))
    batch = pair_batch()
    policy, reference = module.sequence_logprobs(batch), module.reference_logprobs(batch)
    # LoRA's B starts at 0: the adapter adds exactly nothing, so every log-ratio and implicit reward is 0
    assert torch.equal(policy.chosen, reference.chosen) and torch.equal(policy.rejected, reference.rejected)
    loss = module.shared_step(batch, "train")
    assert loss.item() == pytest.approx(math.log(2), abs=1e-6)  # -log sigmoid(0)
    assert logged["train/rewards_chosen"] == 0.0 and logged["train/rewards_rejected"] == 0.0
    assert logged["train/reward_margin"] == 0.0
    assert not reference.chosen.requires_grad and policy.chosen.requires_grad


def test_one_policy_forward_for_chosen_and_rejected():
    module = DPOModule(tiny_llama(), config=DPOConfig(lora=LoraSpec(r=4)))
    module.log = lambda *a, **kw: None
    rows = []
    module.model.get_base_model().model.register_forward_hook(
        lambda mod, args, kwargs, out: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    module.training_step(pair_batch(b=3), 0)
    assert rows == [6, 6]  # the policy forward and the reference forward, each over the 2B rows


def _snapshot(module):
    return {n: p.detach().clone() for n, p in module.model.named_parameters()}


def test_base_weights_unchanged_bit_for_bit_and_the_adapter_changes_after_two_steps():
    module = DPOModule(tiny_llama(), config=DPOConfig(lr=1e-2, total_steps=2, scheduler="constant",
                                                      lora=LoraSpec(r=4)))
    module.log = lambda *a, **kw: None
    optimizer = module.configure_optimizers()["optimizer"]
    before = _snapshot(module)
    batch = pair_batch()
    for _ in range(2):
        optimizer.zero_grad()
        module.training_step(batch, 0).backward()
        optimizer.step()
    after = _snapshot(module)
    lora = [n for n in after if "lora_" in n]
    base = [n for n in after if "lora_" not in n]
    assert lora and base
    assert all(torch.equal(before[n], after[n]) for n in base)
    assert all(not module.model.get_parameter(n).requires_grad for n in base)
    assert any(not torch.equal(before[n], after[n]) for n in lora if "lora_B" in n)


def test_export_writes_the_merged_policy_and_the_adapter(tmp_path):
    module = DPOModule(tiny_llama(), config=DPOConfig(lora=LoraSpec(r=4)))
    with torch.no_grad():  # a non-zero adapter, so merging is visible
        for name, p in module.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    paths = module.export(tmp_path)
    assert (paths.adapter / "adapter_config.json").is_file()
    batch = pair_batch()
    merged = load_causal_lm(ModelConfig(str(paths.merged))).eval()
    module.model.eval()
    with torch.no_grad():
        expected = module.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        got = merged(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_packed_batches_are_refused():
    module = DPOModule(tiny_llama(), config=DPOConfig(lora=LoraSpec(r=4)))
    batch = pair_batch()
    del batch["attention_mask"]
    with pytest.raises(ValueError, match="packing=False"):
        module.sequence_logprobs(batch)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("beta", 0.0, "module.config.beta must be > 0"),
    ("scheduler", "step", "module.config.scheduler must be one of"),
    ("lora", None, "module.config.lora must be a LoRA spec"),
])
def test_config_errors_name_the_key(key, value, message):
    with pytest.raises(ValueError, match=message):
        DPOConfig(**{key: value})


def test_config_from_a_dict():
    config = DPOConfig(lora={"r": 2}, betas=[0.8, 0.9])
    assert config.lora == LoraSpec(r=2) and config.betas == (0.8, 0.9)


# ------------------------------------------------------------------------------------------------ toy world
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    sizes = WorldSizes(sft_train=4, sft_val=2, pref_train=8, pref_val=4, pref_test=2, rl=2, eval=2)
    return build_world(tmp_path_factory.mktemp("toy"), seed=0, sizes=sizes)


def test_trainer_fit_and_validate_on_the_toy_world(world):
    module = DPOModule(ModelConfig(str(world.model)), config=DPOConfig(lr=1e-3, lora=LoraSpec(r=4)))
    trainer = Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    data = PreferenceDataModule(str(world.tokenizer), train=str(world.pref_train), val=str(world.pref_val),
                                batch_size=4, max_length=96)
    trainer.fit(module, datamodule=data)
    assert trainer.global_step == 2
    metrics = trainer.validate(module, datamodule=data, verbose=False)[0]
    for key in ("val/loss", "val/accuracy", "val/rewards_chosen", "val/rewards_rejected", "val/reward_margin",
                "val/logp_margin", "val/ref_logp_margin"):
        assert key in metrics and math.isfinite(metrics[key]), key
    assert 0.0 <= metrics["val/accuracy"] <= 1.0


@pytest.mark.parametrize(("loss_type", "loss", "smoothing"), [
    ("sigmoid", DPOLoss(), 0.0), ("ipo", IPOLoss(), 0.0), ("robust", None, 0.2)])
def test_each_loss_is_trls_own_when_trl_is_installed(world, loss_type, loss, smoothing):
    """TRL's ``DPOTrainer._compute_loss`` itself (``loss_type`` of the same name) on the same batch and models (the
    policy merged, the reference the base) as an oracle at 1e-6: ``pip install --no-deps trl==1.12.0`` runs it (CI
    does not install TRL; tests/functional/test_preference_losses.py checks the transcribed formulas always)."""
    import copy
    from collections import defaultdict

    from lrlhf.functional import RobustDPOLoss

    trl_dpo = require_oracle("trl.trainer.dpo_trainer")
    torch.manual_seed(0)
    loss = loss if loss is not None else RobustDPOLoss(smoothing)
    module = DPOModule(ModelConfig(str(world.model)), config=DPOConfig(beta=0.3, lora=LoraSpec(r=4)),
                       preference_loss=loss)
    module.configure_model()
    for name, p in module.model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.3)  # the policy differs from its reference
    module.log = lambda *a, **kw: None
    data = PreferenceDataModule(str(world.tokenizer), train=str(world.pref_train), batch_size=6, max_length=96,
                                prefix_sharing=False)
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    batch = {k: v for k, v in batch.items()}
    keep = batch["pair_targets"] != 0.5
    assert bool(keep.all()), "the oracle batch has no tie"
    ours = module.shared_step(batch, "train").item()
    merged = copy.deepcopy(module.model).merge_and_unload()
    reference = copy.deepcopy(module.model).unload()
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
              "completion_mask": batch["loss_mask"].long()}
    accelerator = SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=lambda x: x, gather=lambda x: x,
                                  unwrap_model=lambda m: m)
    stub = SimpleNamespace(model=merged.train(), ref_model=reference.eval(), accelerator=accelerator,
                           aux_loss_enabled=False, precompute_ref_logps=False, ld_alpha=None,
                           f_divergence_type="reverse_kl", loss_types=[loss_type], loss_weights=[1.0], beta=0.3,
                           label_smoothing=smoothing, use_weighting=False, _total_train_tokens=0,
                           _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
                           args=SimpleNamespace(gradient_checkpointing_kwargs=None))
    theirs = trl_dpo.DPOTrainer._compute_loss(stub, merged, inputs, False).item()
    assert abs(ours - theirs) < 1e-6, (ours, theirs)
