"""Planning a run before any work: which stages it needs (and where the cache keeps them), and every check that
can fail cheaply, so a bad input stops the run before minutes of building.

- :func:`plan`: the needed stages, recursively, with their cache folders (``<cache_dir>/stages/<recipe>-<hash>``,
  or inside the run folder with ``cache=false``), and every module config node built (:func:`validate`).
- :func:`check_data`: every local data file a stage will read (its ``data.train|val|test`` and the held-out
  prompts of its callbacks) is read as the records its datamodule expects; an error names the key, the file and
  the line.
- :func:`check_resume`: with ``ckpt_path`` set, the checkpoint's stored run config is compared with this run's
  before any needed stage is built (a resume with another ``seed`` would otherwise rebuild stages first).
- :func:`remove_dead_builds`: stage folders left half-built by a killed launch (their owner process is gone).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import socket
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from lrlhf.utils.io import process_gone, recover_folder

#: Override keys that dependency stages inherit from the main run.
SHARED_KEYS = ("world", "model", "hparams", "paths", "seed", "threads", "stage_overrides")
#: Overrides of where and how a stage runs, which dependency stages inherit too: every process of a launch
#: (``trainer.devices=N``, torchrun, srun) trains every stage, so they all run on the same devices and strategy.
LAUNCH_KEYS = ("trainer", "strategy", "trainer.accelerator", "trainer.devices", "trainer.num_nodes",
               "trainer.precision", "trainer.strategy")
#: Keys that do not change what a stage computes (left out of its cache key and of the resume check).
UNHASHED_KEYS = ("paths", "hparams", "logger", "ckpt_path", "cache", "jobs", "eval", "stage_overrides")
#: Leaves a stage's key leaves out besides UNHASHED_KEYS: the world's roles, which a stage reads only through the
#: nodes that use them (``eval.judge``, the pairs' ``gold`` and ``annotator.gold``, early stopping's ``utility``,
#: ``reward=gold``'s path, ``needs.*``), and the judge column of the sample table (it samples from a forked RNG: a
#: record beside the weights, which it does not change). A stage that uses no role (SFT) is then one stage for worlds
#: that differ only in their gold (world=sentiment, sentiment_on_topic).
UNKEYED_LEAVES = ("world.judge", "world.table_judge", "world.gold_reward", "world.judge_recipe",
                  "callbacks.samples.judge")
#: Run-config keys a resume may change (how long to train, the callbacks' settings, threads): every other key of
#: the resolved config (less UNHASHED_KEYS) must be the checkpoint's, or the resume is refused.
RESUMABLE_CHANGES = ("config.trainer.max_steps", "config.trainer.max_epochs", "config.trainer.limit_train_batches",
                     "config.callbacks.*", "config.threads")
#: The file in a building stage folder naming the process that builds it (``host:pid``).
OWNER_FILE = ".owner"


def world_of(node):
    """The world object (:mod:`lrlhf.data.worlds`) of a ``world`` config node, its values resolved but ``dir`` (the
    CLI's) and ``judge`` (it may name a stage the caller does not need)."""
    from hydra.utils import instantiate

    content = {}
    for key in node:
        if key in ("dir", "judge", "judge_recipe", "table_judge", "pairs_recipe", "gold_reward"):
            continue
        value = node[key]
        content[key] = OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig | ListConfig) \
            else value
    try:
        return instantiate(content, _convert_="all")
    except Exception as err:  # a bad world value: name the key
        cause = str(_root_cause(err))
        raise ValueError(cause if cause.startswith("world.") else f"world: {cause}") from err


def world_dir(cfg: DictConfig) -> Path:
    """Where ``cfg.world`` is built: ``<paths.cache_dir>/worlds/<its key>`` (:mod:`lrlhf.data.worlds`)."""
    return Path(cfg.paths.cache_dir).expanduser() / "worlds" / world_of(cfg.world).key()


