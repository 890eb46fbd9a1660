"""A diverged run stops on its first non-finite loss, naming the step, the loss and module.config.lr (issue #20,
items 11-12): SFT, the reward model and DPO, before the optimiser step, so no NaN weights are exported."""

import pytest
import torch
from lightning.pytorch import Trainer
from torch import nn
from torch.utils.data import DataLoader

from lrlhf.models import LoraSpec
from lrlhf.modules import DPOConfig, DPOModule, RewardConfig, RewardModule, SFTConfig, SFTModule
from lrlhf.modules.optim import check_finite, check_finite_weights

from .test_dpo import pair_batch as dpo_pair_batch
from .test_reward import pair_batch as rm_pair_batch
from .test_reward import tiny_llama

# Adam's first update moves every weight by about lr: at 1e30 the next forward overflows fp32 (1e30 * 1e30).
DIVERGING_LR = 1e30


def _fit(module, batches, steps=4, val=None):
    trainer = Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      limit_val_batches=0 if val is None else 1.0)
    trainer.fit(module, DataLoader(batches, batch_size=None), val_dataloaders=val)
    return trainer


def _sft_batch(seed):
    batch = dpo_pair_batch(seed=seed)
    return {k: batch[k] for k in ("input_ids", "attention_mask", "loss_mask")}


def _finite(module):
    return all(bool(torch.isfinite(p).all()) for p in module.parameters())


MESSAGE = r"non-finite training loss at optimiser step 1 \((nan|inf|-inf)\); stopped before the optimiser step.*" \
          r"module\.config\.lr=1e\+30"


def test_sft_stops_on_a_non_finite_loss_before_the_optimiser_step():
    module = SFTModule(tiny_llama(), config=SFTConfig(lr=DIVERGING_LR, scheduler="constant"))
    with pytest.raises(FloatingPointError, match="sft: " + MESSAGE):
        _fit(module, [_sft_batch(s) for s in range(4)])


def test_reward_model_stops_on_a_non_finite_loss_not_an_attribute_error():
    module = RewardModule(tiny_llama(), RewardConfig(lr=DIVERGING_LR))
    with pytest.raises(FloatingPointError, match="reward: " + MESSAGE):
        _fit(module, [rm_pair_batch(seed=s) for s in range(4)],
             val=DataLoader([rm_pair_batch(seed=9)], batch_size=None))


def test_reward_model_validation_on_diverged_weights_names_the_rewards():
    # one step: its loss was finite, its update was not; validation's metrics used to drop every NaN margin and
    # fail with "'list' object has no attribute 'flatten'"
    module = RewardModule(tiny_llama(), RewardConfig(lr=DIVERGING_LR))
    with pytest.raises(FloatingPointError, match=r"reward: non-finite validation rewards at optimiser step 1 "
                                                 r"\(6 of 6 values non-finite\).*module\.config\.lr=1e\+30"):
        _fit(module, [rm_pair_batch(seed=0)], steps=1, val=DataLoader([rm_pair_batch(seed=9)], batch_size=None))


def test_dpo_stops_on_a_non_finite_loss_before_the_optimiser_step():
    module = DPOModule(tiny_llama(), config=DPOConfig(lr=DIVERGING_LR, lora=LoraSpec(r=4), scheduler="constant"))
    with pytest.raises(FloatingPointError, match="dpo: " + MESSAGE):
        _fit(module, [dpo_pair_batch(seed=s) for s in range(4)])


def test_check_finite_passes_finite_values_and_names_the_measured_one():
    loss = torch.tensor(0.5)
    assert check_finite(loss, "training loss", "sft", 3, 1e-3) is loss
    with pytest.raises(FloatingPointError, match=r"sft: non-finite training loss at optimiser step 3 \(nan\).*"
                                                 r"module\.config\.lr=0\.001"):
        check_finite(torch.tensor(float("nan")), "training loss", "sft", 3, 1e-3)


def test_check_finite_weights_names_the_first_non_finite_parameter():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    check_finite_weights(model, "sft", 7, 1e-3)
    with torch.no_grad():
        model[1].bias[0] = float("inf")
    with pytest.raises(FloatingPointError, match=r"sft: non-finite trained weights after optimiser step 7 \(1 "
                                                 r"tensors, first 1\.bias\); stopped before export"):
        check_finite_weights(model, "sft", 7, 1e-3)
    assert _finite(model[0])
