"""The high-reward audit during PPO / RLOO / GRPO: every N rollouts, the rollout's top-reward samples with their
reward, the ensemble's disagreement, length, counterfactual deltas and a judge's utility (the toy world's gold, or
a held-out judge), as a W&B table (``audit``; a CSV without W&B) and appended to ``<run>/audit.md``
(:mod:`lrlhf.eval.audit`). With several processes each rank audits its own rollout (the rescoring forwards are
collective under FSDP) and rank 0's is written."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import torch

from lrlhf.data.records import PromptExample


class HighRewardAudit(pl.Callback):
    """Args: every_n_rollouts: audit rollouts ``N, 2N, ...``; top_k: samples per audit; judge: a judge spec
    (``toy_gold``, ``rm:<folder>``, ``module:callable``; :func:`lrlhf.eval.judges.resolve_judge`) or None;
    transforms: counterfactual transformations (None: :data:`lrlhf.eval.counterfactual.DEFAULT_TRANSFORMS`);
    path: the Markdown file (None: ``<trainer.default_root_dir>/audit.md``)."""

    def __init__(self, every_n_rollouts: int = 10, top_k: int = 8, judge=None, transforms=None,
                 path: str | None = None):
        for key, value in (("every_n_rollouts", every_n_rollouts), ("top_k", top_k)):
            if value < 1:
                raise ValueError(f"callbacks.audit.{key} must be >= 1, got {value}")
        self.every, self.top_k, self.judge_spec, self.path = every_n_rollouts, top_k, judge, path
        self.transforms = transforms
        self.judge = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if not hasattr(pl_module, "rollouts_done"):
            raise ValueError(f"callbacks.audit (HighRewardAudit) audits rollouts: use it with PPO, RLOO or GRPO, not "
                             f"{type(pl_module).__name__} (callbacks.audit=null)")
        if self.judge_spec is not None and self.judge is None:
            from lrlhf.eval.judges import resolve_judge

            self.judge = resolve_judge(self.judge_spec, key="callbacks.audit.judge")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        rollout = outputs.get("rollout") if isinstance(outputs, dict) else None  # None: no update on this batch
        if rollout is None or pl_module.rollouts_done % self.every:
            return  # every rank audits its own rollout (rescoring is collective under FSDP); rank 0 writes
        self.audit(trainer, pl_module, batch, rollout)

    @torch.no_grad()
    def audit(self, trainer, pl_module, batch: dict, rollout) -> None:
        from lrlhf.data.collate import collate_responses
        from lrlhf.eval.audit import audit_markdown, audit_rows
        from lrlhf.eval.counterfactual import DEFAULT_TRANSFORMS
        from lrlhf.eval.judges import score_responses
        from lrlhf.functional import response_masks
        from lrlhf.utils.io import atomic_write_text
        from lrlhf.utils.tables import log_table

        tok = pl_module.tokenizer
        prompts = [PromptExample(batch["prompts"][i], meta=batch["meta"][i])  # rows a filter kept keep their prompt
                   for i in rollout.prompt_index.tolist()]
        lengths = rollout.masks.lengths.tolist()
        responses = [tok.decode(rollout.response_ids[i, :n].tolist(), skip_special_tokens=True).strip()
                     for i, n in enumerate(lengths)]

        def rescore(indices: list[int], texts: list[str]) -> list[float]:
            if not indices:
                return []
            resp = collate_responses(tok, texts, pl_module.eos_token_ids[0], pl_module.pad_token_id)
            rows = torch.tensor(indices)
            query, query_mask = rollout.query_ids[rows], rollout.query_mask[rows]
            resp = resp.to(query.device)
            masks = response_masks(resp, pl_module.eos_token_ids, pl_module.pad_token_id)
            meta = [prompts[i].meta for i in indices]  # each row's prompt record (a reference answer)
            raw = pl_module.reward_scores(query, query_mask, resp, masks, meta).scores.float()  # the run's reward
            calibration = pl_module.calibration
            return (calibration.normalise(raw) if calibration is not None else raw).tolist()

        columns, rows = audit_rows(prompts, responses, rollout.scores.tolist(), lengths, rescore,
                                   None if rollout.disagreement is None else rollout.disagreement.tolist(),
                                   None if self.judge is None else lambda p, t: score_responses(self.judge, p, t),
                                   self.transforms or DEFAULT_TRANSFORMS, self.top_k, seed=pl_module.rollouts_done)
        log_table(pl_module, "audit", ["rollout", *columns], [[pl_module.rollouts_done, *r] for r in rows])
        if not trainer.is_global_zero:
            return
        path = Path(self.path) if self.path else Path(trainer.default_root_dir) / "audit.md"
        old = path.read_text() if path.is_file() else "# High-reward audit\n\n"
        title = f"rollout {pl_module.rollouts_done} (step {trainer.global_step})"
        atomic_write_text(path, old + audit_markdown(columns, rows, title) + "\n")
