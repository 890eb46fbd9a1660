"""A real-text world with a programmatic gold (``world=sentiment``): real instructions, a real pretrained policy,
and a gold scorer that no training step ever reads — the controlled-sentiment setting of the DPO paper (Rafailov et
al. 2023, Fig. 2) and of the over-optimisation studies (Gao et al. 2022), on instructions instead of film reviews.

**The gold** (:func:`sentiment_gold`) is VADER's compound polarity of the response text (Hutto & Gilbert 2014; the
``vaderSentiment`` wheel ships its lexicon: ``pip install 'lrlhf[sentiment]'``), mapped from [-1, 1] to [0, 1]: 0.5
for a neutral answer, towards 1 the more positive its words. It reads the response only, never the prompt.

What it rewards: lexicon words of positive valence ("great", "love", "helpful"), intensified ("very", "extremely"),
with exclamation marks, words in capitals and positive emoji; negations ("not good") and contrast ("but") turn or
damp a word. What it does not see: whether the answer is right, relevant, or answers the instruction at all. How
it can be gamed: a policy that appends "Great! I love it!!" to anything, or drops the task for a cheerful paragraph,
scores near 1; the compound score saturates, so stuffing more words gains less and less. That gaming is the point:
the reward model learns a proxy of this gold from noisy labels, and optimising the proxy hard shows where proxy and
gold part (``recipe=ppo_weak_kl``). Measured: they do not part on this gold (docs/real_data.md): the proxy learns
the gold's own direction, and the policy gushes its way to 0.995.

**The on-topic gold** (``world=sentiment_on_topic``, :func:`on_topic_sentiment_gold`): the same sentiment times the
share of the prompt's topic words the answer uses (:func:`on_topic`: words of 4+ letters, cut to 5, without the
instruction's own verbs). It reads the prompt: a cheerful paragraph about something else scores near 0, so a
policy that games the sentiment by leaving the question loses gold, which is the turn over-optimisation studies
show (Gao et al. 2022). How it can be gamed in turn: an answer that repeats the prompt's words in a cheerful
frame; word overlap is not relevance, nor correctness. A sentiment gold is not helpfulness; docs/real_data.md
says how to swap it for a judge or people of your own.

**The world's files** (:class:`SentimentWorld`): the instructions of LLaMA-Factory's alpaca sample and of the
self-instruct seed tasks (those without an input), shuffled with ``seed``: ``eval_share`` of them are the held-out
``eval_prompts`` (in no other file), ``val_prompts`` more are ``sft_val`` (with the source's answer: early
stopping's and the sample table's prompts), and the rest are at once ``sft_train`` (with the source's answer),
``rl_prompts`` and ``pair_prompts``. Its preference pairs are not in the world: they are the SFT policy's own
samples, drawn and labelled by the ``pairs`` stage (``recipe=pairs``, :mod:`lrlhf.run.pairs`) which the reward
model's and DPO's recipes need on this world (``world.pairs_recipe``); the labels come from the simulated
annotators of ``world.annotators`` (:class:`lrlhf.eval.annotators.SimulatedAnnotators` on this gold: logistic noise,
a length bias, a tie band).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from lrlhf.data.splits import prompt_of
from lrlhf.data.worlds import PromptWorld, instruction_sources

INSTALL = "pip install 'lrlhf[sentiment]'  (vaderSentiment, MIT: the lexicon ships in the wheel)"
_ANALYSER = None


def _analyser():
    global _ANALYSER
    if _ANALYSER is None:
        try:
            from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer
        except ImportError as err:
            raise ImportError(f"world=sentiment's gold needs vaderSentiment: {INSTALL}") from err
        _ANALYSER = SentimentIntensityAnalyzer()
    return _ANALYSER


def polarity(text: str) -> float:
    """VADER's compound polarity of ``text``, in [-1, 1] (0: neutral or no lexicon word)."""
    return float(_analyser().polarity_scores(text)["compound"])


def sentiment_gold(prompt_record, response: str) -> float:
    """The world's gold: ``(compound + 1) / 2`` of the response alone, in [0, 1] (the prompt is not read)."""
    return (polarity(response) + 1.0) / 2.0


sentiment_gold.exact = True  # the world's gold: no held-out accuracy to report (lrlhf.eval.judges.judge_accuracy)


def sentiment_reward(prompt_text: str, response_text: str) -> float:
    """The gold as a reward of texts (``reward=gold`` on this world: PPO on the exact gold, the frontier's
    ``ppo_gold``): :func:`sentiment_gold` of the response."""
    return sentiment_gold(None, response_text)


#: Words that say what to do, not what about ("Describe ...", "List three ..."): no topic is read from them.
_INSTRUCTION_WORDS = frozenset("""
    about above after again also among because been before being below between both does doing down during each
    from further have having here into more most other over same should some such than that their them then there
    these they this those through under until very what when where which while whom with would your yours
    give provide describe explain write create list make find identify generate suggest name tell compose design
    following given sentence text using based example examples three five four seven eight nine
    """.split())


