"""A user's PPOModule subclass overriding one hook, and a user's advantage estimator, for tests/test_cli.py
(imported by their _target_; this folder is on PYTHONPATH there). MaxBaseline is the example of docs/extending.md."""

from dataclasses import dataclass

import torch

from lrlhf.modules import PPOModule
from lrlhf.modules.advantages import GroupAdvantage
from lrlhf.rewards.protocol import TextReward


class ConstantScorePPO(PPOModule):
    """Every response scores 0.5: the loop must use this hook, not the reward model."""

    @torch.no_grad()
    def score(self, query_ids, query_mask, response_ids, masks):
        return torch.full((query_ids.shape[0],), 0.5)


class NoCriticPPO(PPOModule):
    """Fails if a critic is built: RLOO / GRPO recipes must train without one (no value adapter, head or loss)."""

    def configure_model(self):
        super().configure_model()
        assert self.critic is None and "value" not in self.model.peft_config, "a critic was built"

    def value_loss(self, *args):
        raise AssertionError("a value loss ran without a critic")


@dataclass(frozen=True, kw_only=True)
class MaxBaseline(GroupAdvantage):
    """A_i = r_i - max_j r_j over the samples of a prompt: only a prompt's best sample is not pushed down."""

    name = "max_baseline"  # the summary's gold/max_baseline

    def sequence_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        groups = rewards.reshape(-1, self.samples_per_prompt)  # (prompts, k), a prompt's samples adjacent
        return (groups - groups.max(dim=1, keepdim=True).values).reshape(-1)


def prefer_longer(prompt, a: str, b: str) -> float:
    """A pairwise annotator of tests/test_rounds.py (rounds.annotator=PairwiseAnnotator): the longer response
    wins, equal lengths tie; a labeller of the file exchange applies the same rule by hand."""
    return 1.0 if len(a) > len(b) else 0.0 if len(a) < len(b) else 0.5


class ShortAnswer(TextReward):
    """docs/rewards.md's own reward in a few lines: shorter answers score higher; the word count is a component."""

    name = "short_answer"

    def score_texts(self, prompts, responses):
        words = [len(r.split()) for r in responses]
        return [1.0 / (1 + w) for w in words], {"words": [float(w) for w in words]}

