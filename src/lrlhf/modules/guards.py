"""Run-time invariants of PPO, cheap and on by default: when one breaks the run stops, naming the measured value
and the likely cause, instead of training on corrupted data.

- **The first-update ratio.** Before the first optimiser step of a rollout the policy has not moved, so the ratio
  ``exp(logprob - old_logprob)`` of every action in the first minibatch must be 1 up to kernel rounding. A ratio
  far from 1 means the rollout's old log-probs are not the update's: a sampler that saw another context (a KV
  cache the model ignored), another temperature, dropout in sampling or scoring, or half-precision kernels that
  round differently (``recompute_old_logprobs`` off).
- **The sampler against a teacher-forced forward** (:func:`sampler_self_check`): once per fit, before the first
  rollout, a few prompts are sampled and their log-probs compared with a full forward under the run's precision.
- **Half precision** switches ``recompute_old_logprobs`` on unless the user set it (:func:`run_precision`).

The tolerance bounds the mean of ``|ratio - 1|`` over the minibatch's valid actions (computed in fp64), per
precision: full fp32 kernels agree to ~1e-6 (measured on the toy model and four architectures), half precision
or TF32 matmuls round at ~4e-3 relative per operation (see :data:`RATIO_TOLERANCE`). The defect these guards were
written for measured mean ratio 0.61, max 12 (the ignored-cache sampler under transformers 5.17).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from lrlhf.models.engines import HALF_DTYPES
from lrlhf.models.lora import is_quantised
from lrlhf.utils.compat import unwrap_model
from lrlhf.utils.distributed import any_across_ranks
from lrlhf.utils.errors import InvariantError

#: Bound on the mean ``|ratio - 1|`` at the first update: full precision, reduced precision (half, TF32, k-bit).
#: In bf16 a logit of magnitude 16 to 32 has an ulp of 0.06 to 0.125: two kernels that round it to neighbouring
#: values move that token's ratio by as much, so the bound is on the mean over actions, where such flips are a
#: fraction of the tokens, and 0.1 leaves them room while the defects it exists for measure 0.3 and more.
RATIO_TOLERANCE = {False: 1e-3, True: 0.1}


@dataclass(frozen=True)
class Precision:
    """How the policy's forwards compute: ``label`` for messages, ``reduced`` for half / TF32 / k-bit."""

    label: str
    reduced: bool

    @property
    def tolerance(self) -> float:
        return RATIO_TOLERANCE[self.reduced]


def run_precision(trainer, model) -> Precision:
    """The precision the policy runs under: the Trainer's (``bf16-mixed``, ``16-mixed``, ``*-true``), the weights'
    dtype, k-bit quantisation, and TF32 matmuls on CUDA."""
    precision = str(getattr(trainer, "precision", "32-true")) if trainer is not None else "32-true"
    base = unwrap_model(model)
    weights = next((p for p in base.parameters() if p.is_floating_point()), None)
    dtype = weights.dtype if weights is not None else torch.float32
    parts = [f"precision {precision}", f"{str(dtype).replace('torch.', '')} weights"]
    reduced = precision.startswith(("16", "bf16")) or dtype in HALF_DTYPES
    if is_quantised(base):
        parts.append("k-bit quantised")
        reduced = True
    if weights is not None and weights.is_cuda and torch.backends.cuda.matmul.allow_tf32:
        parts.append("TF32 matmuls")
        reduced = True
    return Precision(", ".join(parts), reduced)


def ratio_deviation(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> dict[str, float]:
    """fp64 statistics of ``ratio = exp(logprobs - old_logprobs)`` over ``mask``: mean and max ``|ratio - 1|``,
    the ratio's range and the number of actions (empty mask: ``actions`` 0 and nothing else)."""
    mask = mask.bool()
    if not mask.any():
        return {"actions": 0}
    ratio = (logprobs.detach().double() - old_logprobs.detach().double())[mask].exp()
    deviation = (ratio - 1).abs()
    return {"actions": int(mask.sum()), "mean": float(deviation.mean()), "max": float(deviation.max()),
            "min_ratio": float(ratio.min()), "max_ratio": float(ratio.max())}


CAUSES = (
    "likely causes: (1) the sampler and the scoring forward disagree: a KV cache the model ignored "
    "(lrlhf.utils.compat.cache_keyword), another temperature or distribution in an overridden sample()/generate(), "
    "a tokenisation or position-id mismatch; (2) dropout active while sampling or scoring (the model left in "
    "train() mode: PPO runs both in eval mode); (3) reduced precision with module.config.recompute_old_logprobs="
    "false (the sampler's cached one-token kernels round differently from the full forward: set it to true)"
)


def check_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, precision: Precision,
                tolerance: float | None, where: str) -> dict[str, float]:
    """Raise :class:`InvariantError` when the mean ``|ratio - 1|`` over ``mask`` exceeds ``tolerance`` (None: the
    precision's); returns the statistics."""
    stats = ratio_deviation(logprobs, old_logprobs, mask)
    bound = precision.tolerance if tolerance is None else tolerance
    if stats["actions"] and not stats["mean"] <= bound:  # NaN fails too
        raise InvariantError(
            f"PPO invariant broken {where}: before any update the policy ratio exp(logprob - old_logprob) must be "
            f"1, measured mean |ratio - 1| = {stats['mean']:.3g} (max {stats['max']:.3g}, ratio in "
            f"[{stats['min_ratio']:.3g}, {stats['max_ratio']:.3g}] over {stats['actions']} actions) against a "
            f"tolerance of {bound:g} for {precision.label}. The rollout's old log-probs are not the ones the update "
            f"computes; {CAUSES}. The bound is module.config.first_ratio_tolerance (null = by precision)."
        )
    return stats


