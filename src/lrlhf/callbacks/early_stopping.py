"""Early stopping on held-out utility, not on the training reward (the proxy keeps rising while the true utility
falls: Gao et al. 2022); without a judge, on a reward ensemble's held-out disagreement (``max_disagreement_rise``).

Every ``every_n_rollouts`` rollouts :class:`HeldOutUtilityEarlyStopping` samples responses to a fixed set of
held-out prompts (disjoint from the RL prompts) with the policy's sampling config and a fixed seed, in a forked
RNG (the training RNG stream is untouched), and measures on the same samples:

- ``utility``: a scorer that is **not** the training reward: the toy world's gold utility by default; any
  callable ``(prompt_record, response_text) -> float`` (a rule set, a separate held-out reward model), or an object
  with ``score_batch(prompt_records, response_texts) -> list[float]``; by name as for ``eval.judge``
  (:func:`lrlhf.eval.judges.resolve_judge`: ``toy_gold``, ``rm:<folder>``, ``<module>:<callable>``);
- ``proxy``: the training reward model's score, calibrated as in the rewards (no penalty, no clip);
- ``kl``: the mean over responses of the per-sequence sum of k1 (``logp - ref_logp``) against the reference.

Sampling and measuring are ``recipe=eval``'s held-out path (:func:`lrlhf.eval.heldout.sample_held_out`), here
through the PPO module's own hooks (:class:`lrlhf.eval.heldout.ModuleHooks`).

Rollout 0, the starting policy before any update, is evaluated at ``on_train_start`` and is the first candidate: a
run whose updates only made things worse keeps (and the CLI exports) the policy it started from, and says so.
The best checkpoint **by utility** is written (atomically) as ``best.ckpt``; training stops after ``patience``
evaluations without an improvement of at least ``min_delta``. Logged at each evaluation: ``heldout/utility``,
``heldout/proxy``, ``heldout/kl_seq``, ``heldout/best_utility``. The Goodhart plot (utility and proxy against
sqrt(KL), the kept checkpoint marked) is written to the log dir on each evaluation and at the end, and sent
to the logger when it takes images; the history goes to ``heldout_history.json`` next to it.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lrlhf.callbacks.checkpoint import atomic_save_checkpoint
from lrlhf.data.records import PromptExample
from lrlhf.data.tokenize import encode_prompt
from lrlhf.eval.heldout import ModuleHooks, sample_held_out
from lrlhf.eval.judges import resolve_judge, score_responses
from lrlhf.eval.plots import plot_goodhart
from lrlhf.models.generation import as_prompt
from lrlhf.utils.io import atomic_write_text

Utility = Callable[[Any, str], float]


class DisagreementHooks(ModuleHooks):
    """:class:`ModuleHooks` that score through ``PPOModule.reward_scores`` and keep an ensemble reward's per-sample
    disagreement (its members' std) of every batch, in order, in :attr:`disagreement`."""

    def __init__(self, module):
        super().__init__(module)
        self.disagreement: list[torch.Tensor] = []

    def score(self, q, qm, r, masks, meta=None):
        scores, disagreement = self.reward(q, qm, r, masks, meta)
        if disagreement is not None:
            self.disagreement.append(disagreement)
        return scores


class HeldOutUtilityEarlyStopping(Callback):
    """Evaluate held-out utility, keep the best checkpoint by it, stop when it stops improving.

    Args:
        prompts: held-out prompts: a path read with ``load_records(path, "prompt")`` or a list of records.
        utility: ``"toy_gold"``, ``"rm:<folder>"``, ``"<module>:<callable>"``, a callable
            ``(prompt_record, response_text) -> float``, or an object with ``score_batch(records, texts)``
            (:func:`lrlhf.eval.judges.resolve_judge`). Must not be the training reward model, except as ``"proxy"``
            with ``max_disagreement_rise`` (no judge: the disagreement decides when to stop).
        every_n_rollouts: evaluate after every n-th rollout.
        patience: evaluations without improvement before stopping; None = never stop (still keeps the best).
        min_delta: an improvement counts when ``utility > best + min_delta``.
        n_samples: responses per prompt (adjacent rows; all share the sampling seed's stream).
        seed: seed of the evaluation sampling (forked RNG).
        batch_size: prompts x samples per generation batch.
        dirpath: folder of ``best.ckpt``; None = the trainer's checkpoint callback's folder, else
            ``<default_root_dir>/checkpoints``.
        save_best: write ``best.ckpt`` on each improvement.
        plot: write the Goodhart plot (needs matplotlib).
        max_prompt_length: prompts are cut (from the left) to this many tokens.
        max_prompts: the first N prompts only (each evaluation costs a sampling pass over them); None = all.
        max_disagreement_rise: with an ensemble reward (``reward=ensemble``), a warning that needs no gold: an
            evaluation whose held-out disagreement (the members' std) exceeds ``(1 + max_disagreement_rise)`` times
            rollout 0's is not a candidate, and training stops there. With ``utility="proxy"`` (the run's own
            held-out reward, allowed only with this guard) the kept checkpoint is the best-proxy one before the rise.
    """

    def __init__(
        self,
        prompts: str | Path | Sequence[PromptExample],
        utility: str | Utility | Any = "toy_gold",
        every_n_rollouts: int = 5,
        patience: int | None = 3,
        min_delta: float = 0.0,
        n_samples: int = 1,
        seed: int = 1234,
        batch_size: int = 64,
        dirpath: str | Path | None = None,
        save_best: bool = True,
        plot: bool = True,
        max_prompt_length: int = 1024,
        max_prompts: int | None = None,
        max_disagreement_rise: float | None = None,
    ):
        checks = [("every_n_rollouts", every_n_rollouts >= 1, "must be >= 1"),
                  ("patience", patience is None or patience >= 1, "must be >= 1 or None"),
                  ("min_delta", min_delta >= 0, "must be >= 0"),
                  ("n_samples", n_samples >= 1, "must be >= 1"),
                  ("batch_size", batch_size >= 1, "must be >= 1"),
                  ("max_prompts", max_prompts is None or max_prompts >= 1, "must be >= 1 or None"),
                  ("max_disagreement_rise", max_disagreement_rise is None or max_disagreement_rise > 0,
                   "must be > 0 or None"),
                  ("utility", utility != "proxy" or max_disagreement_rise is not None,
                   "proxy (the training reward) needs max_disagreement_rise: alone it keeps the most over-optimised "
                   "checkpoint")]
        for key, ok, rule in checks:
            if not ok:
                raise ValueError(f"callbacks.early_stopping.{key} {rule}, got {locals()[key]!r}")
        if isinstance(prompts, (str, Path)):
            from lrlhf.data.formats import load_records

            prompts, _ = load_records(str(prompts), "prompt", verbose=False)
        self.prompts = [as_prompt(p) for p in prompts][:max_prompts]
        if not self.prompts:
            raise ValueError("callbacks.early_stopping.prompts is empty")
        self.utility = None if utility == "proxy" else resolve_judge(utility, key="callbacks.early_stopping.utility")
        self.max_disagreement_rise = max_disagreement_rise
        untasked = [i for i, p in enumerate(self.prompts) if "task" not in p.meta]
        if utility == "toy_gold" and untasked:  # checked now, not after the first rollout
            raise ValueError(f"callbacks.early_stopping.utility=toy_gold: prompt {untasked[0] + 1} of "
                             f"callbacks.early_stopping.prompts (and {len(untasked) - 1} more) has no toy-world task "
                             "to score; the toy world's gold utility scores only its own prompts: give a judge "
                             "(rm:<folder>, <module>:<callable>) or the world's (world.judge)")
        if plot and importlib.util.find_spec("matplotlib") is None:
            raise ValueError("callbacks.early_stopping.plot=True needs matplotlib (pip install matplotlib), "
                             "or set plot=False")
        self.every_n_rollouts, self.patience, self.min_delta = every_n_rollouts, patience, min_delta
        self.n_samples, self.seed, self.batch_size = n_samples, seed, batch_size
        self.dirpath = Path(dirpath) if dirpath is not None else None
        self.save_best, self.plot, self.max_prompt_length = save_best, plot, max_prompt_length
        self.history: list[dict] = []
        self.best_index: int | None = None
        self.wait = 0
        self.stopped_at: int | None = None
        self.best_model_path = ""

    # ---------------------------------------------------------------------------------------- state
    @property
    def best(self) -> dict | None:
        return self.history[self.best_index] if self.best_index is not None else None

    def state_dict(self) -> dict:
        return {"history": [dict(h) for h in self.history], "best_index": self.best_index, "wait": self.wait,
                "stopped_at": self.stopped_at, "best_model_path": self.best_model_path}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = [dict(h) for h in state_dict["history"]]
        self.best_index, self.wait = state_dict["best_index"], state_dict["wait"]
        self.stopped_at, self.best_model_path = state_dict["stopped_at"], state_dict["best_model_path"]

    # ----------------------------------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self, trainer: pl.Trainer, pl_module) -> dict[str, float]:
        """``{"utility", "proxy", "kl", "length"}`` means over the held-out samples (see the module docstring), and
        ``disagreement`` with an ensemble reward (its members' std).

        Uses the PPO module's hooks (:class:`~lrlhf.eval.heldout.ModuleHooks`): ``generate`` (its sampling config),
        ``policy_forward``, ``reference_logprobs``, ``score`` and ``calibration``. Override to evaluate something
        else.
        """
        hooks = DisagreementHooks(pl_module)
        samples = sample_held_out(hooks, self.prompts, self.n_samples, self.seed, self.batch_size,
                                  self.max_prompt_length)
        utilities = samples.proxy.tolist() if self.utility is None else score_responses(self.utility, samples.records,
                                                                                        samples.texts)
        result = {"utility": sum(utilities) / len(utilities), "proxy": samples.proxy.mean().item(),
                  "kl": samples.kl.mean().item(), "length": samples.lengths.float().mean().item()}
        if hooks.disagreement:  # the members' disagreement on the held-out samples: a warning that needs no gold
            result["disagreement"] = torch.cat(hooks.disagreement).mean().item()
        return result

    # ---------------------------------------------------------------------------------------- hooks
    def setup(self, trainer, pl_module, stage: str) -> None:
        """Refuse, before any rollout, a held-out prompt whose text holds a special token's text (the
        evaluation would meet it only at its first run), naming the prompt, its source and the config key."""
        for i, prompt in enumerate(self.prompts):
            try:
                encode_prompt(pl_module.tokenizer, prompt, max_length=self.max_prompt_length, truncation="left",
                              special_text="error")
            except ValueError as err:
                raise ValueError(f"callbacks.early_stopping.prompts: prompt {i} ({prompt.source or 'in memory'}): "
                                 f"{err}") from err

    def on_train_start(self, trainer, pl_module) -> None:
        """Rollout 0: the starting policy, before its first update, is the first candidate, so a run whose updates
        only made held-out utility worse keeps (and the CLI exports) the policy it started from. Skipped on a
        resume (its history already holds rollout 0) and when the callback joins a run that has already moved."""
        if self.history or self._rollouts(trainer, pl_module, done=trainer.global_step) != 0:
            return
        modes = {m: m.training for m in pl_module.modules()}
        pl_module.eval()  # as the module samples its rollouts (no dropout); each submodule's mode is restored after
        try:
            self._evaluate_and_keep(trainer, pl_module, 0)
        finally:
            for m, training in modes.items():
                m.training = training

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        rollouts = self._rollouts(trainer, pl_module, done=trainer.fit_loop.epoch_loop.total_batch_idx + 1)
        if rollouts == 0 or rollouts % self.every_n_rollouts:
            return
        self._evaluate_and_keep(trainer, pl_module, rollouts)
        if self.history[-1].get("disagreement_risen"):
            self.stopped_at = rollouts
            trainer.should_stop = True
            rank_zero_info(f"early stopping at rollout {rollouts}: the reward ensemble's held-out disagreement "
                           f"{self.history[-1]['disagreement']:.4f} rose above (1 + {self.max_disagreement_rise:g}) x "
                           f"{self.history[0]['disagreement']:.4f} (rollout 0); kept rollout {self.best['rollout']} "
                           f"({self.best_model_path})")
        elif self.patience is not None and self.wait >= self.patience:
            self.stopped_at = rollouts
            trainer.should_stop = True
            rank_zero_info(f"early stopping at rollout {rollouts}: {self.wait} evaluations without an improvement "
                           f">= {self.min_delta}; kept rollout {self.best['rollout']} ({self.best_model_path})")

    @staticmethod
    def _rollouts(trainer, pl_module, done: int) -> int:
        return int(getattr(pl_module, "rollouts_done", done))

    @property
    def chosen(self) -> dict | None:
        """The evaluation to restore and export: the best, unless rollout 0 is the only one (no updated policy
        was evaluated: the run ended before ``every_n_rollouts``), then None (the final policy is kept)."""
        evaluated_updates = any(h["rollout"] > 0 for h in self.history)
        return self.best if self.best is not None and evaluated_updates else None

    @property
    def kept_start(self) -> bool:
        """True when rollout 0 is chosen: no evaluated update improved on the starting policy."""
        return self.chosen is not None and self.chosen["rollout"] == 0

    def _evaluate_and_keep(self, trainer, pl_module, rollouts: int) -> None:
        result = {"rollout": rollouts, "global_step": trainer.global_step, **self.evaluate(trainer, pl_module)}
        if self.max_disagreement_rise is not None:
            if "disagreement" not in result:
                raise ValueError("callbacks.early_stopping.max_disagreement_rise watches a reward ensemble's "
                                 "disagreement: the reward is a single model (use reward=ensemble)")
            start = self.history[0]["disagreement"] if self.history else result["disagreement"]
            result["disagreement_risen"] = result["disagreement"] > (1 + self.max_disagreement_rise) * start
        self.history.append(result)
        index = len(self.history) - 1
        best = self.best
        improved = not result.get("disagreement_risen") and (
            best is None or result["utility"] > best["utility"] + self.min_delta)
        if improved:
            self.best_index, self.wait = index, 0
            if self.save_best:
                # A sharded save (torch DCP) initialises an optimiser that has not stepped yet (rollout 0) with a
                # zero-lr step; its state is cleared again, so the first update is the one a run without this
                # callback takes (Adam's step count; measured under FSDP2: rollout 1 sampled other tokens).
                unstepped = [opt for opt in trainer.optimizers if not opt.state]
                self.best_model_path = str(atomic_save_checkpoint(trainer, self._dirpath(trainer) / "best.ckpt"))
                for opt in unstepped:
                    opt.state.clear()
        else:
            self.wait += 1
        if rollouts > 0:  # rollout 0 runs in on_train_start, where Lightning's step logging does not apply
            pl_module.log_dict({"heldout/utility": result["utility"], "heldout/proxy": result["proxy"],
                                "heldout/kl_seq": result["kl"], "heldout/length": result["length"],
                                "heldout/best_utility": self.best["utility"],
                                **({"heldout/disagreement": result["disagreement"]} if "disagreement" in result
                                   else {})}, batch_size=1)
        what = "the starting policy, before any update" if rollouts == 0 else f"rollout {rollouts}"
        rank_zero_info(f"held-out eval {index} ({what}): utility {result['utility']:.4f}, proxy "
                       f"{result['proxy']:.4f}, KL {result['kl']:.3f}; best {self.best['utility']:.4f} at rollout "
                       f"{self.best['rollout']}{'' if improved else f', {self.wait} without improvement'}")
        self._write_outputs(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        if not self.history:
            return
        self._write_outputs(trainer, final=True)
        rollouts = self._rollouts(trainer, pl_module, done=trainer.global_step)
        if self.chosen is None and rollouts > 0:
            rank_zero_warn(f"held-out utility was evaluated only at rollout 0, before any update: the trained policy "
                           f"({rollouts} rollouts) was never evaluated (callbacks.early_stopping.every_n_rollouts="
                           f"{self.every_n_rollouts}), so no checkpoint is chosen and the final policy is kept")
        if self.kept_start:
            later = max(h["utility"] for h in self.history[1:])
            rank_zero_warn(f"held-out utility never improved on the starting policy (rollout 0: "
                           f"{self.best['utility']:.4f}; best after an update {later:.4f}, over "
                           f"{len(self.history) - 1} evaluations, min_delta {self.min_delta:g}): the starting policy "
                           f"is kept as the best ({self.best_model_path or 'save_best=False: no checkpoint written'}). "
                           "Likely causes: module.config.lr too high, or too few rollouts to improve")

    # -------------------------------------------------------------------------------------- outputs
    def stage_summary(self, trainer: pl.Trainer, pl_module) -> dict:
        """For the stage's summary (``lrlhf.modules.stage``): load the checkpoint this callback chose (by held-out
        utility, never by training reward) into ``pl_module`` and say which; {} when nothing was chosen. Every rank
        calls it (a sharded checkpoint is read collectively)."""
        from lrlhf.strategies import restore_sharded_weights

        if self.chosen is None:
            return {}
        found = {"chosen/rollout": self.chosen["rollout"], "chosen/heldout_utility": self.chosen["utility"],
                 "chosen/starting_policy": self.kept_start,  # rollout 0: no update improved on the start
                 "goodhart_plot": str(Path(trainer.log_dir or trainer.default_root_dir) / "goodhart.png")}
        if self.best_model_path and Path(self.best_model_path).is_dir():
            restore_sharded_weights(trainer, Path(self.best_model_path))
            found["chosen/checkpoint"] = self.best_model_path
        elif self.best_model_path:
            state = torch.load(self.best_model_path, map_location="cpu", weights_only=True)["state_dict"]
            unexpected = pl_module.load_state_dict(state, strict=False).unexpected_keys  # frozen weights not saved
            if unexpected:
                raise RuntimeError(f"{self.best_model_path}: unexpected weights {unexpected[:5]}")
            found["chosen/checkpoint"] = self.best_model_path
        return found

    def _dirpath(self, trainer: pl.Trainer) -> Path:
        if self.dirpath is not None:
            return self.dirpath
        checkpoint = trainer.checkpoint_callback
        if checkpoint is not None and getattr(checkpoint, "dirpath", None):
            return Path(checkpoint.dirpath)
        return Path(trainer.default_root_dir) / "checkpoints"

    @staticmethod
    def _log_dir(trainer: pl.Trainer) -> Path:
        return Path(trainer.log_dir or trainer.default_root_dir)

    def _write_outputs(self, trainer: pl.Trainer, final: bool = False) -> None:
        log_dir = self._log_dir(trainer)  # before the rank test: trainer.log_dir is a broadcast (every rank)
        if not trainer.is_global_zero:
            return
        summary = {"history": self.history, "best_index": self.best_index, "best_model_path": self.best_model_path,
                   "kept_starting_policy": self.kept_start,
                   "stopped_at": self.stopped_at, "min_delta": self.min_delta, "patience": self.patience,
                   "utility": "proxy" if self.utility is None else getattr(self.utility, "__name__",
                                                                            type(self.utility).__name__),
                   "max_disagreement_rise": self.max_disagreement_rise}
        atomic_write_text(log_dir / "heldout_history.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")
        if not self.plot:
            return
        path = plot_goodhart(self.history, self.best_index, log_dir / "goodhart.png",
                             title=f"held-out utility vs proxy ({len(self.history)} evaluations)")
        logger = trainer.logger
        step = self.history[-1]["rollout"]
        if logger is None:
            return
        if hasattr(logger, "log_image"):  # e.g. WandbLogger
            logger.log_image(key="heldout/goodhart", images=[str(path)], step=trainer.global_step)
        elif hasattr(getattr(logger, "experiment", None), "add_image"):  # TensorBoard
            import numpy as np
            from matplotlib.image import imread

            logger.experiment.add_image("heldout/goodhart", np.asarray(imread(path)), step, dataformats="HWC")
