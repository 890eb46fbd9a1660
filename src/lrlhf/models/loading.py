"""Loading causal LMs and tokenizers: hub id or local path, GGUF files, 4-bit / 8-bit quantisation."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
QUANTIZATIONS = (None, "4bit", "8bit")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
KEY = "model.name_or_path"  # the key as the user types it; errors name it
FOLDER_NEEDS = (
    "a model folder holds config.json, the weights (*.safetensors or pytorch_model.bin) and the tokenizer files "
    "(tokenizer.json, tokenizer_config.json), as save_pretrained writes them; or a .gguf file named by model.gguf_file"
)


class ModelSourceError(ValueError):
    """``model.name_or_path`` / ``model.gguf_file`` name nothing loadable: the message names the key, the value
    and what is missing."""


@dataclass
class ModelConfig:
    """Where a causal LM comes from and how to load it."""

    name_or_path: str
    """A hub id (where the network allows) or a local folder written by ``save_pretrained``. A folder
    holding a peft adapter (``adapter_config.json``) is loaded onto its base and merged (see
    :func:`load_causal_lm`). Anything that exists on disk, is absolute, starts with ``.`` or ``~``, is not a
    valid hub id, or has a parent folder that exists is a folder, and a missing one is an error (checked when
    loading: a needed stage writes its folder later)."""
    gguf_file: str | None = None
    """File name of a GGUF checkpoint inside ``name_or_path`` (dequantised to ``dtype`` on load)."""
    dtype: str = "float32"
    """Weights dtype: one of ``float32``, ``bfloat16``, ``float16``."""
    attn_implementation: str | None = None
    """``eager``, ``sdpa``, ``flash_attention_2``...; None lets transformers choose."""
    quantization: str | None = None
    """None, ``4bit`` (NF4, double quantisation; QLoRA) or ``8bit``, through bitsandbytes."""
    trust_remote_code: bool = False
    """Run code shipped with the checkpoint. Off unless you trust its source."""
    revision: str | None = None
    """Hub revision (branch, tag or commit)."""

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype={self.dtype!r} is not supported; choose one of {sorted(DTYPES)}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"model.quantization={self.quantization!r}; choose one of {QUANTIZATIONS}")
        if self.quantization and self.gguf_file:
            raise ValueError("model.quantization and model.gguf_file cannot be combined: GGUF is dequantised on load")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


def _quantization_config(cfg: ModelConfig):
    from transformers import BitsAndBytesConfig

    if cfg.quantization == "4bit":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=cfg.torch_dtype,
        )
    return BitsAndBytesConfig(load_in_8bit=True)


def _adapter_base(path: str) -> str | None:
    config = Path(path) / "adapter_config.json"
    if not config.is_file():
        return None
    base = json.loads(config.read_text()).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{config}: a LoRA adapter without base_model_name_or_path cannot be loaded on its own")
    return base


def _is_hub_id(name: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _local_folder(name: str, key: str = KEY) -> Path | None:
    """The folder ``name`` means, or None when it is a hub id; an error when it means a folder that is not there."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        hint = (f"; for a GGUF file pass its folder as {KEY} and model.gguf_file={path.name}"
                if path.suffix == ".gguf" else "")
        raise ModelSourceError(f"{key}={name!r}: a file, not a folder{hint}")
    in_existing_folder = path.parent.name != "" and path.parent.is_dir()  # "runs/sft" where runs/ exists
    if path.is_absolute() or name.startswith((".", "~")) or in_existing_folder or not _is_hub_id(name):
        where = "" if Path(name).is_absolute() else f" ({path.resolve()})"  # relative to the working directory
        raise ModelSourceError(f"{key}={name!r}: no such folder{where}")
    return None


def _check_folder(folder: Path, cfg: ModelConfig, what: str) -> None:
    """``folder`` holds what loading ``what`` needs: ``config.json`` (or a peft adapter; for a tokenizer, its files
    will do), or ``cfg.gguf_file``."""
    ggufs = sorted(p.name for p in folder.glob("*.gguf"))
    if cfg.gguf_file:
        if not (folder / cfg.gguf_file).is_file():
            holds = f"it holds {', '.join(ggufs)}" if ggufs else "it holds no .gguf file"
            raise ModelSourceError(f"model.gguf_file={cfg.gguf_file!r}: no such file in {folder} ({holds})")
        return
    enough = ("config.json", "adapter_config.json") + (TOKENIZER_FILES if what == "tokenizer" else ())
    if any((folder / file).is_file() for file in enough):
        return
    names = sorted(p.name for p in folder.iterdir())
    holds = "it is empty" if not names else "it holds " + ", ".join(names[:8]) + (
        f" and {len(names) - 8} more" if len(names) > 8 else "")
    hint = f"; it holds a GGUF file: set model.gguf_file={ggufs[0]}" if ggufs else ""
    raise ModelSourceError(f"{KEY}={cfg.name_or_path!r}: not a model folder, it has no config.json ({holds}); "
                           f"{FOLDER_NEEDS}{hint}")