@torch.no_grad()
def sampler_self_check(sample, policy_forward, eos_token_ids, pad_token_id: int, query_ids: Tensor,
                       query_mask: Tensor, precision: Precision, tolerance: float | None, rows: int = 4,
                       max_new_tokens: int = 8, seed: int = 0) -> dict:
    """Sample ``rows`` prompts with ``sample`` (:meth:`PPOModule.sample`, its own RNG stream: the caller's is left
    as it was) and compare the sampled tokens' log-probs with a teacher-forced ``policy_forward``
    (:meth:`PPOModule.policy_forward`) under the current precision; the sampler itself checks that decoding fills
    its KV cache. A sampler that returns no log-probs is not checked. Returns the statistics."""
    from lrlhf.functional import response_masks

    query_ids, query_mask = query_ids[:rows], query_mask[:rows]
    device = query_ids.device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        ids, logprobs = sample(query_ids, query_mask, max_new_tokens)[:2]
    if logprobs is None:  # the old logprobs come from a scoring forward: the first-update ratio guard still runs
        return {"actions": 0}
    mask = response_masks(ids, eos_token_ids, pad_token_id).action_mask
    forward = policy_forward(query_ids, query_mask, ids)[0]
    return check_ratio(forward, logprobs, mask, precision, tolerance,
                       "in the sampler self-check (the sampler's log-probs against a teacher-forced forward)")


@torch.no_grad()
def check_engine_sync(engine, policy_forward, query_ids: Tensor, query_mask: Tensor, temperature: float,
                      precision: Precision, tolerance: float | None, rollout: int, rows: int = 2,
                      tokens: int = 8) -> dict:
    """After a weight sync: the rollout engine's teacher-forced log-probs (:meth:`RolloutEngine.logprobs`) of a few
    fixed tokens (the last ``tokens`` of the first ``rows`` prompts, read again after them) against the trainer's
    (``policy_forward``, :meth:`PPOModule.policy_forward`); a mean gap above the precision's tolerance stops the run
    naming it. Returns ``{"mean_gap", "max_gap"}``."""
    query_ids, query_mask = query_ids[:rows], query_mask[:rows]
    probe = query_ids[:, -tokens:]
    gap = (engine.logprobs(query_ids, query_mask, probe, temperature).float()
           - policy_forward(query_ids, query_mask, probe)[0].float()).abs()
    stats = {"mean_gap": gap.mean().item(), "max_gap": gap.max().item()}
    bound = precision.tolerance if tolerance is None else tolerance
    if not stats["mean_gap"] <= bound:  # NaN fails too
        raise InvariantError(
            f"the rollout engine ({type(engine).__name__}) disagrees with the policy being trained after the weight "
            f"sync of rollout {rollout}: its log-probs of {gap.numel()} fixed tokens differ from the trainer's by "
            f"{stats['mean_gap']:.4g} nats on average (max {stats['max_gap']:.4g}; tolerance {bound:g} under "
            f"{precision.label}). It would sample from other weights than the policy's: a stale or missing adapter, "
            "a sync that did not reach the engine, or another precision (module.config.first_ratio_tolerance sets "
            "the tolerance)")
    return stats


def sampling_precision(precision: Precision, engine) -> Precision:
    """The precision a rollout engine's log-probs are computed in: the trainer's ``precision``, or a reduced one
    when the engine samples in a half dtype the trainer's weights are not in (:class:`~lrlhf.models.engines
    .MergedEngine` in bf16 beside fp32 weights): its guards then allow that precision's rounding."""
    if getattr(engine, "reduced", False) and not precision.reduced:
        return Precision(f"{precision.label}; the rollout engine samples in {getattr(engine.model, 'dtype', 'half')}",
                         True)
    return precision


def on_every_rank(check, *args) -> dict | None:
    """``check(*args)`` (raising :class:`InvariantError`) on every rank; when it fails on any, every rank stops
    (a rank left running would wait for the others in a collective)."""
    error, stats = None, None
    try:
        stats = check(*args)
    except InvariantError as exc:
        error = exc
    if any_across_ranks(error is not None):
        raise error or InvariantError("PPO invariant broken on another rank (see its error); every rank stops")
    return stats


