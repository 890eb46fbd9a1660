"""SFTModule: the masked CE by hand, token-weighted validation, full vs LoRA training, export, QLoRA, GGUF."""

import csv
import math
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader

from lrlhf.data.datamodules import SFTDataModule
from lrlhf.data.formats import load_records
from lrlhf.data.records import SFTExample
from lrlhf.data.toy import WorldSizes, build_world
from lrlhf.models import LoraSpec, ModelConfig
from lrlhf.modules import SFTConfig, SFTModule
from lrlhf.modules.optim import SCHEDULERS

SHARED_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


# ------------------------------------------------------------------------------------ a bigram stub
# Tokens: 0 pad, 1 prompt word P, 2 answer word A, 3 EOS. The stub's logits at a position are the log of
# row ``prev`` of PROBS, so log p(next | prev) = log PROBS[prev, next] exactly.
PROBS = torch.tensor([
    [0.25, 0.25, 0.25, 0.25],  # after pad
    [0.1, 0.2, 0.5, 0.2],      # after P:   P->P 0.2 (prompt, never a target), P->A 0.5
    [0.1, 0.1, 0.3, 0.5],      # after A:   A->A 0.3, A->EOS 0.5
    [0.7, 0.1, 0.1, 0.1],      # after EOS: EOS->pad 0.7 (padding, never a target)
])  # fmt: skip


class Bigram(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(PROBS.log())

    def forward(self, input_ids, attention_mask=None, **kwargs):
        return SimpleNamespace(logits=self.table[input_ids])  # (B, T, V)


def _batch(rows, masks):
    ids = torch.tensor(rows)
    return {
        "input_ids": ids,
        "attention_mask": (ids != 0).long(),
        "loss_mask": torch.tensor(masks, dtype=torch.bool),
    }


# Row 0: P P A A EOS, prompt P P. Row 1: P A EOS pad pad, prompt P.
TWO_ROWS = _batch(
    [[1, 1, 2, 2, 3], [1, 2, 3, 0, 0]],
    [[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]],
)


def test_loss_is_the_hand_computed_masked_cross_entropy():
    module = SFTModule(Bigram())
    loss = module.compute_loss(module(TWO_ROWS), TWO_ROWS)
    # Targets: row 0 A (after P) 0.5, A (after A) 0.3, EOS (after A) 0.5; row 1 A 0.5, EOS 0.5. Excluded:
    # the prompt's P->P (0.2) and the pads (EOS->pad 0.7, pad->pad 0.25). 5 targets.
    expected = -(4 * math.log(0.5) + math.log(0.3)) / 5
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    # The unshifted pairing (logits[t] scored against input_ids[t]) would give a different number.
    assert abs(loss.item() - (-(math.log(0.3) * 2 + math.log(0.5) * 3) / 5)) > 1e-2
    loss.backward()  # differentiable through token_logprobs
    assert module.model.table.grad is not None


def test_validation_loss_is_token_weighted(tmp_path):
    # Batch B: P A A A EOS -> targets A 0.5, A 0.3, A 0.3, EOS 0.5 (4 targets); TWO_ROWS has 5.
    batch_b = _batch([[1, 2, 2, 2, 3]], [[0, 1, 1, 1, 1]])
    nll_a = -(4 * math.log(0.5) + math.log(0.3))
    nll_b = -(2 * math.log(0.5) + 2 * math.log(0.3))
    token_weighted = (nll_a + nll_b) / 9
    mean_of_means = (nll_a / 5 + nll_b / 4) / 2
    assert abs(token_weighted - mean_of_means) > 1e-3  # the test can tell the two apart

    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path)
    trainer.validate(SFTModule(Bigram()), dataloaders=DataLoader([TWO_ROWS, batch_b], batch_size=None),
                     verbose=False)
    assert trainer.callback_metrics["val/loss"].item() == pytest.approx(token_weighted, abs=1e-6)
    assert trainer.callback_metrics["val/ppl"].item() == pytest.approx(math.exp(token_weighted), rel=1e-6)


