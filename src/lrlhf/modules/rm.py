"""Reward-model training: a :class:`~lrlhf.models.ScalarModel` fitted to preferences with Bradley–Terry.

Batches come from :class:`lrlhf.data.PreferenceDataModule`:

- pairs (padded): ``2B`` rows, chosen rows ``[0, B)`` then rejected rows ``[B, 2B)``, ``pair_targets`` (B,);
- pairs (packed): rows holding whole pairs, ``chosen_end`` / ``rejected_end`` (B, 2) where each score is read;
- rankings: ``N`` flattened completions with ``group`` and ``ranks`` (1 = best);
- prefix-shared pairs or rankings (:mod:`lrlhf.data.shared_batches`, the default where prompts are a large share of the
  tokens): one row per pair or ranking, the prompt encoded once; the scores come out in the padded order.

Every batch is scored in ONE forward pass (chosen and rejected together), then split.

After training, :func:`compute_calibration` measures the mean and std of the rewards on reference
completions; :meth:`RewardModule.export` writes them next to the weights as ``reward_calibration.json`` so
PPO can apply the frozen affine normalisation ``(r - mean) / std`` (:class:`RewardCalibration`).

The exported folder is the frozen reward artefact, read by :mod:`lrlhf.models.reward` (:class:`RewardCalibration`,
:func:`load_reward_model`, :func:`attach_reward_adapter`, re-exported here).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import CatMetric, MeanMetric, PearsonCorrCoef
from torchmetrics.classification import BinaryAUROC, BinaryCalibrationError

from lrlhf.data.collate import model_inputs, pad_to_multiple
from lrlhf.data.shared_batches import is_shared, pad_shared_to_multiple, unshare_batch
from lrlhf.functional import bradley_terry_loss, margin_summary, pairwise_accuracy, ranking_loss, ranking_pairs
from lrlhf.functional.prefix_sharing import gather_last
from lrlhf.models import (
    LoraSpec,
    ModelConfig,
    ScalarModel,
    add_adapters,
    export_adapter,
    export_merged,
    load_causal_lm,
    load_tokenizer,
)
from lrlhf.models.heads import decoder
from lrlhf.models.lora import refuse_full_finetuning_if_quantised
from lrlhf.models.reward import (
    ADAPTER_DIR,
    ADAPTER_NAME,
    CALIBRATION_FILE,
    HEAD_FILE,
    RewardCalibration,
    attach_reward_adapter,
    load_calibration,
    load_reward_model,
)
from lrlhf.models.shared_inputs import can_share, shared_inputs
from lrlhf.modules.optim import OptimConfig, check_finite, check_finite_weights
from lrlhf.modules.reward_eval import compute_calibration
from lrlhf.modules.stage import StageOutputs

HEAD_INITS = ("normal", "zero")
TIES = ("soft", "drop")
LENGTH_BUCKETS = ("chosen_longer", "similar", "chosen_shorter")


@dataclass
class RewardConfig(OptimConfig):
    """Hyperparameters of reward-model training (``module.config.*``); the optimiser's are :class:`OptimConfig`'s."""

    scheduler: str = "constant"
    """Learning-rate schedule after warmup (a name in SCHEDULERS); the recipes set ``cosine``."""
    lora: LoraSpec | None = None
    """A LoRA adapter named ``reward`` on a frozen backbone; None fine-tunes the whole backbone. The head is
    trained either way."""
    head_init: str = "normal"
    """``normal``: weight ~ N(0, 1/(H+1)), bias 0 (Stiennon et al., 2020); ``zero``: every reward starts at 0."""
    center_coef: float = 0.0
    """Reward-centering regulariser (Eisenstein et al., 2023, "Helping or Herding"): adds
    ``center_coef * mean(r^2)`` over every scored completion of the batch, so the BT loss (which only sees
    differences) cannot let the rewards drift; TRL uses 0.01. 0 disables it."""
    ties: str = "soft"
    """Pair ties (``pair_targets == 0.5``): ``soft`` trains on them as the BCE target 0.5 (pulls the margin to
    0); ``drop`` leaves them out of the loss. Ranking ties are always soft (``ranking_loss``'s target 0.5)."""
    similar_length: int = 2
    """Validation: a pair whose completions differ by at most this many tokens is in the ``similar`` bucket."""
    order_seed: int = 0
    """Validation: seed of the fixed generator that randomises the A/B order for ECE and AUROC."""
    calibration_bins: int = 10
    """Validation: bins of the expected calibration error."""
    compile: bool = False
    """``torch.compile`` (inductor) the backbone's transformer body (in place: parameter names, ``state_dict``
    and exports are unchanged) for every forward of this module. The first forward of a new input shape, and
    of training vs. no-grad, compiles (tens of seconds on a CPU), so it pays off only for long runs; padded
    batches are right-padded to a multiple of ``compile_pad_multiple`` tokens so few shapes occur (after a
    second shape, torch.compile recompiles once with dynamic sizes). Not tested with FSDP."""
    compile_pad_multiple: int = 64
    """With ``compile``: a padded batch's sequence length is rounded up to a multiple of this many tokens
    (the extra positions are masked padding, so the rewards are unchanged). 1: no rounding."""

    def __post_init__(self):
        self.check_optim()
        if self.head_init not in HEAD_INITS:
            raise ValueError(f"module.config.head_init={self.head_init!r}; choose one of {HEAD_INITS}")
        if self.center_coef < 0:
            raise ValueError(f"module.config.center_coef must be >= 0, got {self.center_coef}")
        if self.ties not in TIES:
            raise ValueError(f"module.config.ties={self.ties!r}; choose one of {TIES}")
        if self.similar_length < 0:
            raise ValueError(f"module.config.similar_length must be >= 0, got {self.similar_length}")
        if self.calibration_bins < 1:
            raise ValueError(f"module.config.calibration_bins must be >= 1, got {self.calibration_bins}")
        if self.compile_pad_multiple < 1:
            raise ValueError(f"module.config.compile_pad_multiple must be >= 1, got {self.compile_pad_multiple}")
        if isinstance(self.lora, dict):  # from a YAML config
            self.lora = LoraSpec(**self.lora)


class PairView(NamedTuple):
    """A batch's scores as pairs (a ranking batch contributes every within-prompt pair).

    Fields (P pairs):
        chosen, rejected: ``(P,)`` rewards of the first (preferred) and second completion.
        target: ``(P,)`` P(first wins): 1 for a label, 0.5 for a tie.
        chosen_length, rejected_length: ``(P,)`` completion lengths in tokens (prompt excluded).
        sources: P group names for per-source accuracy (see :meth:`RewardModule.pair_sources`), or None.
    """

    chosen: Tensor
    rejected: Tensor
    target: Tensor
    chosen_length: Tensor
    rejected_length: Tensor
    sources: list[str] | None


class RewardLoss(NamedTuple):
    """What :meth:`RewardModule.compute_loss` returns.

    Fields:
        loss: scalar to minimise (BT or ranking loss, plus the centering term).
        pairs: the batch as pairs (detached rewards), for accuracy and margin statistics.
    """

    loss: Tensor
    pairs: PairView


def is_ranking(batch: dict) -> bool:
    return "group" in batch


def completion_lengths(batch: dict) -> Tensor:
    """``(rows,)`` tokens after the prompt of each scored row, in :meth:`RewardModule.score`'s order."""
    if "completion_lengths" in batch:  # packed
        return batch["completion_lengths"]
    return batch["lengths"] - batch["prompt_lengths"]


def _continued(model: ModelConfig, config: RewardConfig) -> ScalarModel | None:
    """The reward model of a :meth:`RewardModule.export` folder (its head beside the weights), to train further
    (e.g. iterative RLHF's next round); None for any other model folder (a causal LM gets a fresh head)."""
    if not (Path(model.name_or_path) / HEAD_FILE).is_file():
        return None
    if config.lora is not None or (Path(model.name_or_path) / ADAPTER_DIR).is_dir():
        raise ValueError(f"module.model.name_or_path={model.name_or_path} is a reward model; continuing one is "
                         "supported for a fully fine-tuned RM only (module.config.lora=null): start a LoRA RM from "
                         "its base instead")
    return load_reward_model(model.name_or_path, model.dtype).train()


class RewardModule(StageOutputs, pl.LightningModule):
    """Bradley–Terry reward model on a causal-LM backbone, full fine-tune or LoRA (adapter ``reward``).

    Args:
        model: a :class:`ModelConfig` (loaded with :func:`load_causal_lm`), a causal LM, or a ready
            :class:`ScalarModel` (used as is: no adapter is added, ``head_init`` is ignored).
        config: hyperparameters (:class:`RewardConfig`).
        tokenizer: saved by :meth:`export`: a tokenizer, or a path for :func:`load_tokenizer`; when omitted, the
            ``ModelConfig``'s folder's tokenizer if it has one.

    Subclass hooks: :meth:`score` (rewards of a batch), :meth:`compute_loss` (rewards -> loss),
    :meth:`pair_sources` (the group a pair is reported under).
    """

    def __init__(self, model: ModelConfig | nn.Module, config: RewardConfig | None = None, tokenizer=None):
        super().__init__()
        self.config = config = config or RewardConfig()
        self.save_hyperparameters({"reward": asdict(config)})
        if isinstance(tokenizer, (str, Path)):
            tokenizer = load_tokenizer(ModelConfig(str(tokenizer)))
        if isinstance(model, ModelConfig):
            if tokenizer is None and (Path(model.name_or_path) / "tokenizer_config.json").is_file():
                tokenizer = load_tokenizer(model)
            model = _continued(model, config) or load_causal_lm(model)
        if not isinstance(model, ScalarModel):
            if config.lora is None:
                refuse_full_finetuning_if_quantised(model, "module.config.lora", "hparams.rm.lora='{r:16,alpha:32}'")
            else:
                model = add_adapters(model, {ADAPTER_NAME: config.lora})
            model = ScalarModel(model, zero_init=config.head_init == "zero")
        self.model = model
        if config.compile:
            decoder(model.backbone).compile()  # lazily, at the first forward
        self.tokenizer = tokenizer
        self.calibration: RewardCalibration | None = None
        self._order_generator = torch.Generator().manual_seed(config.order_seed)
        self._build_metrics()

    # ------------------------------------------------------------------------------------------ metrics
    def _build_metrics(self) -> None:
        # Module attributes: Lightning moves them to the device and, logged as Metric objects, syncs them
        # across processes and resets them at epoch end.
        self.val_accuracy = MeanMetric()
        self.val_nll = MeanMetric()
        self.val_ece = BinaryCalibrationError(n_bins=self.config.calibration_bins, norm="l1")
        self.val_auroc = BinaryAUROC()
        self.val_margins = CatMetric()
        self.val_length_corr = PearsonCorrCoef()
        self.val_length_accuracy = nn.ModuleDict({name: MeanMetric() for name in LENGTH_BUCKETS})
        # Per-source metrics are created for the sources known at setup (from the validation set) so every
        # process holds the same metrics; one created later (no datamodule) is fine in a single process.
        # Keyed by a digest of the source name: a module key cannot hold a dot, and a file name often does.
        self.val_source_accuracy = nn.ModuleDict()
        self.source_names: dict[str, str] = {}  # module key -> source name (as logged)

    @staticmethod
    def source_key(name: str) -> str:
        return "source_" + hashlib.sha256(name.encode()).hexdigest()[:16]

    def register_sources(self, sources: Iterable[str]) -> None:
        for name in sorted(set(sources)):
            key = self.source_key(name)
            if key not in self.val_source_accuracy:
                self.val_source_accuracy[key] = MeanMetric().to(self.device)
                self.source_names[key] = name

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is None or stage not in ("fit", "validate"):
            return
        datamodule.setup(stage)
        self.register_split_sources(datamodule, "val")

    def register_split_sources(self, datamodule, split: str) -> None:
        """Create the per-source accuracy metrics of every pair in ``datamodule.datasets[split]`` (packed rows
        included) up front: a metric first created during validation would have to sync across ranks."""
        items = getattr(datamodule, "datasets", {}).get(split, [])
        pairs = [p for row in items for p in (row if isinstance(row, list) else [row])]
        self.register_sources(self.pair_source(p.source, p.meta or {}) for p in pairs
                              if hasattr(p, "meta") and hasattr(p, "chosen"))

    # --------------------------------------------------------------------------------------------- hooks
    def score(self, batch: dict) -> Tensor:
        """Rewards of every completion of the batch in ONE forward pass.

        Returns ``(2B,)`` for pairs (chosen ``[0, B)``, rejected ``[B, 2B)``, padded, packed or prefix-shared
        alike) and ``(N,)`` for rankings.
        """
        if is_shared(batch) and not can_share(self.model.backbone, batch["input_ids"].shape[1]):
            batch = unshare_batch(batch)
        if is_shared(batch):  # prefix-shared: one row per pair or ranking, read at each sequence's last token
            if self.config.compile:
                batch = pad_shared_to_multiple(batch, self.config.compile_pad_multiple)
            hidden = self.model.hidden_states(**shared_inputs(self.model.backbone, batch))  # (G, L, H)
            return self.model.head(gather_last(hidden, batch["gather_rows"], batch["gather_cols"], batch["lengths"]))
        if "chosen_end" in batch:  # packed: read each sequence's last token
            hidden = self.model.hidden_states(attention_mask=None, **model_inputs(batch))  # (R, L, H)
            ends = torch.cat([batch["chosen_end"], batch["rejected_end"]])  # (2B, 2)
            return self.model.head(hidden[ends[:, 0], ends[:, 1]])
        input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
        if self.config.compile:
            input_ids, attention_mask = pad_to_multiple(input_ids, attention_mask, self.config.compile_pad_multiple)
        return self.model.score(input_ids, attention_mask)

    def pair_source(self, source: str, meta: dict) -> str:
        """The group a pair's accuracy is reported under: ``meta["source"]``, else the toy task kind
        (``meta["task"]["kind"]``), else the record's source (usually its file)."""
        if meta.get("source"):
            return str(meta["source"])
        task = meta.get("task")
        if isinstance(task, dict) and task.get("kind"):
            return str(task["kind"])
        return source or "unknown"

    def pair_sources(self, batch: dict) -> list[str] | None:
        if "sources" not in batch:
            return None
        return [self.pair_source(s, m) for s, m in zip(batch["sources"], batch["meta"], strict=True)]

    def as_pairs(self, rewards: Tensor, batch: dict) -> PairView:
        """The batch's rewards as pairs (see :class:`PairView`); rewards keep their graph."""
        lengths = completion_lengths(batch)
        if is_ranking(batch):
            first, second, target = ranking_pairs(batch["ranks"], batch["group"])
            return PairView(
                rewards[first], rewards[second], target.to(rewards.dtype), lengths[first], lengths[second], None
            )
        b = batch["pair_targets"].shape[0]
        return PairView(
            rewards[:b],
            rewards[b:],
            batch["pair_targets"].to(rewards.dtype),
            lengths[:b],
            lengths[b:],
            self.pair_sources(batch),
        )

    def compute_loss(self, rewards: Tensor, batch: dict) -> RewardLoss:
        """Bradley–Terry on pairs (``pair_targets`` as soft labels) or per-prompt-averaged ranking loss.

        Args:
            rewards: ``(2B,)`` or ``(N,)`` from :meth:`score`.
        """
        pairs = self.as_pairs(rewards, batch)
        if is_ranking(batch):
            loss = ranking_loss(rewards, batch["ranks"], batch["group"])
        elif self.config.ties == "drop":
            keep = pairs.target != 0.5
            # A batch of ties only contributes 0 (with a graph, so every process runs the same backward).
            loss = (
                bradley_terry_loss(pairs.chosen[keep], pairs.rejected[keep], pairs.target[keep])
                if keep.any()
                else rewards.sum() * 0.0
            )
        else:
            loss = bradley_terry_loss(pairs.chosen, pairs.rejected, pairs.target)
        if self.config.center_coef > 0:
            loss = loss + self.config.center_coef * rewards.pow(2).mean()
        return RewardLoss(loss, pairs._replace(chosen=pairs.chosen.detach(), rejected=pairs.rejected.detach()))

    # ---------------------------------------------------------------------------------------------- steps
    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        # 1. One forward for chosen and rejected together (the concatenated 2B batch, or N ranked rows).
        rewards = self.score(batch)
        # 2.-3. Split into pairs and compute the loss (BT with soft labels for ties, or the ranking loss).
        out = self.compute_loss(rewards, batch)
        # Stop before the optimiser step on a NaN / inf loss (no poisoned weights are kept or exported).
        check_finite(out.loss, "training loss", "reward", self.global_step, self.config.lr)
        # 4. Log: loss, accuracy on non-tie pairs, mean margin (preferred minus other).
        margin = out.pairs.chosen - out.pairs.rejected
        labelled = out.pairs.target != 0.5
        n = margin.shape[0]
        self.log("train/loss", out.loss, prog_bar=True, batch_size=n)
        if labelled.any():
            self.log("train/accuracy", pairwise_accuracy(margin[labelled]).mean(), batch_size=int(labelled.sum()))
        self.log("train/margin", margin.mean(), batch_size=n)
        return out.loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        # 1. Score (one forward), 2. view as pairs, 3. update every metric, 4. log the metric objects
        # (Lightning computes them, synced across processes, at epoch end).
        rewards = self.score(batch)
        # NaN scores would be dropped by the metrics (an empty margin list), never reported: stop, naming them.
        check_finite(rewards, "validation rewards", "reward", self.global_step, self.config.lr,
                     stopped="before computing metrics", across_ranks=False)  # rank 0 may validate alone
        out = self.compute_loss(rewards, batch)
        if getattr(self, "held_out", None) is not None:  # evaluate_held_out: the same pass gives calibration, CIs
            self.held_out.append((rewards.detach().float().cpu(), PairView(*(
                t.detach().float().cpu() if isinstance(t, Tensor) else t for t in out.pairs))))
        self.update_metrics(rewards, batch, out.pairs)
        self.log("val/loss", out.loss, batch_size=out.pairs.chosen.shape[0], sync_dist=True)
        self.log_metrics()

    def update_metrics(self, rewards: Tensor, batch: dict, pairs: PairView) -> None:
        """Update the validation metrics from one batch (``rewards`` as from :meth:`score`)."""
        rewards = rewards.detach().float()
        margin = (pairs.chosen - pairs.rejected).float()
        target = pairs.target.float()
        self.val_nll.update(F.binary_cross_entropy_with_logits(margin, target, reduction="none"))
        self.val_margins.update(margin)
        self.val_length_corr.update(rewards, completion_lengths(batch).to(rewards.dtype))
        labelled = target != 0.5
        if not labelled.any():
            return
        margin, correct = margin[labelled], pairwise_accuracy(margin[labelled])
        self.val_accuracy.update(correct)
        # A chosen-first layout has only positives (target 1), for which AUROC is undefined and ECE only
        # measures over-/under-confidence one way; show each pair in a random A/B order from a fixed
        # generator, so both classes appear and the figures are reproducible.
        flip = torch.rand(margin.shape[0], generator=self._order_generator).lt(0.5).to(margin.device)
        shown = torch.where(flip, -margin, margin)
        first_wins = (~flip).long()
        self.val_ece.update(torch.sigmoid(shown), first_wins)
        self.val_auroc.update(torch.sigmoid(shown), first_wins)
        diff = (pairs.chosen_length - pairs.rejected_length)[labelled]
        buckets = {
            "chosen_longer": diff > self.config.similar_length,
            "similar": diff.abs() <= self.config.similar_length,
            "chosen_shorter": diff < -self.config.similar_length,
        }
        for name, in_bucket in buckets.items():
            if in_bucket.any():
                self.val_length_accuracy[name].update(correct[in_bucket])
        if pairs.sources is not None:
            sources = [s for s, keep in zip(pairs.sources, labelled.tolist(), strict=True) if keep]
            self.register_sources(sources)
            for name in set(sources):
                mask = torch.tensor([s == name for s in sources], device=correct.device)
                self.val_source_accuracy[self.source_key(name)].update(correct[mask])

    def log_metrics(self) -> None:
        kw = {"on_step": False, "on_epoch": True}
        self.log("val/accuracy", self.val_accuracy, prog_bar=True, **kw)
        self.log("val/nll", self.val_nll, **kw)
        self.log("val/ece", self.val_ece, **kw)
        self.log("val/auroc", self.val_auroc, **kw)
        self.log("val/reward_length_corr", self.val_length_corr, **kw)

    def on_validation_epoch_start(self) -> None:
        # The same flips every epoch: epoch-to-epoch changes of ECE / AUROC are the model's, not the order's.
        self._order_generator = torch.Generator().manual_seed(self.config.order_seed)

    def on_validation_epoch_end(self) -> None:
        # Accuracy per length bucket and per source: a bucket no pair fell in (on any process) has no accuracy, and
        # is not logged (not a NaN); the value is synced, so every process skips alike.
        named = {f"val/accuracy_{name}": m for name, m in self.val_length_accuracy.items()} | {
            f"val/accuracy_source/{self.source_names[key]}": m for key, m in self.val_source_accuracy.items()}
        for name, metric in named.items():
            if metric.update_count == 0:  # no validation batch reached it (all pairs ties, or a new source)
                metric.update(torch.zeros(0, device=self.device))
            value = metric.compute()
            metric.reset()
            if not torch.isnan(value):  # the same value on every process: sync_dist only quiets Lightning's warning
                self.log(name, value, sync_dist=True)
        # Margin distribution: CatMetric gathers every process's margins; summarised here, then reset.
        if self.val_margins.update_count == 0:
            return
        margins = self.val_margins.compute().flatten().float()
        self.val_margins.reset()
        stats = margin_summary(margins)
        for name, value in stats.items():
            self.log(f"val/margin_{name}", value)  # the same on every process (CatMetric gathered them)
        experiment = getattr(self.logger, "experiment", None) if self.logger is not None else None
        if hasattr(experiment, "add_histogram"):  # TensorBoard
            experiment.add_histogram("val/margin", margins.cpu(), self.global_step)
        elif experiment is not None and type(experiment).__module__.startswith("wandb"):
            import wandb

            experiment.log({"val/margin_hist": wandb.Histogram(margins.cpu().numpy())}, commit=False)

    def on_train_end(self) -> None:
        # the last optimiser step's loss was finite, its update may not have been: checked before any export
        check_finite_weights(self.model, "reward", self.global_step, self.config.lr)

    # ------------------------------------------------------------------------------------------ optimiser
    def configure_optimizers(self):
        steps = int(self.trainer.estimated_stepping_batches) if self._trainer is not None else 1
        return self.config.optimizers(self.model, steps)

    # --------------------------------------------------------------------------------------------- export
    def finish(self, datamodule, out_dir: Path, trained) -> dict:
        """Held-out test metrics and the calibration PPO normalises rewards with (:mod:`lrlhf.modules.reward_eval`)."""
        from lrlhf.modules.reward_eval import evaluate_held_out

        return evaluate_held_out(self, datamodule, out_dir, trained)

    def export_stage(self, folder: Path) -> dict[str, Path | None]:
        return {"export": self.export(folder / "model"), "adapter": None}

    def export(self, out_dir: str | Path) -> Path:
        """Write a stand-alone reward model: merged backbone (``save_pretrained``), head, tokenizer, calibration.

        Files: the transformers checkpoint (``config.json``, ``model.safetensors``), ``reward_head.safetensors``,
        the tokenizer when known, ``reward_calibration.json`` when :func:`compute_calibration` has run.
        Load with :func:`load_reward_model`. A LoRA reward model also writes its adapter alone to
        ``adapter/`` (with its base's name), for :func:`attach_reward_adapter`: PPO can then score with a
        ``reward`` adapter on the policy's own base instead of a second copy of the weights.
        """
        from safetensors.torch import save_file

        out_dir = Path(out_dir)
        export_merged(self.model.backbone, out_dir, tokenizer=self.tokenizer, adapter=None)
        head = {k: v.detach().cpu().contiguous() for k, v in self.model.head.state_dict().items()}
        save_file(head, out_dir / HEAD_FILE)
        if self.config.lora is not None:
            export_adapter(self.model.backbone, out_dir / ADAPTER_DIR, ADAPTER_NAME)
        if self.calibration is not None:
            self.calibration.save(out_dir)
        return out_dir


__all__ = [  # the frozen reward artefact's names (lrlhf.models.reward) stay importable from here
    "ADAPTER_DIR", "ADAPTER_NAME", "CALIBRATION_FILE", "HEAD_FILE", "PairView", "RewardCalibration", "RewardConfig",
    "RewardLoss", "RewardModule", "attach_reward_adapter", "compute_calibration", "load_calibration",
    "load_reward_model", "margin_summary", "pad_to_multiple", "pairwise_accuracy", "ranking_pairs",
]