def check_world(cfg: DictConfig) -> None:
    """The world's files exist, and nothing asks a world without gold for the toy world's model or gold utility
    (both would be silently wrong: a toy model on real data, toy "gold" for a real policy)."""
    world = world_of(cfg.world)
    world.check()
    name = cfg.world.get("name", "?")
    model = cfg.get("model")
    if not world.has_model and model is not None and str(model.get("name_or_path")) == f"{cfg.world.dir}/model":
        raise ValueError(f"model=toy is the toy world's tiny model, and world={name} has none: name a model, "
                         "e.g. model=smollm2 or model=hf model.name_or_path=<hub id or folder>")
    if world.has_gold:
        return
    judges = [("eval.judge", (cfg.get("eval") or {}).get("judge"))]
    judges += [(f"callbacks.{key}.utility", node.get("utility")) for key, node in (cfg.get("callbacks") or {}).items()
               if isinstance(node, DictConfig) and "utility" in node]
    for key, value in judges:
        if value == "toy_gold":
            raise ValueError(f"{key}=toy_gold: world={name} has no gold utility (only the toy world does); use its "
                             f"held-out judge (the default, world.judge) or another judge (lrlhf.eval.judges)")
    if _is_toy_verifier((cfg.get("module") or {}).get("reward_model")):
        raise ValueError(f"reward=gold is the toy world's verifier (its sort and count requests), and world={name} "
                         "has no gold utility: drop reward=gold, or name your own reward function in "
                         "module.reward_model.fn")


def _is_toy_verifier(reward) -> bool:
    """Whether a ``module.reward_model`` node calls the toy world's verifier (``reward=gold``), whatever module path
    names it."""
    from lrlhf.data.toy import verifiable_reward

    fn = reward.get("fn") if isinstance(reward, DictConfig) else None
    if not isinstance(fn, DictConfig) or not fn.get("path"):
        return False
    from hydra.utils import get_method

    try:
        return get_method(fn.path) is verifiable_reward
    except (ImportError, ValueError):  # an unresolvable path: the instantiation reports it, naming the key
        return False


def _override_key(override: str) -> str:
    """``+a.b=c`` -> ``a.b``."""
    return override.lstrip("+~").split("=", 1)[0]


def _shared_overrides(overrides: list[str]) -> list[str]:
    key = _override_key
    return [o for o in overrides if key(o).split(".", 1)[0] in SHARED_KEYS or key(o) in LAUNCH_KEYS
            or key(o).startswith(("strategy.", "trainer.strategy."))]


def compose_recipe(recipe: str, overrides: list[str]) -> DictConfig:
    """Another recipe's config, composed (inside the launch's Hydra context) with ``overrides``."""
    from hydra import compose

    return compose(config_name="train", overrides=[f"recipe={recipe}", *overrides])


def needed_overrides(cfg: DictConfig, name: str, launch_overrides: list[str], extra: list[str] = ()) -> list[str]:
    """The overrides a stage ``cfg`` needs (``needs.<name>``, or a stage it runs itself: an iterative round's RM) is
    composed with: the launch's shared ones, ``cfg.stage_overrides.<name>``, then ``extra``."""
    return [*_shared_overrides(launch_overrides), *(cfg.stage_overrides.get(name) or []), *extra]


def keyed_content(config: dict) -> dict:
    """What a stage's key hashes of its resolved ``config`` (a plain dict, left as it is): all but
    :data:`UNHASHED_KEYS` and :data:`UNKEYED_LEAVES`."""
    content = copy.deepcopy({k: v for k, v in config.items() if k not in UNHASHED_KEYS})
    for leaf in UNKEYED_LEAVES:
        *path, name = leaf.split(".")
        node = content
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(name, None)
    return content