# ------------------------------------------------------------------------------------------ config
@pytest.mark.parametrize("key, value", [
    ("lr", 0.0), ("weight_decay", -0.1), ("betas", (0.9, 1.0)), ("eps", 0.0), ("warmup_steps", -1),
    ("scheduler", "step"), ("total_steps", 0), ("adapter_name", ""),
])  # fmt: skip
def test_config_errors_name_the_key(key, value):
    with pytest.raises(ValueError, match=rf"module\.config\.{key} "):
        SFTConfig(**{key: value})


def test_config_takes_lora_as_a_dict():
    assert SFTConfig(lora={"r": 4}).lora == LoraSpec(r=4)


def test_schedules_by_hand():
    # warmup 2 of 6 steps: 1/2, 1, then cosine over 4 steps: 1, (1 + cos(pi/4)) / 2, 1/2, ...
    cosine = SCHEDULERS["cosine"](2, 6)
    assert [cosine(s) for s in (0, 1, 2, 4, 6)] == pytest.approx([0.5, 1.0, 1.0, 0.5, 0.0], abs=1e-12)
    assert cosine(3) == pytest.approx((1 + math.cos(math.pi / 4)) / 2, abs=1e-12)
    constant = SCHEDULERS["constant"](4, 10)
    assert [constant(s) for s in (0, 3, 9)] == [0.25, 1.0, 1.0]


# -------------------------------------------------------------------------------------- toy world
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    sizes = WorldSizes(sft_train=64, sft_val=16, pref_train=2, pref_val=2, pref_test=2, rl=2, eval=4)
    return build_world(tmp_path_factory.mktemp("toy"), seed=0, sizes=sizes)


@pytest.fixture(scope="module")
def tokenizer(world):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(world.tokenizer)  # the toy model folder holds no tokenizer


def _datamodule(world, tokenizer=None):
    return SFTDataModule(tokenizer or str(world.tokenizer), train=str(world.sft_train), val=str(world.sft_val),
                         batch_size=8, max_length=64)


def _trainer(tmp_path, max_steps, logger=False, **kw):
    return pl.Trainer(accelerator="cpu", max_steps=max_steps, logger=logger, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      log_every_n_steps=1, default_root_dir=tmp_path, **kw)


def _snapshot(module):
    return {name: p.detach().clone() for name, p in module.model.named_parameters()}


