"""A reward-model ensemble as one frozen artefact (``recipe=rm_ensemble`` writes it; PPO, RLOO, GRPO and the
evaluation read it like a single reward model).

The folder holds ``reward_ensemble.json``: the member folders (each a :meth:`RewardModule.export` folder, named
relative to the ensemble folder, so a stage folder moves as a whole), the default combination rule
(:mod:`lrlhf.functional.ensemble_rules`, by ``_target_``) and an identity ``reward_calibration.json``: every member is
normalised by its own calibration inside the ensemble, so the combined score needs none on top.
:func:`lrlhf.models.load_reward_model` on such a folder returns a :class:`RewardEnsembleModel`.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from lrlhf.functional.ensemble_rules import EnsembleCombine, EnsembleMean, disagreement
from lrlhf.utils.io import file_sha256

ENSEMBLE_FILE = "reward_ensemble.json"


def is_ensemble(folder: str | Path) -> bool:
    return (Path(folder) / ENSEMBLE_FILE).is_file()


def combine_spec(rule: EnsembleCombine) -> dict:
    """``{"_target_": ..., **settings}`` of a rule (what ``reward_ensemble.json`` and the logs record)."""
    return {"_target_": f"{type(rule).__module__}.{type(rule).__qualname__}", **vars(rule)}


def combine_from_spec(spec: dict, where: str) -> EnsembleCombine:
    target = spec.get("_target_") if isinstance(spec, dict) else None
    if not isinstance(target, str) or "." not in target:
        raise ValueError(f"{where}: the combination rule needs a _target_ (e.g. lrlhf.functional.MeanMinusStd)")
    module, _, name = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{where}: cannot import the combination rule {target!r}: {err}") from None
    try:
        rule = cls(**{k: v for k, v in spec.items() if k != "_target_"})
    except TypeError as err:
        raise ValueError(f"{where}: {target}: {err}") from None
    if not isinstance(rule, EnsembleCombine):
        raise ValueError(f"{where}: {target} is not an EnsembleCombine")
    return rule


class RewardEnsembleModel(nn.Module):
    """N frozen reward models scoring the same token ids (one tokenizer), each normalised by its own calibration.

    :meth:`member_scores` gives the ``(N, B)`` calibrated scores; :meth:`score` combines them with ``combine``;
    :meth:`score_and_disagreement` returns the per-sample disagreement (the members' std) with the combined score.
    """

    def __init__(self, members: Sequence[nn.Module], calibrations: Sequence, combine: EnsembleCombine | None = None):
        super().__init__()
        if len(members) < 1 or len(members) != len(calibrations):
            raise ValueError(f"an ensemble needs members and one calibration each, got {len(members)} members and "
                             f"{len(calibrations)} calibrations")
        self.members = nn.ModuleList(members)
        self.calibrations = list(calibrations)
        self.combine = combine if combine is not None else EnsembleMean()
        index = getattr(self.combine, "index", None)  # SingleMember: a member that exists
        if index is not None and not 0 <= index < len(members):
            raise ValueError(f"{self.combine.describe()}: the ensemble has {len(members)} members")

    def __len__(self) -> int:
        return len(self.members)

    def member_scores(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """``(N, B)`` calibrated member scores (raw where a member has no calibration)."""
        rows = []
        for member, calibration in zip(self.members, self.calibrations, strict=True):
            raw = member.score(input_ids, attention_mask).float()
            rows.append(calibration.normalise(raw) if calibration is not None else raw)
        return torch.stack(rows)

    def score(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """``(B,)`` the combined score."""
        return self.combine(self.member_scores(input_ids, attention_mask))

    def score_and_disagreement(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        """``(B,)`` the combined score and ``(B,)`` the members' disagreement (their std, detached)."""
        scores = self.member_scores(input_ids, attention_mask)
        spread = disagreement(scores).detach()
        return self.combine(scores), spread


def _file_digest(path: Path) -> str | None:
    return file_sha256(path) if path.is_file() else None


def write_ensemble(folder: str | Path, members: Sequence[str | Path], combine: EnsembleCombine | None = None) -> Path:
    """Write ``reward_ensemble.json`` (members relative to ``folder``) and an identity calibration into ``folder``.

    Every member must be a reward-model folder; members with different tokenizers are refused (they would read
    the same ids as different texts)."""
    from lrlhf.models.reward import CALIBRATION_FILE, HEAD_FILE, RewardCalibration
    from lrlhf.utils.io import atomic_write_text

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if not members:
        raise ValueError(f"{folder}: an ensemble needs at least one member")
    rel, digests = [], set()
    for member in members:
        member = Path(member)
        if not (member / HEAD_FILE).is_file():
            raise FileNotFoundError(f"{member}: not a reward-model folder (no {HEAD_FILE})")
        if not (member / CALIBRATION_FILE).is_file():
            raise FileNotFoundError(f"{member}: the member has no {CALIBRATION_FILE}: its scores cannot share a scale")
        digests.add(_file_digest(member / "tokenizer.json"))
        rel.append(str(Path(_relative(member.resolve(), folder.resolve()))))
    if len(digests) > 1:
        raise ValueError(f"{folder}: the members' tokenizers differ ({', '.join(map(str, members))})")
    spec = {"format": 1, "members": rel, "combine": combine_spec(combine or EnsembleMean())}
    atomic_write_text(folder / ENSEMBLE_FILE, json.dumps(spec, indent=2) + "\n")
    RewardCalibration(0.0, 1.0, 0, "identity: each member is normalised by its own calibration").save(folder)
    return folder


def _relative(path: Path, start: Path) -> str:
    import os

    return os.path.relpath(path, start)


def member_folders(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    spec = json.loads((folder / ENSEMBLE_FILE).read_text())
    return [(folder / m).resolve() for m in spec["members"]]


def load_reward_ensemble(folder: str | Path, combine: EnsembleCombine | None = None,
                         dtype: str = "float32") -> RewardEnsembleModel:
    """The :class:`RewardEnsembleModel` of ``folder`` in eval mode; ``combine`` replaces the folder's default rule."""
    from lrlhf.models.reward import load_calibration, load_reward_model

    folder = Path(folder)
    path = folder / ENSEMBLE_FILE
    try:
        spec = json.loads(path.read_text())
        members = spec["members"]
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"{path}: not a reward ensemble ({err})") from None
    rule = combine if combine is not None else combine_from_spec(spec.get("combine") or {}, str(path))
    models, calibrations = [], []
    for member in members:
        member_dir = (folder / member).resolve()
        if not member_dir.is_dir():
            raise FileNotFoundError(f"{path}: member {member!r} is missing ({member_dir})")
        models.append(load_reward_model(member_dir, dtype=dtype))
        calibrations.append(load_calibration(member_dir))
    return RewardEnsembleModel(models, calibrations, rule).eval()


__all__ = ["ENSEMBLE_FILE", "RewardEnsembleModel", "combine_from_spec", "combine_spec", "is_ensemble",
           "load_reward_ensemble", "member_folders", "write_ensemble"]