def stage_key(cfg: DictConfig) -> str:
    """A hash of what a stage computes: its resolved config without paths, logger and the like, and with the
    cache folder's own path left out of the paths of the stages it reads (a cache moved elsewhere is reused), an
    installed wheel's model folder by its version (another virtualenv keeps the stage)."""
    from lrlhf import __version__
    from lrlhf.data.tokenize import RENDERING
    from lrlhf.utils.model_source import packaged_model_dirs

    text = json.dumps(keyed_content(OmegaConf.to_container(cfg, resolve=True)), sort_keys=True, default=str)
    cache = OmegaConf.select(cfg, "paths.cache_dir", default=None)
    # the stages a stage reads (deps.*, world.dir) live in the cache: a moved or shared cache keeps its keys; an
    # installed wheel's model (model=smollm2) is its version, not the virtualenv's path
    names = dict.fromkeys({str(Path(cache).expanduser()), str(Path(cache).expanduser().resolve())} if cache else (),
                          "paths.cache_dir") | packaged_model_dirs()
    for folder, name in names.items():
        text = text.replace(f'"{folder}/', f'"<{name}>/').replace(f'"{folder}"', f'"<{name}>"')
    text += f"{__version__} rendering {RENDERING}"  # a stage trained under other rendering rules is another stage
    return hashlib.sha256(text.encode()).hexdigest()[:12]


#: what a required key (``???`` in its config file) is, for its one-line error
REQUIRED_HINTS = {"model.name_or_path": "<hub id or local folder> (model=hf: your own model)",
                  "world.preferences": "<your preference file> (world=files: your own data, docs/real_data.md)",
                  "module.reward_model.judge": "<judge model folder or hub id> (reward=judge, docs/rewards.md)"}


def check_required(cfg: DictConfig) -> None:
    """Every required value (``???``) is set, or one line names the first missing key before any work (Hydra would
    raise deep inside the first stage that reads it). ``world.dir`` is filled in by :func:`plan`."""

    def missing(node, prefix: str):
        if isinstance(node, dict):
            for key, value in node.items():
                yield from missing(value, f"{prefix}{key}.")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                yield from missing(value, f"{prefix}{i}.")
        elif node == "???":
            yield prefix[:-1]

    keys = [k for k in missing(OmegaConf.to_container(cfg, resolve=False), "") if k != "world.dir"]
    if keys:
        raise ValueError(f"{keys[0]} is required and not set: add {keys[0]}="
                         f"{REQUIRED_HINTS.get(keys[0], '...')} to the command" + (
                             f" (also unset: {', '.join(keys[1:])})" if keys[1:] else ""))


def plan(cfg: DictConfig, overrides: list[str], compose: Callable = compose_recipe, inside: Path | None = None,
         recover: bool = True) -> list:
    """Fill in ``world.dir`` and ``deps`` of ``cfg`` (recursively for its needs) and validate every stage.

    Returns the stages to run first, in order, as ``(recipe, cfg, out_dir)``; nothing is built here.
    ``inside``: build the needs in this folder (``cache=false``) instead of the cache.
    ``recover``: repair an interrupted swap of a cached stage (global rank 0 does; the other ranks of a launch
    only read, and reach the same plan: a stage is done if its folder, or the copy a repair would restore, is).
    """
    check_required(cfg)
    with open_dict(cfg):
        cfg.world.dir = str(world_dir(cfg))
    todo = []
    for name, recipe in (cfg.needs or {}).items():
        if recipe is None:  # e.g. judge: ${world.judge_recipe} on a world with gold
            continue
        dep = compose(recipe, needed_overrides(cfg, name, overrides))
        todo += [t for t in plan(dep, overrides, compose, inside, recover) if all(t[2] != u[2] for u in todo)]
        out_dir = (inside / name) if inside is not None else cache_folder(dep, recipe)
        with open_dict(dep):
            dep.paths.run_dir = str(out_dir)
        with open_dict(cfg):
            cfg.deps[name] = str(out_dir)
        if recover:
            recover_folder(out_dir)  # a stage whose swap into the cache was interrupted
            if out_dir.is_symlink() and not _stage_done(out_dir):
                out_dir.unlink()  # a run folder linked here (link_stage), since removed or reused
        if not _stage_done(out_dir) and all(t[2] != out_dir for t in todo):
            todo.append((recipe, dep, out_dir))
    check_world(cfg)
    validate(cfg)
    return todo