@pytest.fixture(scope="module")
def full_run(world, tokenizer, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("full")
    config = SFTConfig(lr=1e-2, warmup_steps=1)
    module = SFTModule(ModelConfig(str(world.model)), tokenizer, config)
    module.configure_model()
    before = _snapshot(module)
    trainer = _trainer(tmp, 3, logger=CSVLogger(tmp, name="csv"), val_check_interval=3, limit_val_batches=2)
    trainer.fit(module, datamodule=_datamodule(world, module.tokenizer))
    return SimpleNamespace(module=module, before=before, trainer=trainer, tmp=tmp)


@pytest.fixture(scope="module")
def lora_run(world, tokenizer, tmp_path_factory):
    config = SFTConfig(lr=1e-2, lora=LoraSpec(r=4))
    module = SFTModule(ModelConfig(str(world.model)), tokenizer, config)
    module.configure_model()
    before = _snapshot(module)
    _trainer(tmp_path_factory.mktemp("lora"), 2, limit_val_batches=0).fit(module, datamodule=_datamodule(world))
    return SimpleNamespace(module=module, before=before)


def test_fit_logs_losses_throughput_and_lr(full_run):
    log_dir = Path(full_run.trainer.log_dir)
    with (log_dir / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    columns = set(rows[0])
    for name in ("train/loss", "train/tokens_per_s", "train/target_tokens_per_s", "train/lr", "val/loss",
                 "val/ppl"):
        assert name in columns, name
    val = [r for r in rows if r["val/loss"]]
    assert len(val) == 1 and float(val[0]["val/ppl"]) == pytest.approx(math.exp(float(val[0]["val/loss"])),
                                                                       rel=1e-5)


def test_full_finetuning_changes_base_weights(full_run):
    after = _snapshot(full_run.module)
    changed = [name for name in after if not torch.equal(after[name], full_run.before[name])]
    assert len(changed) == len(after)  # every parameter is trained (all receive gradient on this data)


def test_lora_changes_only_lora_weights(lora_run):
    after = _snapshot(lora_run.module)
    lora = [n for n in after if "lora_" in n]
    assert lora and all("policy" in n for n in lora)
    for name in after:
        if "lora_B" in name:  # B starts at 0 and moves on the first step
            assert not torch.equal(after[name], lora_run.before[name]), name
        elif "lora_" not in name:
            assert torch.equal(after[name], lora_run.before[name]), name  # base bit for bit
    trainable = {n for n, p in lora_run.module.model.named_parameters() if p.requires_grad}
    assert trainable == set(lora)


def _logits(model, ids):
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_full_export_reloads_with_plain_transformers(full_run, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    paths = full_run.module.export(tmp_path)
    assert paths.adapter is None
    ids = torch.randint(0, 80, (2, 12))
    reloaded = AutoModelForCausalLM.from_pretrained(paths.merged)
    torch.testing.assert_close(_logits(reloaded, ids), _logits(full_run.module.model, ids), rtol=0, atol=1e-6)
    assert AutoTokenizer.from_pretrained(paths.merged).chat_template == full_run.module.tokenizer.chat_template


def test_lora_export_reloads_merged_and_as_adapter(lora_run, world, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    paths = lora_run.module.export(tmp_path)
    ids = torch.randint(0, 80, (2, 12))
    live = _logits(lora_run.module.model, ids)
    merged = AutoModelForCausalLM.from_pretrained(paths.merged)
    # merging folds B A into W: the same function up to fp32 rounding of the sum
    torch.testing.assert_close(_logits(merged, ids), live, rtol=0, atol=1e-5)
    adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(world.model), paths.adapter)
    torch.testing.assert_close(_logits(adapter, ids), live, rtol=0, atol=1e-6)
    assert "policy" in lora_run.module.model.peft_config  # the live model keeps its adapter


def test_qlora_4bit_trains_two_steps_on_cpu(world, tokenizer, tmp_path):
    module = SFTModule(ModelConfig(str(world.model), quantization="4bit"), tokenizer,
                       SFTConfig(lr=1e-2, lora=LoraSpec(r=4)))
    module.configure_model()
    assert any(type(m).__name__ == "Linear4bit" for m in module.model.modules())
    before = _snapshot(module)
    trainer = _trainer(tmp_path, 2, limit_val_batches=0)
    trainer.fit(module, datamodule=_datamodule(world, module.tokenizer))
    after = _snapshot(module)
    assert math.isfinite(trainer.callback_metrics["train/loss"].item())
    lora_b = [n for n in after if "lora_B" in n]
    assert lora_b and all(not torch.equal(after[n], before[n]) for n in lora_b)


# --------------------------------------------------------------------------------------- GGUF model
@pytest.mark.slow
def test_smollm2_gguf_lora_two_sft_steps(tmp_path, smollm2_config):
    model_cfg = smollm2_config
    alpaca = SHARED_DATA / "llama-factory" / "alpaca_en_demo.json"
    module = SFTModule(model_cfg, config=SFTConfig(lr=1e-4, lora=LoraSpec(r=4)))
    if alpaca.is_file():
        records, _ = load_records(str(alpaca), "sft", verbose=False)
        records = records[:8]
    else:  # an outside clone has no ../shared: a handful of toy conversations instead
        records = [SFTExample([{"role": "user", "content": f"count to {n}"},
                               {"role": "assistant", "content": " ".join(map(str, range(1, n + 1)))}])
                   for n in range(2, 10)]
    data = SFTDataModule(module.tokenizer, train=records, batch_size=2, max_length=128)
    module.configure_model()
    before = _snapshot(module)
    trainer = _trainer(tmp_path, 2, limit_val_batches=0)
    trainer.fit(module, datamodule=data)
    after = _snapshot(module)
    assert math.isfinite(trainer.callback_metrics["train/loss"].item())
    assert all(torch.equal(after[n], before[n]) for n in after if "lora_" not in n)
    assert any(not torch.equal(after[n], before[n]) for n in after if "lora_B" in n)


def test_linear_schedule_by_hand():
    # warmup 2 of 6 steps: 1/2, 1, then linear from 1 to 0 over the remaining 4 steps
    linear = SCHEDULERS["linear"](2, 6)
    assert [linear(s) for s in range(7)] == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