def topic_words(text: str) -> frozenset[str]:
    """The topic words of ``text``: its alphabetic words of 4+ letters, lower-cased, cut to their first 5 letters (a
    crude stem: "planet" and "planets" meet), without ``_INSTRUCTION_WORDS``."""
    return frozenset(w[:5] for w in re.findall(r"[a-z]+", text.lower()) if len(w) >= 4 and w not in _INSTRUCTION_WORDS)


def on_topic(prompt_text: str, response: str) -> float:
    """The share of the prompt's topic words that the response uses, in [0, 1] (1.0 for a prompt without any)."""
    asked = topic_words(prompt_text)
    return len(asked & topic_words(response)) / len(asked) if asked else 1.0


def _prompt_text(prompt_record) -> str:
    """The user's words of a prompt record (or the prompt text itself, as a reward of texts gets it)."""
    if isinstance(prompt_record, str):
        return prompt_record
    return " ".join(m["content"] for m in prompt_of(prompt_record) if m["role"] == "user")


def on_topic_sentiment_gold(prompt_record, response: str) -> float:
    """The gold of ``world=sentiment_on_topic``: :func:`sentiment_gold` times :func:`on_topic` (the share of the
    prompt's topic words the answer uses), in [0, 1]. A cheerful answer that leaves the question scores near 0."""
    return sentiment_gold(None, response) * on_topic(_prompt_text(prompt_record), response)


on_topic_sentiment_gold.exact = True


def on_topic_sentiment_reward(prompt_text: str, response_text: str) -> float:
    """:func:`on_topic_sentiment_gold` as a reward of texts (``reward=gold`` on ``world=sentiment_on_topic``)."""
    return on_topic_sentiment_gold(prompt_text, response_text)


@dataclass
class SentimentWorld(PromptWorld):
    """Real instructions whose gold is the sentiment of the answer (``world=sentiment``; module docstring)."""

    alpaca: str | None = None
    self_instruct: str | None = None
    eval_share: float = 0.25
    val_prompts: int = 32
    annotators: dict = field(default_factory=dict)  # the pairs stage's label model (lrlhf.data.toy.annotators)
    limits: dict = field(default_factory=dict)
    seed: int = 0
    judge: str = "lrlhf.data.sentiment:sentiment_gold"
    name: str = "sentiment"

    FILES = ("sft_train", "sft_val", "rl_prompts", "eval_prompts", "pair_prompts")
    SOURCES = ("alpaca", "self_instruct")

    def __post_init__(self):
        from lrlhf.data.toy.annotators import AnnotatorConfig

        if not 0 < self.eval_share < 1:
            raise ValueError(f"world.eval_share must be in (0, 1), got {self.eval_share}")
        if self.alpaca is None and self.self_instruct is None:
            raise ValueError("world.alpaca and world.self_instruct are both null: give at least one prompt source")
        try:
            AnnotatorConfig(**self.annotators)
        except (TypeError, ValueError) as err:
            raise ValueError(f"world.annotators: {err}") from None
        self._check_limits()

    def check(self) -> None:
        super().check()
        _analyser()  # the gold's package, before anything is built

    def describe(self) -> str:
        return (f"the {self.name} world: instructions of {self.alpaca} and {self.self_instruct} (prompts and splits, "
                "one folder for every gold: world.judge scores the answers)")

    def build(self, out: Path) -> None:
        from lrlhf.data.records import PromptExample, SFTExample

        sources = instruction_sources(self.alpaca, self.self_instruct)
        order = list(range(len(sources)))
        random.Random(self.seed).shuffle(order)
        n_eval = max(1, round(self.eval_share * len(sources)))
        if len(sources) - n_eval <= self.val_prompts:
            raise ValueError(f"world={self.name}: {len(sources)} prompts, too few for world.eval_share="
                             f"{self.eval_share} and world.val_prompts={self.val_prompts}")
        evals, val, train = order[:n_eval], order[n_eval:n_eval + self.val_prompts], order[n_eval + self.val_prompts:]

        def prompt(i: int) -> PromptExample:
            return PromptExample([{"role": "user", "content": sources[i][0]}])

        def demonstration(i: int) -> SFTExample:
            return SFTExample([*prompt(i).prompt, {"role": "assistant", "content": sources[i][1]}])

        files = {"eval_prompts": [prompt(i) for i in evals], "sft_val": [demonstration(i) for i in val],
                 "sft_train": [demonstration(i) for i in train if sources[i][1].strip()],
                 "rl_prompts": [prompt(i) for i in train], "pair_prompts": [prompt(i) for i in train]}
        self._write(out, files, prompts=len(sources), gold="VADER compound of the response, (c + 1) / 2")


__all__ = ["INSTALL", "SentimentWorld", "on_topic", "on_topic_sentiment_gold", "on_topic_sentiment_reward", "polarity",
           "sentiment_gold", "sentiment_reward", "topic_words"]
