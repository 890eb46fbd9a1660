"""Atomic writes: a reader never sees half a file, and a crash mid-write leaves the old version intact."""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class StorageError(OSError):
    """A write the storage refused (no space, quota, read-only, no permission): one line naming the path, the room
    left there and what the write needed (:func:`storage_error`)."""

    def __str__(self) -> str:
        return str(self.strerror)


#: errnos of a storage fault (the write can succeed once space or permission is given back)
STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def storage_error(err: BaseException, path: str | Path, needed: int | None = None) -> StorageError | None:
    """A :class:`StorageError` for ``err`` raised while writing ``path`` when it was the storage's refusal: an
    ``OSError`` with a storage errno, or any error (``torch.save`` reports a full disk as a ``RuntimeError`` of its
    zip writer) while the file system holds less than ``needed`` bytes (or under 1 MB) free; None otherwise."""
    path = Path(path)
    folder = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    code = getattr(err, "errno", None)
    full = free is not None and free < max(needed or 0, 1 << 20)
    if code not in STORAGE_ERRNOS and not full:
        return None
    what, fix = {errno.EROFS: ("the file system is read-only", "make it writable"),
                 errno.EACCES: ("no permission to write there", "give this user write permission there"),
                 errno.EPERM: ("no permission to write there", "give this user write permission there"),
                 }.get(code, ("no space left on the device", "give it room"))
    need = f", the write needs about {_size(needed)}" if needed else ""
    room = f" ({_size(free)} free there{need})" if free is not None else ""
    return StorageError(code or errno.ENOSPC, f"cannot write {path}: {what}{room}. Nothing complete was replaced "
                        f"(writes are atomic): {fix} and run the same command again (a training run resumes "
                        "from its last complete checkpoint with ckpt_path=last)")


def process_gone(host: str, pid: int) -> bool:
    """True only when ``pid`` ran on this host and no longer exists (a process of another host, or another user's,
    counts as alive: nothing is removed on a guess)."""
    if host != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _temp_prefix(path: Path) -> str:
    """The name start of a temporary file or folder written for ``path``: its writer's pid and host, so that a
    later writer can tell one a killed process left (:func:`remove_dead_temps`) from one being written."""
    return f".{path.name}.{os.getpid()}@{socket.gethostname()}."


def remove_dead_temps(path: Path) -> None:
    """Remove the temporary files and folders next to ``path`` that a writer of it killed midway left (its
    process gone from this host); a live writer's, another host's and unrecognised names are kept."""
    name = re.compile(rf"\.{re.escape(path.name)}\.(\d+)@(.+)\.[^.]+\.tmp")
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        match = name.fullmatch(stale.name)
        if match and process_gone(match[2], int(match[1])):
            shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)


def file_sha256(path: str | Path) -> str:
    """The SHA-256 (hex) of a file's bytes, read a megabyte at a time (a data file may be large)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path``: a temporary file in the same folder, fsync, then ``os.replace`` (the temporaries
    of a writer killed earlier are removed first)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_temps(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_temp_prefix(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file ordinary permissions
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        refused = storage_error(err, path, len(data)) if isinstance(err, OSError) else None
        if refused is not None:
            raise refused from err
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """UTF-8 text with the newlines as given (no platform translation), written atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def write_json_lines(path: str | Path, rows: list[dict]) -> Path:
    """Plain dicts as canonical JSON lines (sorted keys, UTF-8 as is), atomically. Typed records (SFT examples,
    pairs, rankings, prompts) are :func:`lrlhf.data.writers.write_jsonl`'s."""
    return atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows))


def _old_folder(target: Path) -> Path:
    return target.with_name(f".{target.name}.old")


def recover_folder(target: str | Path) -> Path:
    """Finish or undo an :func:`atomic_save_folder` swap a crash interrupted; returns ``target``.

    The swap is two renames (``target`` -> ``.target.old``, new -> ``target``) and a removal. A crash between
    the renames leaves only ``.target.old``: it is moved back, so the last complete version is ``target``
    again. A crash after them leaves both: the new ``target`` is complete and the old copy is removed.
    Readers call this before looking at ``target`` (the stage cache does); writers do it implicitly.
    """
    target = Path(target)
    old = _old_folder(target)
    if old.exists():
        if target.exists():
            shutil.rmtree(old) if old.is_dir() else old.unlink()
        else:
            os.replace(old, target)
    return target


def atomic_save_folder(target: str | Path, save: Callable[[Path], None]) -> Path:
    """Let ``save(tmp_dir)`` fill a temporary folder next to ``target``, then swap it in place.

    The old ``target`` is removed only after ``save`` succeeded, so a failure leaves it untouched; a crash
    during the swap itself is repaired by :func:`recover_folder` (called here first, and by readers). A write the
    storage refuses is reported as a :class:`StorageError` naming ``target`` (not the hidden temporary folder).
    """
    target = recover_folder(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_temps(target)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=_temp_prefix(target), suffix=".tmp"))
    try:
        save(tmp)
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700
        swap_folder_in(tmp, target)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        refused = storage_error(err, target) if isinstance(err, OSError) else None
        if refused is not None:
            raise refused from err
        raise
    return target


def swap_folder_in(complete: str | Path, target: str | Path) -> Path:
    """Move the complete folder ``complete`` (on ``target``'s file system) to ``target``, replacing it: the swap
    of :func:`atomic_save_folder`, for a folder filled elsewhere (e.g. by several processes, as the CLI builds a
    stage under ``strategy=ddp|fsdp2``); a crash during it is repaired by :func:`recover_folder`."""
    complete, target = Path(complete), recover_folder(target)
    if target.exists():
        old = _old_folder(target)
        os.replace(target, old)
        os.replace(complete, target)
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    else:
        os.replace(complete, target)
    return target


def atomic_save_children(out_dir: str | Path, save: Callable[[Path], Any]) -> Any:
    """Let ``save(tmp_dir)`` fill a temporary folder inside ``out_dir``, then move each folder it wrote into
    ``out_dir`` by :func:`swap_folder_in` (a stage's export beside its run files: a run killed while exporting
    leaves the previous export, or none, never half of one; a leftover temporary folder is removed by the next
    call). Returns ``save``'s result with every path under the temporary folder rewritten to ``out_dir``
    (in dicts and named tuples)."""
    out_dir = Path(out_dir)
    for stale in out_dir.glob(".export-*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir, prefix=".export-", suffix=".tmp"))
    try:
        result = save(tmp)
        for written in sorted(tmp.iterdir()):
            swap_folder_in(written, out_dir / written.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def moved(value):
        if isinstance(value, Path):
            return out_dir / value.relative_to(tmp)
        if isinstance(value, dict):
            return {k: moved(v) for k, v in value.items()}
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return type(value)(*(moved(v) for v in value))
        return value

    return moved(result)