def cache_folder(cfg: DictConfig, recipe: str) -> Path:
    """Where the stage cache keeps the stage ``cfg`` (planned: its ``deps`` filled) computes:
    ``<paths.cache_dir>/stages/<recipe>-<stage_key>``, the run folder left out of the key."""
    keyed = cfg.copy()
    with open_dict(keyed):  # the run folder must not enter the key (callbacks interpolate it)
        keyed.paths.run_dir = "<stage folder>"
    return Path(cfg.paths.cache_dir).expanduser() / "stages" / f"{recipe}-{stage_key(keyed)}"


def _stage_done(out_dir: Path) -> bool:
    """``out_dir`` holds a finished stage, or will once :func:`recover_folder` runs (read-only; the old copy is
    looked at first: a concurrent repair moves it to ``out_dir`` or removes it only when ``out_dir`` is complete).
    A link to a run folder (:func:`link_stage`) counts while that folder's summary still names this entry."""
    if out_dir.is_symlink():
        try:
            return json.loads((out_dir / "summary.json").read_text()).get("cache_entry") == out_dir.name
        except (OSError, ValueError):
            return False
    return (out_dir.with_name(f".{out_dir.name}.old") / "summary.json").is_file() or (
        out_dir / "summary.json").is_file()


def stage_entry(cfg: DictConfig, recipe: str, overrides: list[str], compose: Callable) -> Path | None:
    """The stage-cache entry a run of ``recipe`` (planned) fills (``recipe=rm`` then ``recipe=ppo_lora``
    trained the RM twice): the entry a later recipe needing ``recipe`` would build, when this run's config is
    exactly what that recipe composes from the shared overrides and the entry is free; None when the run has an
    override of its own (it is another stage) or the entry holds a stage already."""
    shared = _shared_overrides(overrides)
    own = [o for o in overrides if o not in shared
           and _override_key(o).split(".", 1)[0] not in (*UNHASHED_KEYS, "hydra", "recipe", "cache")]
    if own:  # e.g. reward=ensemble, module.config.lr=...: what a needing recipe composes differs
        return None
    try:
        needed = compose(recipe, shared)
        plan(needed, overrides, compose, recover=False)
    except Exception:
        return None
    entry = cache_folder(needed, recipe)
    if entry != cache_folder(cfg, recipe) or _stage_done(entry) or entry.exists():
        return None
    return entry