def _offline() -> bool:
    """huggingface_hub reads these variables once, at import; a later change counts too."""
    from huggingface_hub import constants

    flags = (os.environ.get(name, "").upper() for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return bool(constants.HF_HUB_OFFLINE) or any(flag in {"1", "ON", "YES", "TRUE"} for flag in flags)


@dataclass(frozen=True)
class _Source:
    """What to load from: ``name`` as given under ``key``, and ``local`` (its folder) unless it is a hub id."""

    name: str
    key: str
    local: Path | None

    @property
    def path(self) -> str:
        return str(self.local or self.name)

    def error(self, what: str, err: Exception) -> ModelSourceError:
        """``err`` from transformers, restated with the key, the value and what to do."""
        said = " ".join(str(err).split()) or type(err).__name__
        said = said if len(said) <= 300 else said[:299] + "…"
        start = f"{self.key}={self.name!r}"
        if self.local is not None:
            if what == "tokenizer" and not any((self.local / file).is_file() for file in TOKENIZER_FILES):
                said = f"it has none of {', '.join(TOKENIZER_FILES)}"  # transformers: "install sentencepiece"
            return ModelSourceError(f"{start}: cannot load the {what} from this folder ({said}); {FOLDER_NEEDS}")
        if _offline():
            return ModelSourceError(f"{start}: not a local folder, so a hub id, and not in the local cache while the "
                                    "hub is offline (HF_HUB_OFFLINE=1): download it once with network access, or "
                                    f"pass a local folder ({said})")
        return ModelSourceError(f"{start}: not a local folder, so a hub id, and the hub could not give the {what} "
                                f"({said})")


def _sources(cfg: ModelConfig, what: str = "model") -> tuple[_Source, _Source | None]:
    """``cfg.name_or_path`` and, for a peft adapter folder, its base; checked for what loading ``what`` needs."""
    own = _Source(cfg.name_or_path, KEY, _local_folder(cfg.name_or_path))
    if own.local is None:
        return own, None
    _check_folder(own.local, cfg, what)
    base = _adapter_base(own.path)
    if base is None:
        return own, None
    key = f"{own.local / 'adapter_config.json'} base_model_name_or_path"
    base_folder = _local_folder(base, key)
    if base_folder is not None and not (base_folder / "config.json").is_file():
        raise ModelSourceError(f"{key}={base!r}: not a model folder, it has no config.json; {FOLDER_NEEDS}")
    return own, _Source(base, key, base_folder)


def check_model_source(cfg: ModelConfig) -> None:
    """Raise :class:`ModelSourceError` now when ``cfg`` names a missing folder or one without a model, as loading
    would (no file is read but the folder listing and an adapter's config). Only for a folder that should already
    exist: a needed stage writes its own later. A hub id passes (whether it is reachable shows at loading)."""
    _sources(cfg)


def load_causal_lm(cfg: ModelConfig):
    """Load a causal LM in training mode.

    If ``cfg.name_or_path`` is a LoRA adapter folder, its base is loaded and the adapter **merged**: the
    PPO reference is "the base with every adapter disabled", so an SFT model that is still an adapter would
    otherwise vanish from the reference (TRL #495) and the KL would be measured against the pre-SFT model.
    """
    from transformers import AutoModelForCausalLM

    own, base = _sources(cfg)
    kwargs = dict(
        dtype=cfg.torch_dtype,
        trust_remote_code=cfg.trust_remote_code,
        revision=cfg.revision,
    )
    if cfg.attn_implementation:
        kwargs["attn_implementation"] = cfg.attn_implementation
    if cfg.gguf_file:
        kwargs["gguf_file"] = cfg.gguf_file
    if cfg.quantization:
        if base is not None:
            raise ValueError("a LoRA adapter as the starting model must be merged in full precision first")
        kwargs["quantization_config"] = _quantization_config(cfg)
    source = base or own
    try:
        model = AutoModelForCausalLM.from_pretrained(source.path, **kwargs)
    except OSError as err:  # missing files, or a hub id not reachable
        raise source.error("model", err) from err
    if base is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, own.path).merge_and_unload()
    model.train()  # transformers returns eval mode
    return model


def load_tokenizer(cfg: ModelConfig):
    """The tokenizer saved with the model (or with the adapter's base), with a pad token guaranteed."""
    from transformers import AutoTokenizer

    own, base = _sources(cfg, "tokenizer")
    source = base if base is not None and not (own.local / "tokenizer_config.json").is_file() else own
    kwargs = dict(trust_remote_code=cfg.trust_remote_code, revision=cfg.revision)
    if cfg.gguf_file:
        kwargs["gguf_file"] = cfg.gguf_file
    elif source.local is not None and not any((source.local / file).is_file() for file in TOKENIZER_FILES):
        # refused here: transformers 5.0 builds a default tokenizer from config.json alone, later releases fail
        raise source.error("tokenizer", FileNotFoundError("no tokenizer files"))
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.path, **kwargs)
    except (OSError, ValueError) as err:  # no tokenizer files ("install sentencepiece or tiktoken"), or no hub
        raise source.error("tokenizer", err) from err
    if tokenizer.pad_token_id is None:
        # Padding positions are always masked, so reusing EOS is safe; masks never come from the pad id.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
