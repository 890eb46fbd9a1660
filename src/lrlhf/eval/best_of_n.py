"""Best-of-N under a reward model: a baseline without training, and an evaluation of the reward model itself.

For each prompt, sample ``n`` responses from a policy, score each with the proxy (a reward model, or any
callable), keep the highest-scoring one, and judge the pick (the toy world's gold utility by default). Its KL to
the sampling policy is, in closed form, ``log n - (n - 1) / n`` (:func:`bon_kl`), which places Best-of-N on the
same utility-against-KL chart as PPO and DPO.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from lrlhf.data.records import PromptExample
from lrlhf.models.generation import SamplingConfig, as_prompt, generate_responses
from lrlhf.rewards.text import Scorer

#: ``(prompt, response) -> utility``: the judge of a picked response.
Judge = Callable[[PromptExample, str], float]


def bon_kl(n: int) -> float:
    """KL(BoN_n || policy) in nats: ``log n - (n - 1) / n`` (Stiennon et al., 2020, app. G.3; exact for distinct
    samples, an upper bound otherwise; Beirami et al., 2024). 0 for ``n = 1``."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return math.log(n) - (n - 1) / n


def toy_gold_judge(prompt: PromptExample, response: str) -> float:
    """The toy world's gold utility of ``response`` for the task in ``prompt.meta["task"]``."""
    from lrlhf.data.toy import gold_utility

    return gold_utility(prompt.meta["task"], response)


toy_gold_judge.exact = True  # the world's gold: no held-out accuracy to report (lrlhf.eval.judges.judge_accuracy)


class BestOfN(NamedTuple):
    """Best-of-``n`` picks for ``P`` prompts, in prompt order.

    Fields:
        n: samples per prompt.
        kl: :func:`bon_kl` of ``n`` (nats, per response).
        responses: ``P`` picked responses.
        proxy: ``P`` proxy scores of the picks (the maximum of each prompt's scores).
        gold: ``P`` judge utilities of the picks.
        all_proxy: ``P`` tuples of ``n`` proxy scores, every sample of the prompt in sampling order.
        all_gold: ``P`` tuples of ``n`` judge utilities (the picks' and the rest: a BoN curve for every
            ``m <= n`` can be estimated from them without sampling again).
    """

    n: int
    kl: float
    responses: tuple[str, ...]
    proxy: tuple[float, ...]
    gold: tuple[float, ...]
    all_proxy: tuple[tuple[float, ...], ...]
    all_gold: tuple[tuple[float, ...], ...]

    @property
    def gold_mean(self) -> float:
        return sum(self.gold) / len(self.gold)

    @property
    def proxy_mean(self) -> float:
        return sum(self.proxy) / len(self.proxy)


def select_best_of_n(
    prompts: Sequence[PromptExample], responses: Sequence[str], scores: Sequence[float], n: int, judge: Judge
) -> BestOfN:
    """Pick, for each prompt, the highest-scoring of its ``n`` samples (the first one on equal scores).

    Args:
        prompts: ``P`` prompts.
        responses, scores: ``P * n`` samples and their proxy scores, the ``n`` of a prompt adjacent (rows
            ``[p * n, (p + 1) * n)``).
        judge: utility of a (prompt, response) for the picks.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if len(responses) != len(prompts) * n or len(scores) != len(responses):
        raise ValueError(f"{len(prompts)} prompts x n={n} need {len(prompts) * n} responses and scores, "
                         f"got {len(responses)} and {len(scores)}")
    picks, proxy, gold, all_proxy, all_gold = [], [], [], [], []
    for p, prompt in enumerate(prompts):
        group = slice(p * n, (p + 1) * n)
        group_scores = [float(s) for s in scores[group]]
        group_gold = tuple(judge(prompt, r) for r in responses[group])
        best = max(range(n), key=lambda i: (group_scores[i], -i))  # first of equal maxima
        picks.append(responses[group][best])
        proxy.append(group_scores[best])
        gold.append(group_gold[best])
        all_proxy.append(tuple(group_scores))
        all_gold.append(group_gold)
    return BestOfN(n, bon_kl(n), tuple(picks), tuple(proxy), tuple(gold), tuple(all_proxy), tuple(all_gold))


def best_of_n(
    policy,
    tokenizer,
    prompts: Sequence[PromptExample],
    scorer: Scorer,
    n: int,
    sampling: SamplingConfig,
    judge: Judge = toy_gold_judge,
    batch_size: int = 64,
) -> BestOfN:
    """Sample ``n`` responses per prompt from ``policy`` (:func:`generate_responses` with ``sampling``,
    deterministic from its seed), score them with ``scorer``, and pick the best per prompt
    (:func:`select_best_of_n`). ``sampling.temperature`` must be > 0: greedy decoding gives ``n`` copies."""
    if sampling.temperature == 0 and n > 1:
        raise ValueError("best_of_n with n > 1 needs sampling.temperature > 0 (greedy gives n identical responses)")
    if not prompts:
        raise ValueError("best_of_n needs at least one prompt")
    prompts = [as_prompt(p) for p in prompts]
    repeated = [p for p in prompts for _ in range(n)]  # the n samples of a prompt are adjacent
    responses = generate_responses(policy, tokenizer, repeated, sampling, batch_size=batch_size)
    return select_best_of_n(prompts, responses, scorer(repeated, responses), n, judge)


def bon_expected(proxy: Sequence[float], gold: Sequence[float], n: int) -> float:
    """Expected gold utility of best-of-``n`` (by ``proxy``) when ``n`` of these ``m`` samples are drawn without
    replacement, every subset equally likely: an unbiased estimate of the BoN curve at every ``n <= m`` from one
    pool of ``m`` samples (no resampling noise; Nakano et al., 2021, app. I).

    The sample of rank ``i`` (1-based, ascending proxy) is the pick of a subset exactly when the subset holds it
    and ``n - 1`` of the ``i - 1`` below it: probability ``C(i - 1, n - 1) / C(m, n)``. Equal proxies are ranked
    as :func:`select_best_of_n` breaks them (the earlier sample wins).
    """
    m = len(proxy)
    if len(gold) != m:
        raise ValueError(f"{m} proxy scores and {len(gold)} gold utilities; need one each")
    if not 1 <= n <= m:
        raise ValueError(f"n must be in 1..{m} (the pool size), got {n}")
    order = sorted(range(m), key=lambda i: (float(proxy[i]), -i))  # ascending; equal scores: the earlier ranks higher
    total = math.comb(m, n)
    return sum(math.comb(rank, n - 1) * float(gold[i]) for rank, i in enumerate(order)) / total
