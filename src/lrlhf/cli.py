"""Command-line entry point (``python train.py ...``).

The Hydra CLI with recipes lands with issue #7. Until then ``main`` runs a smoke check of the PPO math on a
synthetic rollout, so the README's first command exercises the installed package end to end.
"""

from __future__ import annotations

import sys


def smoke() -> dict[str, float]:
    """One synthetic PPO rollout through :mod:`lrlhf.functional`; returns the figures it prints."""
    import torch

    from lrlhf import functional as F

    g = torch.Generator().manual_seed(0)
    batch, resp_len, vocab, eos = 4, 6, 11, 2
    response_ids = torch.randint(3, vocab, (batch, resp_len), generator=g)
    response_ids[0, 3] = eos  # one row stops early, the others are truncated
    masks = F.response_masks(response_ids, eos_token_id=eos, pad_token_id=0)
    logits = torch.randn(batch, resp_len, vocab, generator=g)
    logprobs = F.token_logprobs(logits, response_ids, temperature=0.7)
    ref_logprobs = F.token_logprobs(logits + 0.1 * torch.randn(logits.shape, generator=g), response_ids, 0.7)
    scores = torch.randn(batch, generator=g)
    shaped = F.shape_rewards(
        scores, logprobs, ref_logprobs, masks.action_mask, masks.terminal_index, kl_coef=0.05, estimator="k1"
    )
    values = torch.randn(batch, resp_len, generator=g) * masks.action_mask
    advantages, returns = F.gae(shaped.rewards, values, masks.action_mask, gamma=1.0, lam=0.95)
    advantages = F.masked_whiten(advantages, masks.action_mask)
    loss, stats = F.ppo_policy_loss(logprobs, logprobs, advantages, masks.action_mask, clip_eps=0.2)
    return {
        "policy_loss": float(loss),
        "ratio_mean": float(stats.ratio_mean),
        "kl_per_seq": float(F.masked_mean(shaped.kl, masks.action_mask, dim=1).mean()),
        "eos_rate": float(masks.has_eos.float().mean()),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    figures = smoke()
    print("lrlhf: the Hydra CLI and recipes are not here yet (issue #7).")
    print(
        "smoke check of lrlhf.functional on a synthetic rollout: "
        + ", ".join(f"{k}={v:.4f}" for k, v in figures.items())
    )
    if argv:
        print(f"ignored arguments: {' '.join(argv)}")
    return 0
