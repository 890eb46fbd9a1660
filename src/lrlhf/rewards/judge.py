"""A judge as the reward (direct RLAIF): a local causal LM asked for a score of each response.

:class:`JudgeReward` renders ``template`` with the prompt and the response (``{prompt}``, ``{response}``) as one user
turn of the judge's chat template, lets the judge answer greedily (``max_new_tokens``), and reads the first number
its answer holds (``pattern``), clamped to ``[low, high]`` and mapped to ``[0, 1]``. An answer without a number is
**unparsed**: it is counted (the component ``reward/<name>_unparsed``, the fraction per rollout) and the sample gets
the mean of the parsed scores of its batch, so it pushes the policy neither way; it is never read as 0. A batch
where no answer parses stops the run, naming the judge and one of its answers.

:class:`PairwiseJudgeReward` (``reward=judge_pairwise``) asks for a preference instead: the response against the
prompt record's reference answer (``meta[reference_key]``, e.g. a dataset's own answer), in both orders (A/B, then
B/A: the judge's position bias cancels); the reward is the fraction of the two verdicts that prefer the response
(0, 0.5 or 1). A verdict without ``A`` or ``B`` is unparsed and counted as above.

The judge is frozen and separate from the policy (its own weights; a judge sharing the policy's base is a later
step). Any causal LM folder or hub id ``transformers`` loads works (``module.reward_model.judge``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from torch import nn

from lrlhf.data.math_answers import record_field
from lrlhf.data.records import PromptExample
from lrlhf.models import ModelConfig, load_causal_lm, load_tokenizer
from lrlhf.models.generation import SamplingConfig, generate_responses
from lrlhf.rewards.protocol import Meta, TextReward
from lrlhf.utils.errors import InvariantError

PAIRWISE_TEMPLATE = ("Which answer to the request is better? Reply with the letter A or B only.\nRequest: {prompt}\n"
                     "Answer A: {a}\nAnswer B: {b}\nBetter answer:")
DEFAULT_TEMPLATE = ("Rate the answer to the request from 0 (useless) to 10 (perfect). Reply with the number only.\n"
                    "Request: {prompt}\nAnswer: {response}\nScore:")


@dataclass
class JudgeReward(TextReward):
    """A judge LM's score as the reward (see the module docstring).

    Args:
        judge: the judge model: a folder or hub id (or a :class:`~lrlhf.models.ModelConfig`).
        template: the question, with ``{prompt}`` and ``{response}``.
        pattern: the regular expression whose first match in the judge's answer is the score.
        low, high: the score's range (clamped), mapped to ``[0, 1]``.
        max_new_tokens: the judge's answer length.
        batch_size: judge prompts per generation batch.
    """

    judge: str | ModelConfig = ""
    template: str = DEFAULT_TEMPLATE
    pattern: str = r"-?\d+(?:\.\d+)?"
    low: float = 0.0
    high: float = 10.0
    max_new_tokens: int = 8
    batch_size: int = 32
    name: str = "judge"
    tokenizer: object = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if not self.judge:
            raise ValueError("module.reward_model.judge must name the judge model (a folder or hub id)")
        self._check_template()
        if not self.high > self.low:
            raise ValueError(f"module.reward_model.high must be > low, got low={self.low}, high={self.high}")
        try:
            self._pattern = re.compile(self.pattern)
        except re.error as error:
            raise ValueError(f"module.reward_model.pattern {self.pattern!r} is not a regular expression: "
                             f"{error}") from None
        self.model: nn.Module | None = None
        self.judge_tokenizer = None

    def _check_template(self) -> None:
        if "{response}" not in self.template:
            raise ValueError("module.reward_model.template must hold {response} (and usually {prompt})")

    def build(self, model: nn.Module, tokenizer) -> nn.Module:
        """Keep the policy's tokenizer (to decode the texts) and load the judge, frozen."""
        self.tokenizer = tokenizer
        config = self.judge if isinstance(self.judge, ModelConfig) else ModelConfig(str(self.judge))
        self.model = load_causal_lm(config).requires_grad_(False).eval()
        self.judge_tokenizer = load_tokenizer(config)
        return self.model

    def verdicts(self, prompts: list[str], responses: list[str]) -> list[str]:
        """The judge's answers, greedy, one per pair."""
        return self.ask([self.template.format(prompt=p, response=r) for p, r in zip(prompts, responses, strict=True)])

    def ask(self, questions: list[str]) -> list[str]:
        """The judge's greedy answers to ``questions`` (each one user turn)."""
        questions = [PromptExample([{"role": "user", "content": q}]) for q in questions]
        sampling = SamplingConfig(max_new_tokens=self.max_new_tokens, temperature=0.0, seed=0)
        return generate_responses(self.model, self.judge_tokenizer, questions, sampling, batch_size=self.batch_size)

    def parse(self, verdict: str) -> float | None:
        """The verdict's score mapped to ``[0, 1]``, or None when it holds no number."""
        match = self._pattern.search(verdict)
        if match is None:
            return None
        try:
            value = float(match.group(0))
        except ValueError:
            return None
        return (min(max(value, self.low), self.high) - self.low) / (self.high - self.low)

    def score_texts(self, prompts, responses):
        verdicts = self.verdicts(prompts, responses)
        parsed = [self.parse(v) for v in verdicts]
        known = [p for p in parsed if p is not None]
        if not known:
            raise InvariantError(f"reward {self.name!r}: none of the judge's {len(verdicts)} answers holds a score "
                                 f"(pattern {self.pattern!r}); one answer: {verdicts[0][:120]!r}. Check "
                                 f"module.reward_model.template and the judge model")
        mean = sum(known) / len(known)
        scores = [mean if p is None else p for p in parsed]
        return scores, {f"{self.name}_unparsed": [float(p is None) for p in parsed]}


