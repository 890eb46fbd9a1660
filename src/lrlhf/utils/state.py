"""Run state that checkpoints need beyond weights: RNG states, frozen-weight identity, library versions.

Everything returned here is made of tensors, numbers, strings, lists and dicts only, so a checkpoint holding it
loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import hashlib
import platform
import random
from collections.abc import Iterable
from importlib import metadata

import numpy as np
import torch
from torch import nn

LIBRARIES = ("lrlhf", "torch", "lightning", "transformers", "peft", "numpy")


# ------------------------------------------------------------------------------------------------- RNG
def rng_state() -> dict:
    """The python, numpy, torch CPU and (where present) CUDA RNG states, weights-only serialisable."""
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)  # noqa: NPY002 (the global state is what we save)
    state = {
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np.asarray(np_state["state"]["key"], dtype=np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` returned (CUDA only when both the state and a device are there)."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state({  # noqa: NPY002
        "bit_generator": npy["bit_generator"],
        "state": {"key": npy["key"].numpy().astype(np.uint32), "pos": npy["pos"]},
        "has_gauss": npy["has_gauss"],
        "gauss": npy["gauss"],
    })
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ------------------------------------------------------------------------------------- frozen weights
def trained_parameter_ids(optimizers: Iterable[torch.optim.Optimizer]) -> set[int]:
    """``id`` of every parameter some optimiser updates: the definition of "trained" used for checkpoints."""
    return {id(p) for opt in optimizers for group in opt.param_groups for p in group["params"]}


def frozen_keys(module: nn.Module, trained: set[int]) -> list[str]:
    """State-dict keys of ``module`` that are parameters no optimiser updates (buffers are always kept)."""
    return [k for k, v in module.state_dict(keep_vars=True).items()
            if isinstance(v, nn.Parameter) and id(v) not in trained]


def tensor_digest(tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """SHA-256 over the names, dtypes, shapes and raw bytes of ``(name, tensor)`` pairs, in the given order."""
    h = hashlib.sha256()
    for name, t in tensors:
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def frozen_identity(module: nn.Module, keys: Iterable[str]) -> dict[str, dict]:
    """``{group: {"sha256", "tensors", "numel"}}`` of the frozen ``keys``, grouped by their first name part
    (``model`` = the base under the adapters, ``reward_model``, ...), so a mismatch can name the part."""
    state = module.state_dict()
    groups: dict[str, list[str]] = {}
    for key in sorted(keys):
        groups.setdefault(key.split(".", 1)[0], []).append(key)
    return {
        group: {"sha256": tensor_digest((k, state[k]) for k in names), "tensors": len(names),
                "numel": sum(state[k].numel() for k in names)}
        for group, names in groups.items()
    }


# ------------------------------------------------------------------------------------------- versions
def library_versions() -> dict[str, str]:
    """Installed versions of the libraries a bitwise resume depends on, and python's."""
    out = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def flatten(config, prefix: str = "") -> dict[str, object]:
    """``{"a.b.c": leaf}`` of nested dicts (lists and tuples are leaves, tuples compared as lists)."""
    if isinstance(config, dict):
        out: dict[str, object] = {}
        for key, value in config.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: list(config) if isinstance(config, tuple) else config}
