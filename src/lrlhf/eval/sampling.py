"""The evaluation's samples: each policy's, and the Best-of-N pool's, drawn in this process or split over worker
processes (``jobs=N`` of recipe=eval / frontier / frontier_text).

Every draw (a :class:`Draw`: one policy folder, ``n`` samples per prompt, its own sampling seed) is seeded on its own
(:func:`lrlhf.eval.heldout.sample_held_out` forks the RNG from ``sampling.seed``), so draws are independent of one
another and of their order: ``workers`` processes, each running the launch's torch thread count, draw the very
samples one process draws, bit for bit (tests/eval/test_sampling.py). The pool (64 samples a prompt against a
policy's 4) is the largest draw and starts first; a free worker takes the next. A worker loads the reference, the
reward model and its calibration once, then each policy it draws; gold and judge scores stay in the launch.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from lrlhf.data.records import PromptExample
from lrlhf.eval.heldout import ModelPolicy, sample_held_out
from lrlhf.models.generation import SamplingConfig
from lrlhf.utils.distributed import die_with_parent


@dataclass
class Samples:
    """``P x s`` responses of one policy (``texts[p][i]``: sample ``i`` of prompt ``p``) and their figures."""

    name: str
    texts: list[list[str]]
    lengths: list[list[int]]
    proxy: list[list[float]]
    kl: list[list[float]] | None = None
    """Per-sequence k1 sums against the reference; None with ``analytic_kl``."""
    analytic_kl: float | None = None
    """Best-of-N: ``log N - (N - 1) / N`` per sequence."""
    judge: list[list[float]] = field(default_factory=list)
    gold: list[list[float]] = field(default_factory=list)
    ids: list[list[list[int]]] = field(default_factory=list)
    """The response token ids (the actions: up to and including the first EOS)."""


def _grid(values: Sequence, k: int) -> list[list]:
    return [list(values[i:i + k]) for i in range(0, len(values), k)]


def sample_policy(model, tokenizer, prompts: Sequence[PromptExample], n: int, sampling: SamplingConfig,
                  reward_model, calibration=None, reference=None, batch_size: int = 256,
                  max_prompt_length: int = 1024, name: str = "policy", reward=None, progress: bool = True
                  ) -> Samples:
    """Sample ``n`` responses per prompt (adjacent rows, plain temperature sampling, deterministic from
    ``sampling.seed`` in a forked RNG) and measure each: length (actions up to and including the first EOS),
    the proxy score of prompt + response cut at the stop (as PPO scores it), and, with ``reference``, the
    per-sequence sum of ``log pi - log pi_ref`` at the sampling temperature (0 without one). The held-out path of
    :func:`lrlhf.eval.heldout.sample_held_out`, with every model in eval mode (restored afterwards); ``progress``:
    its progress bar, ``eval: <name> ...``."""
    if sampling.temperature <= 0:
        raise ValueError("eval.temperature must be > 0: KL and Best-of-N need sampled responses")
    policy = ModelPolicy(model, tokenizer, reward_model, sampling, reference=reference, calibration=calibration,
                         reward=reward)
    models = [m for m in (model, reference, reward_model) if m is not None]
    modes = [m.training for m in models]
    for m in models:
        m.eval()
    try:
        out = sample_held_out(policy, list(prompts), n, sampling.seed, batch_size, max_prompt_length,
                              label=name if progress else None)
    finally:
        for m, mode in zip(models, modes, strict=True):
            m.train(mode)
    return Samples(name, _grid(out.texts, n), _grid(out.lengths.tolist(), n), _grid(out.proxy.tolist(), n),
                   _grid(out.kl.tolist(), n), ids=_grid(out.ids, n))


@dataclass(frozen=True)
class Draw:
    """``n`` samples per prompt of the policy in ``path`` (a merged model folder), named ``name``; ``kl``: measure
    each sample's KL to the reference (a policy other than the reference; the pool's is analytic)."""

    name: str
    path: str
    n: int
    sampling: SamplingConfig
    kl: bool = True


@dataclass
class Shared:
    """What every draw reads: the prompts, the reference policy (its folder and, once loaded, its model and
    tokenizer), the proxy (a reward model folder and its calibration, or a reward source object) and the batch."""

    prompts: list
    reference: str
    reward_model: str | None
    calibration: str | None
    batch_size: int
    reward: object = None
    loaded: dict = field(default_factory=dict)

    def models(self) -> dict:
        if not self.loaded:
            from lrlhf.models import ModelConfig, load_causal_lm, load_tokenizer
            from lrlhf.models.reward import load_calibration, load_reward_model

            self.loaded["tokenizer"] = load_tokenizer(ModelConfig(self.reference))
            self.loaded["reference"] = load_causal_lm(ModelConfig(self.reference))
            self.loaded["reward_model"] = load_reward_model(self.reward_model) if self.reward is None else None
            self.loaded["calibration"] = load_calibration(self.calibration) if self.reward is None and \
                self.calibration else None
            if self.reward is not None:
                self.reward.build(self.loaded["reference"], self.loaded["tokenizer"])
        return self.loaded

    def __getstate__(self):  # a worker loads its own models
        return {**self.__dict__, "loaded": {}}


def draw(shared: Shared, d: Draw, progress: bool = True) -> Samples:
    """One draw in this process (the reference is the policy itself when ``d.path`` is its folder)."""
    from lrlhf.models import ModelConfig, load_causal_lm

    m = shared.models()
    same = Path(d.path).resolve() == Path(shared.reference).resolve()
    model = m["reference"] if same else load_causal_lm(ModelConfig(d.path))
    return sample_policy(model, m["tokenizer"], shared.prompts, d.n, d.sampling, m["reward_model"],
                         calibration=m["calibration"], reference=m["reference"] if d.kl and not same else None,
                         batch_size=shared.batch_size, name=d.name, reward=shared.reward, progress=progress)


_WORKER: dict = {}


def _start_worker(shared: Shared, threads: int) -> None:
    import torch

    from lrlhf.utils.console import setup_console, verbose_requested

    setup_console(verbose_requested([])[0], wandb_offline=True)  # the launch's quiet console (LRLHF_VERBOSE: not)

    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the launch's to handle: it stops the workers
    torch.set_num_threads(threads)
    _WORKER["shared"] = shared


def _draw_in_worker(d: Draw) -> tuple[Samples, float]:
    start = time.monotonic()
    return draw(_WORKER["shared"], d, progress=False), time.monotonic() - start


def draw_all(shared: Shared, draws: list[Draw], workers: int = 1,
             then: Callable[[Samples], Samples] = lambda samples: samples) -> list[Samples]:
    """Every draw, in ``draws``' order, each passed through ``then`` (the launch's gold and judge scores) as soon as
    it is drawn: one after another in this process (``workers`` 1, or a reward source object, which a worker cannot
    rebuild), else in up to ``workers`` processes, the largest first. A draw that fails stops the others at once."""
    if workers <= 1 or len(draws) < 2 or shared.reward is not None:
        out = []
        for d in draws:
            print(f"eval: sampling {d.name} ({d.path})" if d.kl else
                  f"eval: Best-of-N pool, {d.n} samples per prompt from {d.path}", flush=True)
            out.append(then(draw(shared, d)))
        return out
    import torch

    n = min(workers, len(draws))
    print(f"eval: sampling {', '.join(d.name for d in draws)} in {n} processes (jobs={workers}), the largest "
          "first", flush=True)
    context = multiprocessing.get_context("spawn")  # a fork would copy the launch's torch threads and state
    pool = ProcessPoolExecutor(n, mp_context=context, initializer=_start_worker,
                               initargs=(shared, torch.get_num_threads()))
    try:
        futures = {pool.submit(_draw_in_worker, d): i for i, d in sorted(enumerate(draws), key=lambda x: -x[1].n)}
        out: list = [None] * len(draws)
        for future in as_completed(futures):  # a failure surfaces when it happens, not after the draws before it
            samples, seconds = future.result()
            d = draws[futures[future]]
            print(f"eval: sampled {d.name} ({d.n} a prompt) in {seconds / 60:.1f} min", flush=True)
            out[futures[future]] = then(samples)
    except BaseException:  # a draw failed, or Ctrl+C: the other draws stop now, not when they finish
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()
    return out
