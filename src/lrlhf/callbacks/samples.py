"""The sample table of every training recipe: what the model writes now, what the reward says of it, what the
held-out judge says, and how far it has moved from its reference.

Every ``every_n_steps`` optimiser steps and at the end of training, :class:`SampleTable` logs one table
(``logger.log_table``: a W&B table; without such a logger ``<log_dir>/<key>.csv``) with the columns
:data:`COLUMNS`:

- a policy (SFT, DPO, PPO / RLOO / GRPO) answers the first ``max_prompts`` prompts, sampled and measured on
  the held-out path (:func:`lrlhf.eval.heldout.sample_held_out`, from a fixed seed in a forked RNG: the run's
  random stream is untouched and the rows of two tables differ only by what training changed). ``reward`` is
  the one the method optimises: PPO's calibrated RM score, DPO's implicit reward ``beta * log(pi / pi_ref)``,
  none for SFT; ``kl`` the sequence sum of ``log pi - log pi_ref`` (none for SFT, which has no reference).
- a reward model scores the chosen and the rejected answer of the first ``max_prompts`` pairs of ``pairs``.

``judge`` is the world's held-out judge (``toy_gold`` on the toy world, the judge RM of a world without gold when
the recipe builds one; null = no judge column values).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from lightning.pytorch import Callback

from lrlhf.data.records import PromptExample
from lrlhf.models.generation import SamplingConfig
from lrlhf.utils.tables import log_table

COLUMNS = ["step", "kind", "prompt", "response", "reward", "judge", "kl"]


def _value(x: float) -> float | None:
    return None if x is None or math.isnan(x) else float(x)


def _text(conversation) -> str:
    return "\n\n".join(str(m.get("content", "")) for m in conversation)


def held_out_policy(module, sampling: SamplingConfig):
    """The :class:`~lrlhf.eval.heldout.HeldOutPolicy` of a training module: the module's own
    ``held_out_policy(sampling)`` when it defines one (a subclass's override), else by kind: a PPO-family module
    through its hooks (its own sampling config; ``ModuleHooks``), a DPO module with its implicit reward
    (``ImplicitRewardPolicy``), an SFT module's model without reward or reference (``ModelPolicy``). None for a
    module without a policy (a reward model)."""
    from lrlhf.eval.heldout import ImplicitRewardPolicy, ModelPolicy, ModuleHooks
    from lrlhf.modules import DPOModule, PPOModule, SFTModule

    if hasattr(module, "held_out_policy"):
        return module.held_out_policy(sampling)
    if isinstance(module, PPOModule):
        return ModuleHooks(module)
    if isinstance(module, DPOModule):
        return ImplicitRewardPolicy(module.model, module.tokenizer, sampling, module.config.beta)
    if isinstance(module, SFTModule):
        return ModelPolicy(module.model, module.tokenizer, None, sampling)
    return None


class SampleTable(Callback):
    """Log a sample table every ``every_n_steps`` optimiser steps and at the end of training (module docstring).

    Args:
        prompts: what the policies answer: a file (any format read as prompts) or records.
        pairs: what a reward model scores: a preference file or records (chosen and rejected rows).
        every_n_steps: optimiser steps between tables (0: only at the end of training).
        max_prompts: the first N prompts or pairs.
        judge: a judge spec of :func:`lrlhf.eval.judges.resolve_judge`, or None.
        max_new_tokens, temperature, seed: SFT and DPO sampling (PPO samples with its own config).
        max_prompt_length: prompts are cut from the left to this many tokens.
        key: the table's name.
    """

    def __init__(self, prompts=None, pairs=None, every_n_steps: int = 100, max_prompts: int = 8, judge=None,
                 max_new_tokens: int = 32, temperature: float = 1.0, seed: int = 0, max_prompt_length: int = 1024,
                 key: str = "samples"):
        for name, ok, rule in [("every_n_steps", every_n_steps >= 0, ">= 0 (0: only at the end)"),
                               ("max_prompts", max_prompts >= 1, ">= 1"),
                               ("max_new_tokens", max_new_tokens >= 1, ">= 1"),
                               ("temperature", temperature >= 0, ">= 0 (0: greedy)")]:
            if not ok:
                raise ValueError(f"callbacks.samples.{name} must be {rule}, got {locals()[name]!r}")
        self.prompts_spec, self.pairs_spec, self.judge_spec = prompts, pairs, judge
        self.every_n_steps, self.max_prompts, self.key = every_n_steps, max_prompts, key
        self.sampling = SamplingConfig(max_new_tokens, temperature, seed)
        self.max_prompt_length = max_prompt_length
        self.judge = None
        self._loaded: dict[str, list] = {}  # the prompts and pairs, read once
        self._logged_at = -1
        self._seen = 0

    # ---------------------------------------------------------------------------------------- inputs
    def _records(self, spec, kind: str, key: str) -> list:
        """The first ``max_prompts`` records of ``spec`` (a file read as ``kind``, or records), read once."""
        if spec is None:
            raise ValueError(f"callbacks.samples.{key} is null: this module's table needs it")
        if key not in self._loaded:
            records = spec
            if isinstance(spec, (str, Path)):
                from lrlhf.data.formats import PREFERENCE_KINDS, load_records

                records, _ = load_records(str(spec), PREFERENCE_KINDS if kind == "preference" else kind,
                                          verbose=False)
            if kind == "preference":
                from lrlhf.data.records import as_pairs

                records = as_pairs(records, "extremes")  # a ranking: its best answer against its worst
            self._loaded[key] = list(records)[:self.max_prompts]
        return self._loaded[key]

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._resolve_judge()  # a bad judge fails before training

    def _resolve_judge(self):
        from lrlhf.eval.judges import resolve_judge

        if self.judge_spec is not None and self.judge is None:
            self.judge = resolve_judge(self.judge_spec, key="callbacks.samples.judge")
        return self.judge

    # ------------------------------------------------------------------------------------------ rows
    @torch.no_grad()
    def rows(self, pl_module, step: int) -> list[list]:
        """The table's rows at ``step`` (:data:`COLUMNS`)."""
        from lrlhf.eval.heldout import sample_held_out
        from lrlhf.eval.judges import score_responses

        policy = held_out_policy(pl_module, self.sampling)
        if policy is not None:
            prompts = self._records(self.prompts_spec, "prompt", "prompts")
            samples = sample_held_out(policy, prompts, 1, self.sampling.seed, len(prompts), self.max_prompt_length)
            records, texts = samples.records, samples.texts
            rewards, kls = samples.proxy.tolist(), samples.kl.tolist()
            if getattr(policy, "reference", True) is None:  # no reference: no KL (not 0)
                kls = [None] * len(texts)
            kinds = ["sample"] * len(texts)
        else:
            pairs = self._records(self.pairs_spec, "preference", "pairs")
            records = [PromptExample(p.prompt, p.source, dict(p.meta)) for p in pairs for _ in (0, 1)]
            texts = [_text(c) for p in pairs for c in (p.chosen, p.rejected)]
            kinds = ["chosen", "rejected"] * len(pairs)
            rewards = self._score_texts(pl_module, records, texts)
            kls = [None] * len(texts)
        judge = self._resolve_judge()
        judged = score_responses(judge, records, texts) if judge is not None else [None] * len(texts)
        return [[step, kind, _text(r.prompt[-1:]), text, _value(reward), _value(j), _value(kl)]
                for kind, r, text, reward, j, kl in zip(kinds, records, texts, rewards, judged, kls, strict=True)]

    @staticmethod
    def _score_texts(pl_module, records, texts) -> list[float]:
        from lrlhf.rewards.text import reward_model_scorer

        if not hasattr(pl_module.model, "score") or pl_module.tokenizer is None:
            raise TypeError(f"callbacks.samples: {type(pl_module).__name__} has no policy and no reward model with a "
                            "tokenizer; give it held_out_policy(sampling), or callbacks.samples=null")
        return reward_model_scorer(pl_module.model, pl_module.tokenizer)(records, texts)

    def write_table(self, trainer, pl_module) -> None:
        step = trainer.global_step
        if step == self._logged_at:
            return
        self._logged_at = step
        modes = {m: m.training for m in pl_module.modules()}
        pl_module.eval()  # no dropout while sampling and scoring; each submodule's mode is restored after
        try:
            from lrlhf.strategies import full_params_for_generation

            with full_params_for_generation(trainer.strategy.model):  # FSDP1: the root unit's weights unsharded
                rows = self.rows(pl_module, step)
        finally:
            for m, training in modes.items():
                m.training = training
        log_table(pl_module, self.key, list(COLUMNS), rows)

    # ---------------------------------------------------------------------------------------- hooks
    def on_train_start(self, trainer, pl_module) -> None:
        self._seen = trainer.global_step  # a resumed run counts from where it stopped

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # a multiple of every_n_steps crossed: a PPO rollout makes several optimiser steps at once
        step, every, seen = trainer.global_step, self.every_n_steps, self._seen
        self._seen = step
        if every and step // every > seen // every:
            self.write_table(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self.write_table(trainer, pl_module)
