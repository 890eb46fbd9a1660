"""One optimiser/schedule config for every module (#16 item 3): declared and checked once, keys unchanged."""

import dataclasses

import pytest
import torch
from torch import nn

from lrlhf.modules import DPOConfig, PPOConfig, RewardConfig, SFTConfig
from lrlhf.modules.optim import OptimConfig

CONFIGS = (SFTConfig, DPOConfig, RewardConfig, PPOConfig)
FIELDS = {f.name for f in dataclasses.fields(OptimConfig)}


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_module_config_has_the_optimiser_fields_and_their_checks(cls):
    assert issubclass(cls, OptimConfig) and FIELDS <= {f.name for f in dataclasses.fields(cls)}
    kwargs = {"lora": {"r": 4}} if cls is DPOConfig else {}
    for key, bad in (("lr", 0.0), ("weight_decay", -1.0), ("betas", (0.9, 1.0)), ("eps", 0.0),
                     ("warmup_steps", -1), ("scheduler", "step"), ("total_steps", 0)):
        with pytest.raises(ValueError, match=rf"^module\.config\.{key} must"):
            cls(**kwargs, **{key: bad})


def test_the_settings_reach_adamw_and_the_schedule():
    config = OptimConfig(lr=0.5, weight_decay=0.1, betas=(0.8, 0.9), eps=1e-6, warmup_steps=2, scheduler="linear")
    model = nn.Linear(3, 2)
    out = config.optimizers(model, total_steps=10)
    optimizer, schedule = out["optimizer"], out["lr_scheduler"]["scheduler"]
    decayed, plain = optimizer.param_groups  # the matrix is decayed, the bias is not
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert decayed["betas"] == (0.8, 0.9) and decayed["eps"] == 1e-6
    assert [round(schedule.lr_lambdas[0](s), 6) for s in (0, 1, 2, 6, 10)] == [0.5, 1.0, 1.0, 0.5, 0.0]
    assert OptimConfig(total_steps=4).optimizers(model, total_steps=10)["lr_scheduler"]["scheduler"].lr_lambdas[0](
        4) == pytest.approx(0.0)  # total_steps set wins over the Trainer's estimate (cosine reaches 0 at 4)
    torch.testing.assert_close(torch.tensor(optimizer.param_groups[0]["lr"]), torch.tensor(0.25))  # step 0: 1/2
