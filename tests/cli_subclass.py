"""A user's PPOModule subclass overriding one hook, for tests/test_cli.py (imported by its _target_)."""

import torch

from lrlhf.modules import PPOModule


class ConstantScorePPO(PPOModule):
    """Every response scores 0.5: the loop must use this hook, not the reward model."""

    @torch.no_grad()
    def score(self, query_ids, query_mask, response_ids, masks):
        return torch.full((query_ids.shape[0],), 0.5)


class NoCriticPPO(PPOModule):
    """Fails if the value model is built or run: RLOO / GRPO recipes must train without a critic."""

    def configure_model(self):
        super().configure_model()
        assert self.value_head is None and "value" not in self.model.peft_config, "a critic was built"

    def value_forward(self, query_ids, query_mask, response_ids):
        raise AssertionError("value_forward ran without a critic")
