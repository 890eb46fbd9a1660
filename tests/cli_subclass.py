"""A user's PPOModule subclass overriding one hook, for tests/test_cli.py (imported by its _target_)."""

import torch

from lrlhf.modules import PPOModule


class ConstantScorePPO(PPOModule):
    """Every response scores 0.5: the loop must use this hook, not the reward model."""

    @torch.no_grad()
    def score(self, query_ids, query_mask, response_ids, masks):
        return torch.full((query_ids.shape[0],), 0.5)