class PPOGuards:
    """The guards of one PPO run, held by :class:`~lrlhf.modules.PPOModule` as ``guards``: the precision the policy
    computes in (resolved once per fit), the old-logprob recompute it implies, and the checks every rank runs
    together, each given what it checks.

    Args:
        check_invariants: run the sampler self-check and the first-update ratio guard (``module.config``).
        first_ratio_tolerance: their bound on the mean ``|ratio - 1|``; None = by precision.
        recompute_old_logprobs: ``module.config.recompute_old_logprobs``; None = by precision.
    """

    def __init__(self, check_invariants: bool, first_ratio_tolerance: float | None,
                 recompute_old_logprobs: bool | None):
        self.check_invariants, self.first_ratio_tolerance = check_invariants, first_ratio_tolerance
        self.recompute_setting = recompute_old_logprobs
        self.precision: Precision | None = None  # resolved once per fit
        self.self_check_pending = True  # the sampler self-check runs once per fit, before the first rollout

    def start_fit(self) -> None:
        """Forget the last fit's precision and arm the sampler self-check again."""
        self.precision, self.self_check_pending = None, True

    def resolve_precision(self, trainer, model) -> Precision:
        """The precision ``model`` computes in under ``trainer`` (:func:`run_precision`), resolved once per fit;
        says so when it turns the old-logprob recompute on."""
        if self.precision is None:
            self.precision = run_precision(trainer, model)
            if self.recompute_setting is None and self.precision.reduced:
                rank_zero_info(f"PPO: reduced precision ({self.precision.label}): the old log-probs are recomputed "
                               "by a full forward (module.config.recompute_old_logprobs=null means on here)")
        return self.precision

    def recompute_old_logprobs(self, precision: Precision, engine=None) -> bool:
        """The setting, or when None: on under reduced precision, or when the rollout ``engine`` samples in a lower
        precision than the trainer (``engine.reduced``: its log-probs are then ``mu``, not the old ones)."""
        if self.recompute_setting is not None:
            return self.recompute_setting
        return precision.reduced or bool(getattr(engine, "reduced", False))

    def check_sampler(self, sample, policy_forward, eos_token_ids, pad_token_id: int, batch: dict,
                      precision: Precision, engine=None) -> None:
        """Once per fit, before the first rollout: :func:`sampler_self_check` on the batch's first prompts (under
        the engine's precision, :func:`sampling_precision`)."""
        self.self_check_pending = False
        if self.check_invariants:
            on_every_rank(sampler_self_check, sample, policy_forward, eos_token_ids, pad_token_id,
                          batch["input_ids"], batch["attention_mask"], sampling_precision(precision, engine),
                          self.first_ratio_tolerance)

    def check_engine(self, engine, policy_forward, batch: dict, temperature: float, precision: Precision,
                     rollout: int) -> dict[str, float]:
        """Every rollout, after the engine's weight sync: :func:`check_engine_sync` on the batch's first prompts,
        under the engine's precision; its gap as ``engine/logprob_gap_mean`` / ``_max`` (empty with the checks
        off)."""
        if not self.check_invariants:
            return {}
        stats = on_every_rank(check_engine_sync, engine, policy_forward, batch["input_ids"], batch["attention_mask"],
                              temperature, sampling_precision(precision, engine), self.first_ratio_tolerance, rollout)
        return {"engine/logprob_gap_mean": stats["mean_gap"], "engine/logprob_gap_max": stats["max_gap"]}

    def first_ratio(self, logprobs: Tensor, old_logprobs: Tensor, action_mask: Tensor, precision: Precision,
                    rollout: int) -> float | None:
        """:func:`check_ratio` on the first minibatch of rollout ``rollout`` (before its first step); the mean
        deviation (None when the checks are off or the minibatch has no action)."""
        if not self.check_invariants:
            return None
        return on_every_rank(check_ratio, logprobs, old_logprobs, action_mask, precision, self.first_ratio_tolerance,
                             f"at rollout {rollout} (first minibatch, before its first optimiser step)").get("mean")

    @staticmethod
    def check_loss(loss: Tensor, rollout: int, minibatch: int) -> None:
        """Stop before the optimiser step on a non-finite minibatch loss (no poisoned weights are kept)."""
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"ppo: non-finite loss ({loss.item()}) at rollout {rollout}, minibatch {minibatch}; "
                "stopping before the optimiser step (no poisoned weights are kept)"
            )


__all__ = ["RATIO_TOLERANCE", "InvariantError", "PPOGuards", "Precision", "check_ratio", "on_every_rank",
           "ratio_deviation", "run_precision", "sampler_self_check", "sampling_precision"]
