"""FSDP pieces for ``strategy=fsdp`` / ``strategy=fsdp2``: the auto-wrap policy resolved from the model, a CPU
(gloo) FSDP1 strategy for tests, generation on an FSDP1-wrapped model, and FSDP2 (``fully_shard``) applied by
the strategy.

On GPU ``configs/strategy/fsdp.yaml`` is Lightning's own ``FSDPStrategy`` with :class:`DecoderLayerWrapPolicy`.
:class:`CPUFSDPStrategy` only exists because Lightning refuses ``strategy="fsdp"`` without a GPU; it runs the
same FSDP1 wrapping on CPU with gloo (``docs/distributed.md``).

:class:`FSDP2Strategy` is Lightning's ``ModelParallelStrategy`` (data parallel only) that applies
:func:`fully_shard_model` itself, so the LightningModules need no parallelism code. It runs on GPU (NCCL) and on
CPU (gloo) alike. PPO needs it: its manual optimisation runs several forward/backward passes per Trainer batch,
which FSDP1's root unit (wrapped around ``training_step`` by Lightning) refuses.

After ``fit``: :func:`whole_module` gathers a sharded (or replicated) trained module whole on rank 0 for the export
and the evaluations, :func:`restore_sharded_weights` loads a sharded checkpoint folder back into the sharded model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from datetime import timedelta

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
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


def _transformer_bodies(root: nn.Module) -> list[nn.Module]:
    """The transformer bodies inside ``root`` (``LlamaModel`` of a ``LlamaForCausalLM``: embeddings, blocks, final
    norm), each once: the ``base_model_prefix`` module of every transformers model, or the model itself."""
    from transformers import PreTrainedModel

    bodies: dict[int, nn.Module] = {}
    for module in root.modules():
        if isinstance(module, PreTrainedModel):
            body = getattr(module, module.base_model_prefix, None)
            body = body if isinstance(body, nn.Module) else module
            bodies[id(body)] = body
    return list(bodies.values())


def fully_shard_model(root: nn.Module, mesh, layer_names: Sequence[str] | None = None,
                      reshard_after_forward: bool = True, mp_policy=None) -> list[nn.Module]:
    """Apply FSDP2 (``torch.distributed.fsdp.fully_shard``) to every model inside ``root`` (a LightningModule),
    bottom-up, so that every parameter belongs to exactly one unit whose forward runs wherever it is used:

    1. one unit per transformer block (:func:`decoder_layer_classes`);
    2. one unit per transformer body (embeddings, final norm): every path runs through it -- the LM head's
       forward, ``generate``, and the value / reward heads, which call the body directly
       (:func:`lrlhf.models.heads.decoder`). An input embedding tied to an LM head outside the body (SmolLM2,
       small Qwen2) is left out of the sharding (``ignored_params``: replicated on every rank, the tie kept);
       it must be frozen (LoRA), since FSDP2 would not reduce its gradient -- a trainable tied embedding is
       refused (use ``strategy=ddp`` or ``fsdp`` for full fine-tuning of such a model);
    3. one unit per module that still owns parameters of its own: the LM head (untied), LoRA layers outside the
       blocks, the scalar heads. Trainable parameters must all be in units, or their gradients would not be
       reduced across ranks.

    Frozen weights are sharded too (the base under LoRA adapters, a separate reward model). Parameter names do
    not change (unlike FSDP1). Returns the sharded modules in the order they were sharded.

    Args:
        mesh: the data-parallel ``DeviceMesh``.
        layer_names: class names of the blocks; None = the models' ``_no_split_modules``.
        reshard_after_forward: of the blocks (True: ZeRO-3 memory; False: ZeRO-2, no all-gather in backward).
        mp_policy: a ``MixedPrecisionPolicy``; None = the parameters' dtype.
    """
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import DTensor

    kw = {"mesh": mesh, "mp_policy": mp_policy or MixedPrecisionPolicy()}
    sharded: list[nn.Module] = []
    ignored: set[int] = set()  # ids of tied parameters left replicated

    def shard(module: nn.Module, reshard: bool, ignored_params: set[nn.Parameter] | None = None) -> None:
        fully_shard(module, reshard_after_forward=reshard, ignored_params=ignored_params or None, **kw)
        sharded.append(module)

    def plain(module: nn.Module, recurse: bool) -> list[nn.Parameter]:
        return [p for p in module.parameters(recurse=recurse) if not isinstance(p, DTensor) and id(p) not in ignored]

    # 0. input embeddings tied to an LM head outside their body: left replicated, and only when frozen
    tied_of: dict[int, dict[int, nn.Parameter]] = {}
    for body in _transformer_bodies(root):
        inside, within = {id(p) for p in body.parameters()}, {id(m) for m in body.modules()}
        tied_of[id(body)] = {id(p): p for m in root.modules() if id(m) not in within
                             for p in m.parameters(recurse=False) if id(p) in inside}
        if any(p.requires_grad for p in tied_of[id(body)].values()):
            raise ValueError("strategy=fsdp2: the model's input embedding is tied to its LM head and trainable; "
                             "FSDP2 cannot shard a weight shared across units. Train it with LoRA (the base "
                             "frozen), untie the embeddings, or use strategy=ddp / strategy=fsdp")
    # 1. blocks
    blocks = tuple(decoder_layer_classes(root, layer_names))
    for module in root.modules():
        if isinstance(module, blocks) and not isinstance(module, FSDPModule):
            shard(module, reshard_after_forward)
    # 2. bodies (embedding + final norm + the rotary buffers)
    for body in _transformer_bodies(root):
        tied = tied_of[id(body)]
        ignored.update(tied)
        if not isinstance(body, FSDPModule) and plain(body, recurse=True):
            shard(body, reshard_after_forward, set(tied.values()))
    # 3. whatever still owns plain parameters (LM head, heads), at the module that owns them
    for module in root.modules():
        if plain(module, recurse=False):
            shard(module, True)
    # 4. every model with a generate is now sharded: its forward is a collective, so transformers' generate must
    # step every rank until all have stopped (synced_gpus), and so must lrlhf's sampler (forward_is_collective)
    for module in root.modules():
        if hasattr(module, "generate") and hasattr(module, "config"):
            module._is_fsdp_managed_module = True
    return sharded


class FSDP2Strategy(ModelParallelStrategy):
    """FSDP2 data parallelism: Lightning's ``ModelParallelStrategy`` over all processes (tensor parallel size 1),
    with :func:`fully_shard_model` applied by the strategy after ``configure_model`` (so a module that builds its
    model in ``__init__`` works too). GPU (NCCL) and CPU (gloo) alike.

    FSDP2 has no root unit wrapped around ``training_step``: each unit gathers its parameters in its own forward
    and reduces its gradients in backward, so PPO's several forward/backward passes per batch (manual
    optimisation) work, and ``generate`` runs on the sharded model as is. Checkpoints are sharded folders
    (``save_distributed_checkpoint=True``, torch.distributed.checkpoint) or, with False, one full file.

    Args:
        layer_names, reshard_after_forward, mp_policy: see :func:`fully_shard_model`.
        save_distributed_checkpoint, process_group_backend, timeout: Lightning's ``ModelParallelStrategy``'s.
    """

    strategy_name = "fsdp2"

    def __init__(self, layer_names: Sequence[str] | None = None, reshard_after_forward: bool = True,
                 mp_policy=None, save_distributed_checkpoint: bool = True, process_group_backend: str | None = None,
                 timeout: timedelta | None = default_pg_timeout):
        super().__init__(save_distributed_checkpoint=save_distributed_checkpoint,
                         process_group_backend=process_group_backend, timeout=timeout)
        self.layer_names = list(layer_names) if layer_names else None
        self.reshard_after_forward = reshard_after_forward
        self.mp_policy = mp_policy

    def setup_environment(self) -> None:
        # pure data parallelism: every process is one data-parallel rank
        self._data_parallel_size = self.num_nodes * self.num_processes
        self._tensor_parallel_size = 1
        super().setup_environment()

    def setup(self, trainer) -> None:
        from lightning.fabric.utilities.init import _materialize_distributed_module
        from lightning.fabric.utilities.optimizer import _optimizers_to_device
        from lightning.pytorch.trainer.states import TrainerFn

        # ModelParallelStrategy.setup, except that the sharding is applied here rather than required of the
        # module's configure_model (which Lightning has already called)
        assert self.model is not None and self.accelerator is not None
        self.accelerator.setup(trainer)
        if is_fsdp_wrapped(self.model):
            raise TypeError("FSDP2Strategy: the model holds FSDP1 units (FullyShardedDataParallel); use strategy=fsdp")
        from torch.distributed.fsdp import FSDPModule

        if not any(isinstance(m, FSDPModule) for m in self.model.modules()):
            fully_shard_model(self.model, self.device_mesh["data_parallel"], self.layer_names,
                              self.reshard_after_forward, self.mp_policy)
        _materialize_distributed_module(self.model, self.root_device)
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self.barrier()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            _optimizers_to_device(self.optimizers, self.root_device)


def load_sharded_checkpoint(module: nn.Module, path, strict: bool = True) -> dict:
    """Load the weights of a sharded checkpoint folder (torch.distributed.checkpoint, as ``strategy=fsdp2``
    writes it) into an unsharded ``module`` in one process -- e.g. to export a full HF model after a sharded run:
    build the module as for training (``configure_model()``), load, then ``module.export(...)``.

    The folder is converted with torch's ``dcp_to_torch_save`` (no process group needed). Returns Lightning's
    metadata (``meta.pt``: loop state, callbacks, the module's ``on_save_checkpoint`` extras).
    """
    import tempfile
    from pathlib import Path

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    path = Path(path)
    if not (path.is_dir() and (path / ".metadata").is_file()):
        raise FileNotFoundError(f"{path}: not a sharded checkpoint folder (no .metadata)")
    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(path, Path(tmp) / "full.pt")
        full = torch.load(Path(tmp) / "full.pt", weights_only=True)
    module.load_state_dict(full["state_dict"], strict=strict)
    return torch.load(path / "meta.pt", weights_only=True)




# ------------------------------------------------------------------- the trained model whole, after fit
def whole_module(module, trainer, build):
    """The trained module as one unsharded model on global rank 0, for the export and the evaluations after
    training; None on the other ranks. One process: ``module`` itself.

    Several processes: a collective (every rank calls it). A replica (``ddp``) is ``module`` on rank 0; a sharded
    model is gathered whole on rank 0 (``fsdp2``: ``get_model_state_dict`` with a full state dict offloaded to
    the CPU; ``fsdp``: the parameters unsharded) and loaded into a fresh, unsharded module built from
    ``build()`` (a callable returning a new module of the same config). Its torchmetrics are told not to sync (only
    rank 0 evaluates).
    """
    from lrlhf.utils.distributed import rank, world_size

    if world_size() == 1:
        return module
    fsdp1 = is_fsdp_wrapped(trainer.strategy.model)
    if fsdp1 or any(type(p).__name__ == "DTensor" for p in module.parameters()):
        state = _fsdp1_full_state(trainer.strategy.model, module) if fsdp1 else _fsdp2_full_state(module)
        if rank() != 0:
            return None
        whole = build()
        whole.configure_model()
        whole.load_state_dict({name: state[name] for name in whole.state_dict()})
        whole.to(torch.device("cpu"))
    elif rank() != 0:
        return None
    else:
        whole = module
    no_metric_sync(whole)
    return whole


def _fsdp2_full_state(module) -> dict:
    """The full state dict of an FSDP2-sharded ``module`` on rank 0's CPU (empty on the others); a collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _fsdp1_full_state(root, module) -> dict:
    """The parameters and buffers of ``module`` under the FSDP1 unit ``root``, whole, copied on rank 0 (empty on
    the others); a collective. Every rank unshards them (``summon_full_params``) for the copy: FSDP1's full state
    dict, and ``summon_full_params(rank0_only=True, offload_to_cpu=True)``, segfaulted on CPU (gloo) with torch
    2.13."""
    from itertools import chain

    from torch.distributed.fsdp import FullyShardedDataParallel

    from lrlhf.utils.distributed import rank

    with FullyShardedDataParallel.summon_full_params(root, writeback=False):
        if rank() != 0:
            return {}
        return {name.replace("_fsdp_wrapped_module.", ""): tensor.detach().clone()
                for name, tensor in chain(module.named_parameters(), module.named_buffers())}


def no_metric_sync(module) -> None:
    """Let the torchmetrics of ``module`` compute without gathering across ranks (rank 0 evaluates alone)."""
    from torchmetrics import Metric

    for metric in module.modules():
        if isinstance(metric, Metric):  # (its constructor argument; read by every sync)
            metric.distributed_available_fn = _one_process


def _one_process() -> bool:
    return False


def restore_sharded_weights(trainer, path) -> None:
    """Load a sharded checkpoint folder (``strategy=fsdp2``, or ``fsdp`` with ``state_dict_type: sharded``) into
    the trained, still sharded model: every rank reads its own shards (a collective). Refused, naming the
    folder, under a strategy that cannot read it."""
    if not is_sharded(trainer):
        raise RuntimeError(f"{path} is a sharded checkpoint (a folder of per-rank shards) and this run's strategy "
                           f"{type(trainer.strategy).__name__} does not write or read sharded checkpoints; restore "
                           "it under the strategy that wrote it (e.g. strategy=fsdp2)")
    # the chosen weights only (training is over; rollout 0's checkpoint has no optimiser state yet): every rank
    # reads its own shards of the model, the optimisers are hidden from the strategy's loader meanwhile
    strategy, optimizers = trainer.strategy, trainer.strategy.optimizers
    strategy.optimizers = []
    try:
        strategy.load_checkpoint(path)
    finally:
        strategy.optimizers = optimizers


def is_sharded(trainer) -> bool:
    """True when ``trainer``'s strategy writes sharded checkpoints (a folder with one shard per rank)."""
    strategy = trainer.strategy
    if isinstance(strategy, ModelParallelStrategy):
        return bool(strategy._save_distributed_checkpoint)
    return isinstance(strategy, FSDPStrategy) and strategy._state_dict_type == "sharded"


__all__ = ["CPUFSDPStrategy", "DecoderLayerWrapPolicy", "FSDP2Strategy", "decoder_layer_classes",
           "full_params_for_generation", "fully_shard_model", "is_fsdp_wrapped", "is_sharded",
           "load_sharded_checkpoint", "no_metric_sync", "restore_sharded_weights", "whole_module"]
