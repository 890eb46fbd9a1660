"""A trained reward model's held-out evaluation: test accuracy, AUROC and ECE, and the calibration statistics
(mean and std of its rewards on held-out completions) that PPO normalises rewards with."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from lrlhf.functional.stats import bootstrap_interval
from lrlhf.models.reward import RewardCalibration


def evaluate_held_out(module, data, out_dir: Path, trained) -> dict:
    """Validate ``module`` (whole, on global rank 0) on ``data``'s test split and calibrate it there; ``trained``
    is the module that trained (its per-source metrics are registered on a gathered copy)."""
    import lightning.pytorch as pl

    from lrlhf.strategies import no_metric_sync

    if module is not trained or getattr(data.trainer, "world_size", 1) > 1:  # rank 0 alone, the whole test set
        data.trainer = None
        data.setup("test")
        module.register_sources(trained.source_names.values())  # the metrics training had, and the test set's
        module.register_split_sources(data, "test")
        no_metric_sync(module)
    evaluator = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                           default_root_dir=str(out_dir))
    module.held_out = []  # one scoring pass: validation_step keeps each batch's (rewards, pairs) here
    try:
        metrics = evaluator.validate(module, dataloaders=data.test_dataloader(), verbose=False)[0]
        scored = module.held_out
    finally:
        module.held_out = None
    rewards = torch.cat([r for r, _ in scored])
    calibration = calibration_of(module, rewards, "held-out preference completions")
    return {"test/accuracy": metrics["val/accuracy"], "test/auroc": metrics["val/auroc"],
            "test/ece": metrics["val/ece"], "calibration": {"mean": calibration.mean, "std": calibration.std},
            **pairwise_baselines([pairs for _, pairs in scored]), **gold_accuracy(module, data)}


def gold_accuracy(module, data) -> dict:
    """Where the test pairs carry the gold score of both answers (``gold_chosen`` / ``gold_rejected`` in a record's
    meta: a ``pairs`` stage's, :mod:`lrlhf.run.pairs`), the RM's pairwise accuracy against the gold order on the
    pairs whose golds differ (``test/gold_accuracy``, a 95% bootstrap interval, their count) beside the labels' own
    agreement with gold on the same pairs (``test/labels_gold_agreement``, ties half): what the annotators let a
    reward model learn. Each answer is scored as PPO scores a sample (:func:`lrlhf.rewards.text.text_scorer`)."""
    from lrlhf.data.records import PreferencePair, PromptExample
    from lrlhf.rewards.text import reward_model_scorer

    records = [r for r in data.split_records("test") if isinstance(r, PreferencePair)
               and {"gold_chosen", "gold_rejected"} <= set(r.meta) and r.meta["gold_chosen"] != r.meta["gold_rejected"]]
    if not records:
        return {}
    scorer = reward_model_scorer(module.model, module.tokenizer)
    prompts = [PromptExample(r.prompt) for r in records] * 2
    texts = [_text(r.chosen) for r in records] + [_text(r.rejected) for r in records]
    was_training = module.model.training
    module.model.eval()
    try:
        scores = scorer(prompts, texts)
    finally:
        module.model.train(was_training)
    n = len(records)
    correct, agree = [], []
    for r, s_chosen, s_rejected in zip(records, scores[:n], scores[n:], strict=True):
        chosen_better = r.meta["gold_chosen"] > r.meta["gold_rejected"]
        correct.append(float((s_chosen > s_rejected) == chosen_better) if s_chosen != s_rejected else 0.5)
        agree.append(0.5 if r.target == 0.5 else float(chosen_better == (r.target > 0.5)))
    return {"test/gold_accuracy": sum(correct) / n, "test/gold_accuracy_interval": bootstrap_interval(correct),
            "test/gold_pairs": n, "test/labels_gold_agreement": sum(agree) / n}


def _text(turns) -> str:
    return "".join(t["content"] for t in turns if t.get("role") == "assistant")


def pairwise_baselines(pair_views) -> dict:
    """The RM's accuracy on the labelled (non-tie) pairs of ``pair_views`` (:class:`PairView` s) with its 95%
    bootstrap interval over pairs, beside what length alone scores on the same pairs: ``longer wins`` and ``shorter
    wins`` (equal lengths count half). An RM that only learned length is no better than one of them."""
    correct, longer, shorter = [], [], []
    for pairs in pair_views:
        labelled = pairs.target != 0.5
        sign = torch.where(pairs.target > 0.5, 1.0, -1.0)[labelled]
        correct += _wins(pairs.chosen, pairs.rejected, labelled, sign)
        longer += _wins(pairs.chosen_length, pairs.rejected_length, labelled, sign)
        shorter += _wins(pairs.rejected_length, pairs.chosen_length, labelled, sign)
    if not correct:
        return {}
    return {"test/pairs": len(correct), "test/pair_accuracy": sum(correct) / len(correct),
            "test/accuracy_interval": bootstrap_interval(correct),
            "test/longer_wins": sum(longer) / len(longer), "test/shorter_wins": sum(shorter) / len(shorter)}


@torch.no_grad()
def compute_calibration(module, data, reference: str = "") -> RewardCalibration:
    """Mean and std of the rewards of every completion in ``data``; stored on ``module.calibration``.

    Args:
        module: the trained reward module (scored in eval mode, restored afterwards).
        data: a datamodule (its ``val_dataloader()``), a DataLoader, or any iterable of batches that
            :meth:`RewardModule.score` accepts (pair, ranking, or plain ``input_ids`` / ``attention_mask``
            batches, e.g. the SFT policy's outputs).
        reference: a description saved with the numbers.

    Single process: run it after ``trainer.fit`` on rank 0.
    """
    if hasattr(data, "val_dataloader"):
        data.setup("validate")
        data = data.val_dataloader()
    was_training = module.training
    module.eval()
    try:
        rewards = torch.cat([module.score(_to_device(b, module.device)).float().cpu() for b in data])
    finally:
        module.train(was_training)
    return calibration_of(module, rewards, reference)


def calibration_of(module, rewards: Tensor, reference: str) -> RewardCalibration:
    """Mean and std of ``rewards``, stored on ``module.calibration``."""
    if rewards.numel() < 2:
        raise ValueError("compute_calibration needs at least two completions")
    std = rewards.std().item()
    if not std > 0:
        raise ValueError(f"compute_calibration: every reward of {rewards.numel()} completions is "
                         f"{rewards[0].item():g}, the std is 0: a degenerate reward model (training diverged: "
                         "module.config.lr too high?) or identical completions")
    module.calibration = RewardCalibration(rewards.mean().item(), std, rewards.numel(), reference)
    return module.calibration


def _wins(a: Tensor, b: Tensor, labelled: Tensor, sign: Tensor) -> list[float]:
    """Per labelled pair: 1 when ``a - b`` has the label's sign, 0 when not, 0.5 when level."""
    return (0.5 * (torch.sign((a - b).float()[labelled] * sign) + 1)).tolist()


def _to_device(batch: dict, device) -> dict:
    return {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}