def link_stage(entry: Path, run_dir: Path) -> None:
    """Make ``entry`` a link to the run folder ``run_dir`` (atomically), whose ``summary.json`` already names it
    as ``cache_entry``: the link counts only while it does (:func:`_stage_done`), so a run folder removed or
    reused for another run is rebuilt, never read. Global rank 0."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    link = entry.with_name(f".{entry.name}.link")
    link.unlink(missing_ok=True)
    link.symlink_to(run_dir.resolve(), target_is_directory=True)
    os.replace(link, entry)


#: The config nodes whose settings objects :func:`validate` builds: the module's, ``recipe=eval``'s
#: (:class:`lrlhf.eval.harness.EvalSettings`), ``recipe=iterative_ppo``'s rounds, ``recipe=rm_ensemble``'s members.
PLANNED_NODES = ("module", "eval", "rounds", "ensemble", "pairs", "annotator")


def validate(cfg: DictConfig) -> None:
    """Build every ``_target_`` config node under :data:`PLANNED_NODES` that is a plain config (cheap, no model
    loaded: a dataclass, or a class with ``built_when_planning = True``), so a bad value fails now, naming its key,
    rather than after minutes of work."""
    from hydra.utils import get_class, instantiate

    def visit(node, where: str) -> None:
        if not isinstance(node, DictConfig):
            return
        target = node.get("_target_")
        if target is not None:
            cls = get_class(target)
            if getattr(cls, "__dataclass_fields__", None) is not None or getattr(cls, "built_when_planning", False):
                try:
                    instantiate(node, _convert_="all")
                except Exception as err:
                    cause = str(_root_cause(err))  # its own message may already name the key
                    missing = re.search(r"Interpolation key 'deps\.(\w+)' not found", cause)
                    if missing:  # e.g. needs.sft=null: the recipe still reads the stage it no longer builds
                        cause += (f": the recipe no longer needs a `{missing[1]}` stage (needs.{missing[1]}=null), "
                                  f"so give {where} its own value, e.g. {where}='${{model}}' for the run's model")
                    raise ValueError(cause if cause.startswith(f"{where}.") else f"{where}: {cause}") from err
                return
        for key in node:
            visit(node._get_node(key), f"{where}.{key}")

    for key in PLANNED_NODES:  # e.g. the rounds' settings and annotator, before any stage is built
        if cfg.get(key) is not None:
            visit(cfg._get_node(key), key)


def _root_cause(err: BaseException) -> BaseException:
    while err.__cause__ is not None:
        err = err.__cause__
    return err


def _building_folder(target: Path, run_dir: Path) -> Path:
    """Where a needed stage is built before it is swapped into ``target``: next to it (one file system, so the
    swap is a rename), named alike by every rank of a launch (they share the run folder) and differently by
    concurrent launches (another run folder)."""
    key = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:8]
    return target.with_name(f".{target.name}.{key}.building")


def start_build(folder: Path) -> None:
    """Create the building folder of a stage and name its owner (this host and process) in it, so that a later
    launch can tell a build killed midway (owner gone: :func:`remove_dead_builds`) from one still running."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / OWNER_FILE).write_text(f"{socket.gethostname()}:{os.getpid()}\n")


def _owner_alive(folder: Path) -> bool:
    """False only when the folder's owner ran on this host and no longer exists (unknown owners count as alive:
    another host, or a folder written before owners were recorded, is never removed on a guess)."""
    try:
        host, pid = (folder / OWNER_FILE).read_text().strip().rsplit(":", 1)
        return not process_gone(host, int(pid))
    except (OSError, ValueError):
        return True


def remove_dead_builds(folders: list[Path]) -> list[Path]:
    """Remove the ``.<stage>.<key>.building`` folders next to each of ``folders`` whose owner process is gone (a
    launch killed while building a stage); returns what was removed."""
    removed = []
    for parent in sorted({Path(f).parent for f in folders}):
        if not parent.is_dir():
            continue
        for stale in parent.glob(".*.building"):
            if stale.is_dir() and not _owner_alive(stale):
                shutil.rmtree(stale, ignore_errors=True)
                removed.append(stale)
    return removed


# ------------------------------------------------------------------------------------ pre-build checks
def run_config(cfg: DictConfig) -> dict:
    """The resolved run config a checkpoint stores and a resume must match (less :data:`UNHASHED_KEYS`)."""
    return {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k not in UNHASHED_KEYS}


def _checkpoint_file(cfg: DictConfig) -> tuple[Path | None, DictConfig | None]:
    """The checkpoint file ``ckpt_path`` names and the callback config that writes it (a ResumableCheckpoint's);
    ``(None, None)`` when there is none to look at before training (no such file, a sharded folder, other
    checkpoint kinds)."""
    ckpt = cfg.get("ckpt_path")
    callback = next((c for c in (cfg.get("callbacks") or {}).values()
                     if c and str(c.get("_target_", "")).endswith("ResumableCheckpoint")), None)
    if ckpt is None or callback is None:
        return None, None
    if ckpt == "last":
        if not callback.get("dirpath"):
            return None, None
        path = Path(callback.dirpath) / "last.ckpt"
    else:
        path = Path(ckpt)
    return (path, callback) if path.is_file() else (None, None)


