"""FSDP pieces for ``strategy=fsdp``: the auto-wrap policy resolved from the model, a CPU (gloo) FSDP strategy
for tests, and generation on an FSDP-wrapped model.

On GPU ``configs/strategy/fsdp.yaml`` is Lightning's own ``FSDPStrategy`` with :class:`DecoderLayerWrapPolicy`.
:class:`CPUFSDPStrategy` only exists because Lightning refuses ``strategy="fsdp"`` without a GPU; it runs the
same FSDP1 wrapping on CPU with gloo (``docs/distributed.md``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.fsdp.wrap import ModuleWrapPolicy, _Policy


def decoder_layer_classes(model: nn.Module, names: Sequence[str] | None = None) -> set[type[nn.Module]]:
    """The transformer-block classes of ``model``: those named in ``names``, or else in the
    ``_no_split_modules`` of the transformers models inside it (e.g. ``{LlamaDecoderLayer}``).

    Raises:
        ValueError: no such class among ``model``'s submodules (pass ``names``).
    """
    wanted = set(names or ())
    if not wanted:
        for module in model.modules():
            wanted.update(getattr(module, "_no_split_modules", None) or ())
    classes = {type(m) for m in model.modules() if type(m).__name__ in wanted}
    if not classes:
        raise ValueError(f"no decoder layer class {sorted(wanted)} found in the model; pass layer_names=[...]")
    return classes


class DecoderLayerWrapPolicy(_Policy):
    """FSDP auto-wrap (or activation-checkpointing) policy: one FSDP unit per transformer block, the block class
    read from the model being wrapped, so one config serves every architecture.

    Args:
        layer_names: class names of the blocks; None = the models' ``_no_split_modules``.
    """

    def __init__(self, layer_names: Sequence[str] | None = None):
        super().__init__()
        self.layer_names = list(layer_names) if layer_names else None

    def _run_policy(self, root_module: nn.Module, ignored_modules: set[nn.Module], root_kwargs: dict) -> dict:
        policy = ModuleWrapPolicy(decoder_layer_classes(root_module, self.layer_names))
        return policy._run_policy(root_module, ignored_modules, root_kwargs)


class CPUFSDPStrategy(FSDPStrategy):
    """Lightning's ``FSDPStrategy`` on CPU (gloo), for tests: the model is wrapped with ``device_id=cpu``.

    Defaults (each overridable): one unit per decoder layer, ``use_orig_params=True`` (LoRA mixes frozen and
    trainable parameters in one unit), ``state_dict_type="sharded"`` (the full state dict segfaulted on rank 0
    on CPU with torch 2.13).
    """

    strategy_name = "fsdp_cpu"

    def __init__(self, **kwargs):
        kwargs.setdefault("auto_wrap_policy", DecoderLayerWrapPolicy())
        kwargs.setdefault("use_orig_params", True)
        kwargs.setdefault("state_dict_type", "sharded")
        super().__init__(**kwargs)

    def _setup_model(self, model: nn.Module) -> nn.Module:
        if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            return super()._setup_model(model)
        # Lightning passes ``device_id=root_device.index``: None for a CPU device, which FSDP reads as "CUDA".
        from lightning.pytorch.strategies.fsdp import _setup_activation_checkpointing

        wrapped = FullyShardedDataParallel(
            module=model, cpu_offload=self.cpu_offload, mixed_precision=self.mixed_precision_config,
            sharding_strategy=self.sharding_strategy, device_id=torch.device("cpu"), **self.kwargs,
        )
        _setup_activation_checkpointing(wrapped, self._activation_checkpointing_kwargs)
        return wrapped


def is_fsdp_wrapped(module: nn.Module) -> bool:
    """True when an FSDP1 unit holds (some of) ``module``'s parameters."""
    return any(isinstance(m, FullyShardedDataParallel) for m in module.modules())


@contextlib.contextmanager
def full_params_for_generation(root: nn.Module | None) -> Iterator[None]:
    """Unshard the parameters held by FSDP1's root unit ``root`` while the block runs, so ``model.generate``
    on the inner module sees 2-D weights ("'weight' must be 2-D" otherwise). A no-op when ``root`` is None or
    not an FSDP unit, or inside the root's forward (Lightning runs ``training_step`` there: the root's
    parameters are unsharded already, and FSDP forbids ``summon_full_params`` then).

    ``recurse=False``: the nested units (the decoder layers) unshard themselves in their own forward, so the
    memory peak is the root's parameters (embeddings, head, norms) plus one layer. ``writeback=False``: nothing
    is trained inside.
    """
    from torch.distributed.fsdp._common_utils import TrainingState

    if not isinstance(root, FullyShardedDataParallel) or root.training_state != TrainingState.IDLE:
        yield
        return
    with FullyShardedDataParallel.summon_full_params(root, writeback=False, recurse=False):
        yield


__all__ = ["CPUFSDPStrategy", "DecoderLayerWrapPolicy", "decoder_layer_classes", "full_params_for_generation",
           "is_fsdp_wrapped"]