@dataclass
class PairwiseJudgeReward(JudgeReward):
    """A judge LM's preference between the response and the prompt record's reference answer (module docstring).

    Args (besides :class:`JudgeReward`'s ``judge``, ``max_new_tokens``, ``batch_size``):
        template: the question, with ``{prompt}``, ``{a}`` and ``{b}``.
        reference_key: the prompt record's field holding the reference answer.
        pattern: the first match in the verdict is the letter ``A`` or ``B``.
    """

    template: str = PAIRWISE_TEMPLATE
    pattern: str = r"\b([AB])\b"
    reference_key: str = "reference"
    name: str = "judge_pairwise"

    def _check_template(self) -> None:
        if not all(f"{{{k}}}" in self.template for k in ("a", "b")):
            raise ValueError("module.reward_model.template must hold {a} and {b} (and usually {prompt})")

    def prefers(self, verdict: str) -> str | None:
        """``"A"`` or ``"B"``, or None when the verdict names neither."""
        match = self._pattern.search(verdict)
        return None if match is None else match.group(match.lastindex or 0)

    def score_texts(self, prompts, responses):
        return self.score_records(prompts, responses, None)

    def score_records(self, prompts, responses, meta: Meta):
        records = [None] * len(responses) if meta is None else meta
        refs = [record_field(m, self.reference_key, f"reward {self.name!r} (module.reward_model.reference_key) on "
                             f"the prompt {p[-80:]!r}") for p, m in zip(prompts, records, strict=True)]
        first = self.ask([self.template.format(prompt=p, a=r, b=ref) for p, r, ref in zip(prompts, responses, refs,
                                                                                          strict=True)])
        second = self.ask([self.template.format(prompt=p, a=ref, b=r) for p, r, ref in zip(prompts, responses, refs,
                                                                                           strict=True)])
        # the response is A in the first question and B in the second: a win is that letter
        parsed = [[float(letter == won) for letter, won in ((self.prefers(x), "A"), (self.prefers(y), "B"))
                   if letter is not None] for x, y in zip(first, second, strict=True)]
        if not any(parsed):
            raise InvariantError(f"reward {self.name!r}: none of the judge's {2 * len(first)} verdicts names A or B; "
                                 f"one verdict: {first[0][:120]!r}. Check module.reward_model.template and the judge")
        known = [x for pair in parsed for x in pair]
        mean = sum(known) / len(known)
        scores = [sum(pair) / len(pair) if pair else mean for pair in parsed]
        unparsed = [(2 - len(pair)) / 2 for pair in parsed]
        consistent = [float(len(pair) == 2 and pair[0] == pair[1]) for pair in parsed]
        return scores, {f"{self.name}_unparsed": unparsed, f"{self.name}_consistent": consistent}


__all__ = ["DEFAULT_TEMPLATE", "PAIRWISE_TEMPLATE", "JudgeReward", "PairwiseJudgeReward"]
