"""What iterative RLHF (lrlhf.run.rounds) continues from: a PPO policy adapter loaded into a new PPO module
(``init_adapter``; the reference stays the base), the reference calibration still measured with adapters off, and a
reward model trained further from its exported folder (head included)."""

import pytest
import torch

from lrlhf.models import LoraSpec, ModelConfig
from lrlhf.models.reward import HEAD_FILE
from lrlhf.modules import PPOModule, RewardConfig, RewardModule

from .test_ppo import _data, _module, tokenizer, world  # noqa: F401 (fixtures)


def _policy_weights(module):
    return {n: p.detach().clone() for n, p in module.model.named_parameters() if ".policy." in n}


def _trained_looking(module):
    """Non-zero policy LoRA weights (lora_B starts at zero: the adapter would be a no-op)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in module.model.named_parameters():
            if ".policy." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return module


def test_init_adapter_continues_the_policy_and_keeps_the_base_as_reference(world, tokenizer, tmp_path):  # noqa: F811
    first = _trained_looking(_module(world, tokenizer))
    folder = first.export(tmp_path / "export")["adapter"]
    second = PPOModule(_fresh_base(world), first.reward_model, tokenizer, first.config, init_adapter=str(folder))
    second.configure_model()
    a, b = _policy_weights(first), _policy_weights(second)
    assert a.keys() == b.keys() and a and all(torch.equal(a[n], b[n]) for n in a)

    data = _data(world, tokenizer)
    data.setup("fit")
    batch = data.collate(data.datasets["train"][:4])
    q, qm = batch["input_ids"], batch["attention_mask"]
    torch.manual_seed(0)
    r = second.sample(q, qm).response_ids
    assert torch.equal(second.policy_forward(q, qm, r)[0], first.policy_forward(q, qm, r)[0])
    untouched = _module(world, tokenizer)  # the base: adapters off is the same model whatever the adapter holds
    assert torch.equal(second.reference_logprobs(q, qm, r), untouched.reference_logprobs(q, qm, r))
    assert not torch.equal(second.policy_forward(q, qm, r)[0], untouched.policy_forward(q, qm, r)[0])


def _fresh_base(toy):
    from lrlhf.models import load_causal_lm

    return load_causal_lm(ModelConfig(str(toy.model)))


def test_init_adapter_that_does_not_fit_names_the_key(world, tokenizer, tmp_path):  # noqa: F811
    first = _trained_looking(_module(world, tokenizer))  # rank 4
    folder = first.export(tmp_path / "export")["adapter"]
    wider = PPOModule(_fresh_base(world), first.reward_model, tokenizer, {**vars(first.config),
                      "policy_lora": LoraSpec(r=8)}, init_adapter=str(folder))
    with pytest.raises(ValueError, match="module.init_adapter=.* does not fit the `policy` adapter"):
        wider.configure_model()
    missing = PPOModule(_fresh_base(world), first.reward_model, tokenizer, first.config, init_adapter=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="module.init_adapter=.*no adapter_model.safetensors"):
        missing.configure_model()


def test_reference_calibration_samples_the_reference_when_the_policy_is_continued(world, tokenizer, tmp_path):  # noqa: F811
    from lrlhf.rewards.calibration import ReferenceSamples

    data = _data(world, tokenizer)
    data.setup("fit")
    continued = _trained_looking(_module(world, tokenizer))
    fresh = _module(world, tokenizer)
    spec = ReferenceSamples(n_prompts=8, seed=3)
    assert spec.measure(continued, data) == spec.measure(fresh, data)


def test_a_reward_model_folder_is_trained_further_with_its_head(world, tokenizer, tmp_path):  # noqa: F811
    first = RewardModule(ModelConfig(str(world.model)), RewardConfig(), tokenizer=tokenizer)
    with torch.no_grad():
        for param in first.model.head.parameters():
            param.add_(1.0)  # not the initial head: a fresh one would not tell a loaded head from a new one
    folder = first.export(tmp_path / "rm")
    assert (folder / HEAD_FILE).is_file()
    again = RewardModule(ModelConfig(str(folder)), RewardConfig())
    ours, theirs = again.model.state_dict(), first.model.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert any(p.requires_grad for p in again.model.head.parameters())
    assert any(p.requires_grad for p in again.model.backbone.parameters())
    with pytest.raises(ValueError, match="module.model.name_or_path=.* is a reward model"):
        RewardModule(ModelConfig(str(folder)), RewardConfig(lora=LoraSpec(r=4)))
