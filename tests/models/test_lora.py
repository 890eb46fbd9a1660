import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from lrlhf.models import (
    LORA_TARGET_MODULES,
    LoraSpec,
    ModelConfig,
    add_adapters,
    export_adapter,
    export_merged,
    load_causal_lm,
    lora_target_modules,
    reference_mode,
)

IDS = torch.tensor([[3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]])


def _train_adapter(model, steps=3):
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2)
    for _ in range(steps):
        loss = model(input_ids=IDS, labels=IDS).loss
        loss.backward()
        opt.step()
        opt.zero_grad()


def test_target_modules_resolved_per_architecture(tiny_model):
    targets = lora_target_modules(tiny_model)
    assert targets == LORA_TARGET_MODULES[tiny_model.config.model_type]
    peft_model = add_adapters(tiny_model, {"policy": LoraSpec(r=2)})
    adapted = {n.split(".")[-1] for n, m in peft_model.named_modules() if hasattr(m, "lora_A") and "policy" in m.lora_A}
    assert adapted == set(targets)  # every listed module exists in this architecture and nothing else is adapted


def test_unknown_architecture_falls_back_to_all_linear(tiny_llama):
    tiny_llama.config.model_type = "somethingnew"
    assert lora_target_modules(tiny_llama) == "all-linear"


def test_base_unchanged_lora_changed_and_reference_is_the_base(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path / "base")
    before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    peft_model = add_adapters(tiny_model, {"policy": LoraSpec(r=4)})
    lora_before = {n: p.detach().clone() for n, p in peft_model.named_parameters() if "lora_" in n}
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n and ".policy." in n for n in trainable)
    _train_adapter(peft_model)
    base_after = dict(peft_model.get_base_model().named_parameters())
    for name, value in before.items():
        # peft renames adapted layers' weights to `...base_layer.weight`
        key = (
            name
            if name in base_after
            else name.replace(".weight", ".base_layer.weight").replace(".bias", ".base_layer.bias")
        )
        assert torch.equal(base_after[key], value), name
    changed = [n for n, p in peft_model.named_parameters() if "lora_B" in n and not torch.equal(p, lora_before[n])]
    assert changed
    # the reference (all adapters disabled) equals a separately loaded base, bit for bit
    separate = AutoModelForCausalLM.from_pretrained(tmp_path / "base").eval()
    peft_model.eval()
    with torch.no_grad(), reference_mode(peft_model):
        ref_logits = peft_model(input_ids=IDS).logits
    with torch.no_grad():
        assert torch.equal(ref_logits, separate(input_ids=IDS).logits)
        assert not torch.allclose(peft_model(input_ids=IDS).logits, ref_logits, atol=1e-3)


def test_roles_are_isolated(tiny_llama):
    model = add_adapters(tiny_llama, {"policy": LoraSpec(r=2), "value": LoraSpec(r=2)})
    assert model.active_adapter == "policy"
    _train_adapter(model)  # trains the policy adapter only
    value_b = [p for n, p in model.named_parameters() if "lora_B.value" in n]
    assert value_b and all((p == 0).all() for p in value_b)  # untouched: still at peft's zero init
    model.set_adapter("value")
    model.eval()
    with torch.no_grad():
        value_logits = model(input_ids=IDS).logits
        with reference_mode(model):
            ref_logits = model(input_ids=IDS).logits
    assert torch.equal(value_logits, ref_logits)  # a zero-init adapter is the identity


def test_exports_reload_with_plain_transformers_and_peft(tiny_llama, tmp_path):
    tiny_llama.save_pretrained(tmp_path / "base")
    model = add_adapters(tiny_llama, {"policy": LoraSpec(r=4), "value": LoraSpec(r=4)})
    _train_adapter(model)
    model.eval()
    with torch.no_grad():
        live = model(input_ids=IDS).logits
    export_merged(model, tmp_path / "merged", adapter="policy")
    assert set(model.peft_config) == {"policy", "value"}  # the live model keeps its adapters
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert not any("lora" in n for n, _ in merged.named_parameters())
    with torch.no_grad():
        # W + BA merged in fp32 rounds differently from x W + (x A) B: equal to fp32 accuracy, not bitwise
        torch.testing.assert_close(merged(input_ids=IDS).logits, live, atol=1e-5, rtol=1e-5)
    export_adapter(model, tmp_path / "adapter", adapter="policy")
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    reloaded = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=IDS).logits, live)


def test_adapter_as_starting_model_is_merged(tiny_llama, tmp_path):
    tiny_llama.save_pretrained(tmp_path / "base")
    model = add_adapters(tiny_llama, {"sft": LoraSpec(r=4)})
    _train_adapter(model)
    model.peft_config["sft"].base_model_name_or_path = str(tmp_path / "base")
    export_adapter(model, tmp_path / "sft_adapter", adapter="sft")
    model.eval()
    with torch.no_grad():
        expected = model(input_ids=IDS).logits
    loaded = load_causal_lm(ModelConfig(str(tmp_path / "sft_adapter")))
    assert not isinstance(loaded, PeftModel) and loaded.training
    loaded.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=IDS).logits, expected, atol=1e-5, rtol=1e-5)


def test_lora_on_the_last_layers_only_trains_and_backpropagates_through_those(tiny_llama):
    import pytest

    n = tiny_llama.config.num_hidden_layers
    assert n >= 2
    model = add_adapters(tiny_llama, {"policy": LoraSpec(r=2, layers=1)})
    layers = {int(name.split(".layers.")[1].split(".")[0]) for name, _ in model.named_parameters() if "lora_" in name}
    assert layers == {n - 1}
    ids = torch.randint(0, tiny_llama.config.vocab_size, (2, 6))
    seen = []
    first = model.base_model.model.model.layers[0]
    first.register_full_backward_hook(lambda *args: seen.append(1))
    model(ids).logits.sum().backward()
    assert not seen  # nothing below the adapted layer needs a gradient: backward stops above it
    with pytest.raises(ValueError, match=r"lora.layers=\[7\]: the model has"):
        add_adapters(_fresh(tiny_llama), {"policy": LoraSpec(r=2, layers=[7])})
    with pytest.raises(ValueError, match="lora.layers must be null, a count > 0 or a list"):
        LoraSpec(layers=0)


def _fresh(model):
    from transformers import AutoModelForCausalLM as Auto

    return Auto.from_config(model.config)
