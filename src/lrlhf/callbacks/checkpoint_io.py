"""The file side of :class:`~lrlhf.callbacks.ResumableCheckpoint`: how a checkpoint is written, checked and read.

- **Integrity** (:func:`checkpoint_problem`): torch writes a checkpoint as a zip archive with a CRC-32 per record
  (``torch.utils.serialization.config.save.compute_crc32``, on by default and forced on by :func:`save_local`),
  but ``torch.load`` never checks them: flipped bytes in tensor data load silently. Before loading, the archive's
  central directory is read (a truncated file has none) and every record's CRC-32 is recomputed
  (``zipfile.ZipFile.testzip``: about 3 GB/s from the page cache, ~0.1 s for a 400 MB file, which warms the
  cache for ``torch.load`` after it). A file written without CRC-32s is loaded unchecked, with a warning.
  Sharded checkpoint folders (torch.distributed.checkpoint) are not checked.
- **Fallback**: a corrupt, truncated or missing checkpoint that ``ckpt_path="last"`` resolved to (``last.ckpt``,
  a symlink) is replaced by the newest intact ``rollout=*.ckpt`` of its folder, with a warning naming both; an
  explicit path is refused (:class:`CorruptCheckpointError`, naming the path and what is wrong).
- **Writing** (:func:`save_local`): ``torch.save`` straight into a local file, fsync. Lightning's
  ``TorchCheckpointIO`` serialises into memory first and writes through an fsspec transaction whose temporary
  file is made by ``tempfile.mkstemp()`` in ``$TMPDIR``: a process killed mid-write left a full-size orphan there.
"""

from __future__ import annotations

import os
import re
import shutil
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.pytorch.utilities import rank_zero_warn

from lrlhf.utils.io import storage_error

if TYPE_CHECKING:
    from lrlhf.callbacks.checkpoint import ResumableCheckpoint

ROLLOUT_FILE = re.compile(r"^rollout=(\d+)\.ckpt$")


class CorruptCheckpointError(ValueError):
    """A checkpoint file is truncated, corrupt or missing (the message names the path and what is wrong)."""


