"""QLoRA (``quantization="4bit"``) beyond SFT: a 4-bit LoRA reward model trains and exports, and PPO runs all four
roles on one 4-bit base, the RM's adapter scoring exactly as the RM did (#15 item 5)."""

import copy

import lightning.pytorch as pl
import pytest
import torch

from lrlhf.data.datamodules import PreferenceDataModule, PromptDataModule
from lrlhf.data.toy import WorldSizes, build_world
from lrlhf.functional import FixedKLController
from lrlhf.models import LoraSpec, ModelConfig
from lrlhf.models.reward import load_reward_model
from lrlhf.modules import PPOConfig, PPOModule, RewardAdapter, RewardConfig, RewardModule
from lrlhf.modules.critic import ValueAdapter

pytest.importorskip("bitsandbytes")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    sizes = WorldSizes(sft_train=4, sft_val=4, pref_train=16, pref_val=4, pref_test=4, rl=8, eval=4)
    return build_world(tmp_path_factory.mktemp("toy"), seed=0, sizes=sizes)


def _trainer(tmp_path, **kw):
    return pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=tmp_path, **kw)


def _quantised(model) -> bool:
    import bitsandbytes as bnb

    return any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())  # not peft's LoRA wrapper of one


@pytest.fixture(scope="module")
def qlora_rm(world, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rm")
    torch.manual_seed(0)
    module = RewardModule(ModelConfig(str(world.model), quantization="4bit"), RewardConfig(lr=5e-2, lora=LoraSpec(r=4)),
                          tokenizer=str(world.tokenizer))
    before = {n: p.detach().clone() for n, p in module.model.named_parameters() if p.requires_grad}
    data = PreferenceDataModule(str(world.tokenizer), train=str(world.pref_train), batch_size=4, max_length=128)
    _trainer(tmp, max_steps=3, limit_val_batches=0).fit(module, datamodule=data)
    return module, before, module.export(tmp / "model")


def test_a_4bit_lora_reward_model_trains_and_exports_dequantised(world, qlora_rm):
    module, before, folder = qlora_rm
    assert _quantised(module.model)
    after = dict(module.model.named_parameters())
    trained = [n for n in before if "lora_B" in n or n.startswith("head.")]
    assert trained and all(not torch.equal(after[n].detach(), before[n]) for n in trained)
    assert not any(p.requires_grad for n, p in after.items() if n not in before)  # the 4-bit base stays frozen
    # saved dequantised (a quantised checkpoint re-loaded with a quantization config cannot be saved again)
    assert "quantization_config" not in (folder / "config.json").read_text()
    standalone = load_reward_model(folder)
    ids = torch.tensor([[1, 5, 6, 7, 3, 8, 9]])
    mask = torch.ones_like(ids)
    # the reference: the live RM with its 4-bit layers dequantised in place, the LoRA adapter kept unmerged; the
    # export must be that model (base + B A merged in fp32: equal to fp32 rounding). peft's own merge into 4-bit
    # layers re-quantised the sum: 0.10 off on a score of 2.5.
    reference = copy.deepcopy(module.model).eval()
    reference.backbone.get_base_model().dequantize()
    assert not _quantised(reference) and set(reference.backbone.peft_config) == {"reward"}
    with torch.no_grad():
        torch.testing.assert_close(standalone.score(ids, mask), reference.score(ids, mask), atol=1e-5, rtol=1e-5)


def test_ppo_runs_every_role_on_one_4bit_base_with_the_reward_adapter(world, qlora_rm, tmp_path):
    module_rm, _, folder = qlora_rm
    tokenizer = module_rm.tokenizer
    config = PPOConfig(max_new_tokens=6, ppo_epochs=1, minibatch_size=2, forward_batch_size=4, lr=5e-2,
                       policy_lora=LoraSpec(r=4))
    torch.manual_seed(0)
    ppo = PPOModule(ModelConfig(str(world.model), quantization="4bit"), RewardAdapter(str(folder)), tokenizer,
                    config, critic=ValueAdapter(LoraSpec(r=4)), kl_controller=FixedKLController(0.1))
    ppo.configure_model()
    assert _quantised(ppo.model) and set(ppo.model.peft_config) == {"policy", "value", "reward"}
    assert [n for n, _ in ppo.reward_model.named_parameters()] == ["head.linear.weight", "head.linear.bias"]
    # the reward adapter on the policy's 4-bit base scores as the 4-bit RM did (the same quantised weights)
    ids = torch.tensor([[1, 5, 6, 7, 3, 8, 9]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        torch.testing.assert_close(ppo.reward_model.score(ids, mask), module_rm.model.eval().score(ids, mask),
                                   atol=1e-5, rtol=1e-5)
    before = {n: p.detach().clone() for n, p in ppo.model.named_parameters()}
    data = PromptDataModule(tokenizer, train=str(world.rl_prompts), batch_size=4, max_length=64)
    _trainer(tmp_path, max_epochs=1, limit_train_batches=2, limit_val_batches=0).fit(ppo, datamodule=data)
    after = dict(ppo.model.named_parameters())
    assert any(not torch.equal(after[n].detach(), before[n]) for n in after if "lora_B" in n and ".policy." in n)
    assert all(torch.equal(after[n].detach(), before[n]) for n in after if ".reward." in n)
    assert ppo.rollouts_done == 2


def test_full_fine_tuning_of_a_quantised_model_is_refused_by_key(world):
    # it "trained" before: only the embeddings, norms and head, with every check green
    from lrlhf.modules import SFTConfig, SFTModule

    with pytest.raises(ValueError, match=r"module\.config\.lora is null \(full fine-tuning\).*quantised.*rm\.lora"):
        RewardModule(ModelConfig(str(world.model), quantization="4bit"), RewardConfig(lora=None))
    sft = SFTModule(ModelConfig(str(world.model), quantization="4bit"), str(world.tokenizer), SFTConfig(lora=None))
    with pytest.raises(ValueError, match=r"module\.config\.lora is null.*recipe=sft_lora"):
        sft.configure_model()
