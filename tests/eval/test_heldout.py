"""The one held-out path (early stopping and recipe=eval): rows, RNG isolation, KL over the actions, calibration."""

import torch

from lrlhf.data.records import PromptExample
from lrlhf.data.toy.vocab import build_tokenizer
from lrlhf.eval.heldout import sample_held_out
from lrlhf.functional import ResponseMasks

PROMPTS = [PromptExample([{"role": "user", "content": "sort 3 1 2"}], meta={"p": 0}),
           PromptExample([{"role": "user", "content": "count 1 1"}], meta={"p": 1})]


class Halve:
    def normalise(self, scores):
        return scores / 2


class StubPolicy:
    """Draws 4 random tokens per row then EOS at column 2 of even rows; policy log-probs 0, reference -1 per
    token; raw score = number of actions."""

    def __init__(self, reference=True, calibration=None):
        self.tokenizer = build_tokenizer()
        self.pad_token_id, self.eos_token_ids = self.tokenizer.pad_token_id, [self.tokenizer.eos_token_id]
        self.device, self.reference, self.calibration = torch.device("cpu"), reference, calibration

    def generate(self, q, qm):
        r = torch.randint(10, 20, (q.shape[0], 4))  # (B, 4): consumes the forked RNG
        r[::2, 2] = self.eos_token_ids[0]
        return r

    def logprobs_and_reference(self, q, qm, r):
        return (torch.zeros(r.shape), -torch.ones(r.shape)) if self.reference else None

    def score(self, q, qm, r, masks: ResponseMasks, meta=None):
        return masks.lengths.float()


def test_rows_rng_kl_and_calibration():
    torch.manual_seed(7)
    expected_next = torch.rand(3)
    torch.manual_seed(7)
    out = sample_held_out(StubPolicy(calibration=Halve()), PROMPTS, n=3, seed=5, batch_size=4)
    assert torch.equal(torch.rand(3), expected_next)  # the caller's random stream is untouched
    assert [r.meta["p"] for r in out.records] == [0, 0, 0, 1, 1, 1]  # sample i of prompt p is row p * n + i
    # batches of 4 and 2 rows: EOS at column 2 of rows 0, 2 (batch 1) and 4 (batch 2, its row 0) -> 3 actions
    assert out.lengths.tolist() == [3, 4, 3, 4, 3, 4]
    assert [len(ids) for ids in out.ids] == out.lengths.tolist()
    assert out.kl.tolist() == [3.0, 4.0, 3.0, 4.0, 3.0, 4.0]  # k1 = 0 - (-1) on every action, none after EOS
    assert out.proxy.tolist() == [1.5, 2.0, 1.5, 2.0, 1.5, 2.0]  # calibrated: halved
    again = sample_held_out(StubPolicy(reference=False), PROMPTS, n=3, seed=5, batch_size=4)
    assert again.texts == out.texts and again.ids == out.ids  # seeded
    assert again.kl.tolist() == [0.0] * 6 and again.proxy.tolist() == out.lengths.float().tolist()  # raw scores
    other = sample_held_out(StubPolicy(), PROMPTS, n=3, seed=6, batch_size=4)
    assert other.ids != out.ids