def _fsync(path: Path) -> None:
    """fsync a file, or a folder's files and the folder itself (a sharded checkpoint)."""
    if path.is_dir():
        for child in path.rglob("*"):
            if child.is_file():
                _fsync(child)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    """Remove a checkpoint file or a sharded checkpoint folder (never follows a symlink)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------ integrity
def checkpoint_problem(path: str | Path) -> str | None:
    """What is wrong with the checkpoint file ``path`` (``"truncated ..."``, ``"corrupt ..."``, ``"missing"``), or
    None: intact, a sharded folder (not checked), or not a zip archive (torch's legacy format: torch reports)."""
    path = Path(path)
    if path.is_dir():
        return None
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(4)
    except FileNotFoundError:
        return "missing" + (f" (a symlink to {os.readlink(path)!r}, which does not exist)" if path.is_symlink() else "")
    except OSError as err:
        return f"unreadable ({err})"
    if size == 0:
        return "truncated (0 bytes)"
    if not head.startswith(b"PK"):
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
            if not any(r.CRC for r in records if r.file_size):
                rank_zero_warn(f"{path} was written without CRC-32s (torch.utils.serialization.config.save."
                               "compute_crc32 = False): its integrity cannot be checked")
                return None
            bad = archive.testzip()
    except zipfile.BadZipFile as err:
        return f"truncated or not a complete zip archive ({size} bytes: {err})"
    except (OSError, EOFError, ValueError, RuntimeError) as err:
        return f"corrupt ({type(err).__name__}: {err})"
    if bad is not None:
        return f"corrupt (CRC-32 mismatch in record {bad!r}: bytes changed after it was written)"
    return None


def newest_intact(folder: Path, skip: Path | None = None) -> Path | None:
    """The ``rollout=<n>.ckpt`` of ``folder`` with the largest n that :func:`checkpoint_problem` finds intact."""
    found = sorted(((int(m.group(1)), p) for p in folder.iterdir() if (m := ROLLOUT_FILE.match(p.name))),
                   reverse=True)
    skip = skip.resolve() if skip is not None else None
    for _, candidate in found:
        if candidate.resolve() != skip and checkpoint_problem(candidate) is None:
            return candidate
    return None


def _shown(path: Path) -> str:
    return f"{path} (-> {os.readlink(path)})" if path.is_symlink() else str(path)


def fall_back(last: Path, problem: str) -> str:
    """The newest intact rollout checkpoint next to the bad ``last`` (``problem`` says what is wrong), with a
    warning naming both; :class:`CorruptCheckpointError` when there is none."""
    fallback = newest_intact(last.parent, skip=last)
    if fallback is None:
        raise CorruptCheckpointError(f"cannot resume from {_shown(last)} (ckpt_path=last): the checkpoint is "
                                     f"{problem}, and no intact rollout=*.ckpt is left in {last.parent} to fall "
                                     "back to")
    rank_zero_warn(f"ckpt_path=last: {_shown(last)} is {problem}; resuming from {fallback} instead, the newest "
                   "intact rollout checkpoint")
    return str(fallback)


# --------------------------------------------------------------------------------------------- write
def save_local(checkpoint: dict[str, Any], path: str | Path) -> None:
    """``torch.save`` into the local file ``path`` (with CRC-32s), fsync; no temporary file anywhere else.

    A ``.partial`` path (:func:`~lrlhf.callbacks.checkpoint.atomic_save_checkpoint`'s, renamed by it) is written
    directly; any other path through ``.<name>.<pid>.partial`` next to it, renamed when complete."""
    import torch
    from torch.utils.serialization import config

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    direct = path.name.endswith(".partial")
    tmp = path if direct else path.with_name(f".{path.name}.{os.getpid()}.partial")
    crc, config.save.compute_crc32 = config.save.compute_crc32, True
    try:
        torch.save(checkpoint, str(tmp))
        _fsync(tmp)
        if not direct:
            os.replace(tmp, path)
    except (OSError, RuntimeError) as err:
        tmp.unlink(missing_ok=True)
        earlier = [p.stat().st_size for p in path.parent.glob("*.ckpt") if p.is_file() and not p.is_symlink()]
        final = re.sub(r"^\.(.+?)(\.\d+)?\.partial$", r"\1", path.name)  # the checkpoint it was to become
        refused = storage_error(err, path.with_name(final), max(earlier, default=None))
        if refused is not None:  # a full disk: one line, the last complete checkpoint is untouched
            raise refused from err
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        config.save.compute_crc32 = crc


# ---------------------------------------------------------------------------------------- the plugin
class _VerifyingCheckpointIO(CheckpointIO):
    """Wraps the strategy's checkpoint IO: writes local files without a temporary file in ``$TMPDIR``; checks a
    file's integrity before loading it (falling back from a bad ``last``), loads with ``weights_only=True`` and
    lets the callback refuse a checkpoint before Lightning restores anything from it."""

    def __init__(self, inner: CheckpointIO, callback: ResumableCheckpoint):
        self.inner = inner
        self.callback = callback

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        if type(self.inner) is TorchCheckpointIO and storage_options is None and _is_local_file_protocol(path):
            return save_local(checkpoint, str(path).removeprefix("file://"))
        return self.inner.save_checkpoint(checkpoint, path, storage_options)

    def load_checkpoint(self, path, map_location=None, weights_only=None):
        path = self.intact(path)
        checkpoint = self.inner.load_checkpoint(path, map_location=map_location, weights_only=True)
        self.callback.verify(checkpoint, path)
        return checkpoint

    def intact(self, path):
        """``path`` when intact; for a bad ``last`` the newest intact rollout checkpoint (warns); else raises."""
        if not _is_local_file_protocol(path):
            return path
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        if os.path.normpath(str(path)) not in self.callback.last_paths:
            raise CorruptCheckpointError(f"cannot resume from {_shown(Path(path))}: the checkpoint is {problem}")
        return fall_back(Path(path), problem)

    def remove_checkpoint(self, path):
        return self.inner.remove_checkpoint(path)

    def teardown(self):
        return self.inner.teardown()
