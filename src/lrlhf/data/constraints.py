"""Precise instruction constraints in the style of IFEval's taxonomy (Zhou et al., 2023), attached to real prompts
and checked by a program: the verifiable reward of ``recipe=grpo_constraints`` and its held-out judge.

A constraint is a small dict kept in the prompt record's ``meta["constraint"]`` (``{"kind": ..., <parameters>}``);
:func:`instruction` is the sentence appended to the user's prompt, :func:`satisfied` checks a response against it.
The kinds (IFEval's ids in brackets):

- ``lowercase`` (change_case:english_lowercase): letters, none of them capital;
- ``no_commas`` (punctuation:no_comma): no ``,``;
- ``keyword`` (keywords:existence, one keyword): the word ``word`` appears (case-insensitive, whole word);
- ``max_words`` (length_constraints:number_words, "less than"): at most ``n`` words;
- ``end_phrase`` (startend:end_checker): the response ends with ``phrase`` (trailing space, the response's
  surrounding quotation marks and case ignored, as IFEval's checker does);
- ``quotation`` (startend:quotation): the whole response is wrapped in double quotation marks;
- ``bullets`` (detectable_format:number_bullet_lists): exactly ``n`` markdown bullets (lines starting ``* `` or
  ``- ``);
- ``json`` (detectable_format:json_format): the whole response parses as JSON (a fenced json block counts).

:func:`attach` draws one constraint per prompt with a seeded generator; :func:`constraint_judge` is a
``judge(prompt_record, response)`` (1.0 / 0.0) for ``eval.judge`` and the sample table. :func:`credit` is the partial
credit of ``reward=constraints module.reward_model.rules.0.partial=true``: 1.0 exactly when the constraint is met,
below 0.5 otherwise, graded by how near the response came (a reward with variance within a group where no sample
meets the constraint yet, which a 0/1 check gives GRPO nothing to learn from).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lrlhf.data.worlds import PromptWorld, instruction_sources

KEYWORDS = ("simple", "example", "important", "because", "people", "today", "good", "time")
PHRASES = ("Hope this helps.", "That is all.", "Any other questions?")
KINDS = ("lowercase", "no_commas", "keyword", "max_words", "end_phrase", "quotation", "bullets", "json")
WORD = re.compile(r"\b\w+\b")


def draw(rng: random.Random, kinds: tuple[str, ...] = KINDS) -> dict[str, Any]:
    """One constraint of a kind drawn from ``kinds``, its parameters drawn too."""
    kind = rng.choice(kinds)
    if kind == "keyword":
        return {"kind": kind, "word": rng.choice(KEYWORDS)}
    if kind == "max_words":
        return {"kind": kind, "n": rng.choice((10, 15, 20))}
    if kind == "end_phrase":
        return {"kind": kind, "phrase": rng.choice(PHRASES)}
    if kind == "bullets":
        return {"kind": kind, "n": rng.choice((2, 3))}
    return {"kind": kind}


def instruction(constraint: dict[str, Any]) -> str:
    """The sentence that asks for ``constraint`` (IFEval's wording where it has one)."""
    kind = constraint["kind"]
    if kind == "lowercase":
        return ("Your entire response should be in English, and in all lowercase letters. No capital letters are "
                "allowed.")
    if kind == "no_commas":
        return "In your entire response, refrain from the use of any commas."
    if kind == "keyword":
        return f'Include the keyword "{constraint["word"]}" in the response.'
    if kind == "max_words":
        return f"Answer with at most {constraint['n']} words."
    if kind == "end_phrase":
        return (f'Finish your response with this exact phrase "{constraint["phrase"]}". No other words should follow '
                "this phrase.")
    if kind == "quotation":
        return "Wrap your entire response with double quotation marks."
    if kind == "bullets":
        n = constraint["n"]
        return (f"Your answer must contain exactly {n} bullet points. Use the markdown bullet points such as:\n"
                "* This is point 1.\n* This is point 2")
    if kind == "json":
        return "Entire output should be wrapped in JSON format. You can use markdown ticks such as ```."
    raise ValueError(f"unknown constraint kind {kind!r}; known: {', '.join(KINDS)}")


def satisfied(constraint: dict[str, Any], response: str) -> bool:
    """Whether ``response`` meets ``constraint``."""
    kind, text = constraint["kind"], response.strip()
    if kind == "lowercase":
        return any(c.isalpha() for c in text) and text == text.lower()
    if kind == "no_commas":
        return bool(text) and "," not in text
    if kind == "keyword":  # a whole word among Latin letters and digits ("indicator를" holds "indicator")
        word = re.escape(constraint["word"])
        return re.search(rf"(?<![A-Za-z0-9]){word}(?![A-Za-z0-9])", text, flags=re.I) is not None
    if kind == "max_words":
        return 0 < len(WORD.findall(text)) <= constraint["n"]
    if kind == "end_phrase":  # as IFEval: the response's quotation marks stripped, case ignored
        return text.strip('"').strip().lower().endswith(constraint["phrase"].strip().lower())
    if kind == "quotation":
        return len(text) > 1 and text[0] == '"' and text[-1] == '"'
    if kind == "bullets":
        return len(re.findall(r"^\s*[*-]\s", text, flags=re.M)) == constraint["n"]
    if kind == "json":
        fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", text, flags=re.S | re.I)  # ```Json too, as IFEval
        try:
            json.loads(fenced.group(1) if fenced else text)
        except ValueError:
            return False
        return True
    raise ValueError(f"unknown constraint kind {kind!r}; known: {', '.join(KINDS)}")


def credit(constraint: dict[str, Any], response: str) -> float:
    """1.0 when ``response`` meets ``constraint``, else a partial credit in ``[0, 0.5)`` by how near it came:

    - ``lowercase``: 0.45 x the fraction of its letters in lower case;
    - ``no_commas``: 0.45 / (number of commas);
    - ``max_words``: 0.45 x n / (number of words) (0 when empty);
    - ``end_phrase``: 0.45 when the phrase appears but something follows it, else 0.15 x the fraction of the
      phrase's words among the response's last words;
    - ``quotation``: 0.2 for a leading or a trailing double quotation mark (one of the two);
    - ``bullets``: 0.3 when there are bullets, but not ``n`` of them;
    - ``json``: 0.2 when it holds a ``{`` or ``[`` and its closing bracket but does not parse;
    - ``keyword``: 0 (a word is there or not).
    """
    if satisfied(constraint, response):
        return 1.0
    kind, text = constraint["kind"], response.strip()
    if kind == "lowercase":
        letters = [c for c in text if c.isalpha()]
        return 0.45 * sum(c.islower() for c in letters) / len(letters) if letters else 0.0
    if kind == "no_commas":
        return 0.45 / text.count(",") if "," in text else 0.0
    if kind == "max_words":
        words = len(WORD.findall(text))
        return 0.45 * constraint["n"] / words if words else 0.0
    if kind == "end_phrase":
        phrase = constraint["phrase"]
        if phrase in text:
            return 0.45
        wanted = [w.lower() for w in WORD.findall(phrase)]
        tail = {w.lower() for w in WORD.findall(text)[-len(wanted):]}
        return 0.15 * sum(w in tail for w in wanted) / len(wanted)
    if kind == "quotation":
        return 0.2 if text.startswith('"') or text.endswith('"') else 0.0
    if kind == "bullets":
        return 0.3 if re.search(r"^\s*[*-]\s", text, flags=re.M) else 0.0
    if kind == "json":
        return 0.2 if re.search(r"\{.*\}|\[.*\]", text, flags=re.S) else 0.0
    return 0.0  # keyword (an unknown kind was refused by satisfied)


def attach(prompt: str, constraint: dict[str, Any]) -> str:
    """The user's prompt with the constraint's instruction after it."""
    return f"{prompt.rstrip()}\n\n{instruction(constraint)}"


def constraint_of(meta: dict[str, Any] | None, where: str) -> dict[str, Any]:
    """The prompt record's constraint, or an error naming ``where`` (a prompt without one)."""
    constraint = (meta or {}).get("constraint")
    if not isinstance(constraint, dict) or constraint.get("kind") not in KINDS:
        raise ValueError(f"{where}: the prompt record has no constraint (meta.constraint with a kind of "
                         f"{', '.join(KINDS)}): world=constraints writes one per prompt")
    return constraint


def constraint_judge(prompt_record, response: str) -> float:
    """1.0 when ``response`` meets the prompt record's constraint, else 0.0 (a judge for ``eval.judge``)."""
    meta = getattr(prompt_record, "meta", prompt_record)
    return float(satisfied(constraint_of(meta, "judge lrlhf.data.constraints:constraint_judge"), response))


constraint_judge.exact = True  # a verifier: no held-out accuracy to report (lrlhf.eval.judges.judge_accuracy)


__all__ = ["KINDS", "attach", "constraint_judge", "constraint_of", "credit", "draw", "instruction", "satisfied"]


# ------------------------------------------------------------------------------------------ the world
@dataclass
class ConstraintsWorld(PromptWorld):
    """Real prompts with one verifiable constraint each (``world=constraints``; ``recipe=grpo_constraints``).

    The prompts: ``alpaca`` (LLaMA-Factory's alpaca sample, a JSON list ``{instruction, input, output}``: the
    instructions without an input) and ``self_instruct`` (the self-instruct seed tasks, JSON lines ``{instruction,
    instances: [{input, output}]}``: those whose first instance has no input); either may be null. Each prompt gets
    one constraint drawn with ``seed`` from ``kinds`` (:func:`draw`), its instruction appended to the user turn and
    the constraint kept in ``meta["constraint"]`` (the reward and the judge read it there). Files: ``rl_prompts``,
    ``eval_prompts`` (``eval_share`` of the prompts: the held-out constraint satisfaction), ``sft_val`` (``val_prompts``
    of them with the source's answer, not constraint-checked: early stopping's and the sample table's prompts) and
    ``sft_train`` (the RL prompts with the source's answers, for a recipe that wants an SFT stage). ``limits`` caps
    a file's records.
    """

    alpaca: str | None = None
    self_instruct: str | None = None
    kinds: tuple[str, ...] = KINDS
    eval_share: float = 0.25
    val_prompts: int = 32
    limits: dict = field(default_factory=dict)
    seed: int = 0
    judge: str = "lrlhf.data.constraints:constraint_judge"
    name: str = "constraints"

    SOURCES = ("alpaca", "self_instruct")

    def __post_init__(self):
        self.kinds = tuple(self.kinds)
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown or not self.kinds:
            raise ValueError(f"world.kinds: {unknown or 'empty'}: choose among {', '.join(KINDS)}")
        if not 0 < self.eval_share < 1:
            raise ValueError(f"world.eval_share must be in (0, 1), got {self.eval_share}")
        if self.alpaca is None and self.self_instruct is None:
            raise ValueError("world.alpaca and world.self_instruct are both null: give at least one prompt source")
        self._check_limits()

    def describe(self) -> str:
        return f"the {self.name} world: prompts of {self.alpaca} and {self.self_instruct} with IFEval-style constraints"

    def _sources(self) -> list[tuple[str, str]]:
        return instruction_sources(self.alpaca, self.self_instruct)

    def build(self, out: Path) -> None:
        from lrlhf.data.records import PromptExample, SFTExample

        sources = self._sources()
        rng = random.Random(self.seed)
        order = list(range(len(sources)))
        rng.shuffle(order)
        n_eval = max(1, round(self.eval_share * len(sources)))
        if len(sources) - n_eval <= self.val_prompts:
            raise ValueError(f"{len(sources)} prompts: too few for eval_share={self.eval_share} and "
                             f"val_prompts={self.val_prompts}")
        constraints = {i: draw(random.Random(f"{self.seed}:{i}"), self.kinds) for i in order}

        def prompt(i: int) -> PromptExample:
            constraint = constraints[i]
            return PromptExample([{"role": "user", "content": attach(sources[i][0], constraint)}],
                                 meta={"constraint": constraint})

        def demonstration(i: int) -> SFTExample:
            return SFTExample([*prompt(i).prompt, {"role": "assistant", "content": sources[i][1]}],
                              meta={"constraint": constraints[i]})

        evals, val, rl = order[:n_eval], order[n_eval:n_eval + self.val_prompts], order[n_eval + self.val_prompts:]
        files = {"rl_prompts": [prompt(i) for i in rl], "sft_train": [demonstration(i) for i in rl],
                 "sft_val": [demonstration(i) for i in val], "eval_prompts": [prompt(i) for i in evals]}
        kinds = {k: sum(constraints[i]["kind"] == k for i in evals) for k in self.kinds}
        self._write(out, files, prompts=len(sources), eval_kinds=kinds)


__all__ += ["ConstraintsWorld"]