def check_resume(cfg: DictConfig) -> None:
    """With ``ckpt_path`` set, refuse now (before any needed stage is built) a resume whose run config differs
    from the checkpoint's outside the allowed changes. The full check (module hyperparameters, weights, frozen
    digests) still runs when training loads the checkpoint; this one only looks at the stored run config."""
    import torch

    from lrlhf.callbacks.checkpoint import META_KEY, _plain, config_problems

    path, callback = _checkpoint_file(cfg)
    if path is None:
        return
    try:
        stored = torch.load(path, map_location="cpu", weights_only=True, mmap=True).get(META_KEY) or {}
    except Exception:  # unreadable: the loader's own integrity check reports it (and may fall back)
        return
    old = (stored.get("config") or {}).get("config")
    if not old:  # written without a run config (not by the CLI)
        return
    allowed = (*RESUMABLE_CHANGES, *(callback.get("allowed_config_changes") or ()))
    problems = config_problems({"config": old}, {"config": _plain(run_config(cfg))}, allowed)
    if problems:
        raise ValueError(f"cannot resume from {path} (ckpt_path={cfg.ckpt_path}): the run config differs, nothing "
                         "was built or trained:\n  " + "\n  ".join(problems))


def _local_file(source) -> Path | None:
    from lrlhf.data.sources import _has_local_suffix

    if not isinstance(source, str):
        return None
    path = Path(source)
    return path if _has_local_suffix(path) else None


def check_data(stages: list[tuple[str, DictConfig]], pending: list[Path] = ()) -> None:
    """Read every local data file of ``stages`` (``(label, cfg)``: ``data.train|val|test`` as the records the
    datamodule expects, and the ``prompts`` of its callbacks) and raise on the first bad one, naming the stage,
    the key, the file and the line. Files under ``pending`` folders (stages not built yet) and hub datasets
    are left to the stage itself."""
    from hydra.utils import get_class

    from lrlhf.data.formats import PREFERENCE_KINDS, load_records

    def check(label: str, key: str, source, kind, **kwargs) -> None:
        path = _local_file(source)
        if path is None or any(path.is_relative_to(p) for p in pending):
            return
        try:
            load_records(str(path), kind, verbose=False, **kwargs)
        except (ValueError, OSError) as err:
            raise _renamed(err, f"{label}{key}: {err}") from err

    for label, cfg in stages:
        data = cfg.get("data")
        if isinstance(data, DictConfig) and data.get("_target_"):
            kind = getattr(get_class(data._target_), "record_kind", None)
            if kind:
                extra = data.get("load_kwargs")
                extra = OmegaConf.to_container(extra, resolve=True) if isinstance(extra, DictConfig) else {}
                kwargs = dict(format=data.get("format") or "auto", **extra)
                for split in ("train", "val", "test"):
                    check(label, f"data.{split}", data.get(split), kind, **kwargs)
        for name, callback in (cfg.get("callbacks") or {}).items():
            if callback and isinstance(callback.get("prompts"), str):
                check(label, f"callbacks.{name}.prompts", callback.prompts, "prompt")
            if callback and isinstance(callback.get("pairs"), str):  # read as the sample table reads it
                check(label, f"callbacks.{name}.pairs", callback.pairs, PREFERENCE_KINDS)


def _renamed(err: Exception, message: str) -> Exception:
    """``err``'s type with ``message`` (a ValueError where that type cannot be built from one message)."""
    try:
        return type(err)(message)
    except TypeError:
        return ValueError(message)


def check_shared_run_dir(hydra_cfg) -> None:
    """Several processes started by torchrun or srun each resolve Hydra's default run folder (a timestamp) on
    their own: they must be given one (Lightning's own launcher passes its run folder to the processes it
    starts)."""
    from hydra.types import RunMode

    from lrlhf.utils.distributed import launched_processes

    given = any(o.lstrip("+").split("=", 1)[0] == "hydra.run.dir" for o in hydra_cfg.overrides.hydra)
    if launched_processes() > 1 and hydra_cfg.mode == RunMode.RUN and not given:
        raise ValueError(f"{launched_processes()} processes were launched (torchrun / srun): pass "
                         "hydra.run.dir=<a folder every rank shares>, or each rank names its own run folder")
