"""Storage faults: a write the storage refuses (a full disk, a read-only folder) stops the run with one line naming
the path, the room left and what the write needed; what was complete stays complete (writes are atomic), and the
run resumes once there is room. Injected faults at the two write points, and a real small file system (tmpfs)
where the machine allows mounting one."""

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from test_cli import _tiny, _train

from lrlhf.callbacks.checkpoint_io import save_local
from lrlhf.utils import io
from lrlhf.utils.io import StorageError, atomic_save_folder, atomic_write_text


def test_an_atomic_write_the_disk_refuses_names_the_path_and_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "summary.json"
    atomic_write_text(target, "old")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(io.os, "fsync", full)
    with pytest.raises(StorageError, match=rf"cannot write {target}: no space left on the device \(.* free there, "
                                           r"the write needs about 3 B\)\. Nothing complete was replaced"):
        atomic_write_text(target, "new")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]
    monkeypatch.setattr(io.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EROFS, "Read-only")))
    with pytest.raises(StorageError, match="the file system is read-only .*: make it writable and run the same"):
        atomic_write_text(target, "new")
    monkeypatch.setattr(io.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EACCES, "Permission denied")))
    with pytest.raises(StorageError, match="no permission to write there .*: give this user write permission there"):
        atomic_write_text(target, "new")
    monkeypatch.setattr(io.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(OSError, match="I/O error") as other:  # not the storage's refusal: as it was
        atomic_write_text(target, "new")
    assert not isinstance(other.value, StorageError)


def test_a_folder_the_disk_refuses_is_named_not_its_hidden_temporary(tmp_path):
    """A world, stage or export folder is filled in a hidden temporary beside it: the one line names the folder."""
    target = tmp_path / "worlds" / "seed0"
    atomic_save_folder(target, lambda d: (d / "a.jsonl").write_text("old"))

    def full(folder):
        atomic_write_text(folder / "b.jsonl", "x")
        raise OSError(errno.ENOSPC, "No space left on device", str(folder / "c.jsonl"))

    with pytest.raises(StorageError, match=rf"^cannot write {target}: no space left on the device \("):
        atomic_save_folder(target, full)
    assert sorted(p.name for p in target.parent.iterdir()) == ["seed0"] and (target / "a.jsonl").read_text() == "old"


def test_a_checkpoint_the_full_disk_cuts_short_is_named_as_such_and_the_last_one_kept(tmp_path, monkeypatch):
    last = tmp_path / "rollout=000001.ckpt"
    save_local({"w": torch.zeros(4)}, last)
    before = last.read_bytes()

    def cut_short(obj, f):  # torch's zip writer on a full disk: a RuntimeError, not an OSError
        Path(f).write_bytes(b"PK")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 313664 vs 313552")

    monkeypatch.setattr(torch, "save", cut_short)
    monkeypatch.setattr(io.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10 << 20, 10 << 20, 1000))
    with pytest.raises(StorageError, match=r"cannot write .*rollout=000002\.ckpt: no space left on the device "
                                           r"\(1000 B free there, the write needs about .* KB\)"):
        save_local({"w": torch.zeros(4)}, tmp_path / ".rollout=000002.ckpt.7.partial")
    assert last.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [last.name]
    monkeypatch.setattr(io.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10 << 30, 0, 5 << 30))
    with pytest.raises(RuntimeError, match="unexpected pos"):  # room enough: another fault, reported as it is
        save_local({"w": torch.zeros(4)}, tmp_path / "rollout=000003.ckpt")


@pytest.fixture
def small_disk(tmp_path):
    """A 1.8 MB tmpfs: room for the run's first checkpoints, not for all (skips where mounting is not allowed)."""
    folder = tmp_path / "small"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1800k", "tmpfs", str(folder)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.strip() or 'mount failed'}); the injected "
                    "faults above still run")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.mark.slow
def test_a_run_on_a_full_disk_stops_in_one_line_and_resumes_once_there_is_room(tmp_path, small_disk):
    run = small_disk / "run"
    args = ["recipe=ppo_lora", *_tiny("ppo_lora"), "trainer.max_steps=16", "callbacks.checkpoint.every_n_rollouts=1",
            "logger=csv", f"hydra.run.dir={run}"]
    out = _train(tmp_path, *args, check=False)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    line = [s for s in out.stderr.splitlines() if s.startswith("lrlhf: error:")]
    assert len(line) == 1 and line[0].startswith(f"lrlhf: error: cannot write {run}/checkpoints/"), out.stderr[-2000:]
    assert "no space left on the device" in line[0] and "the write needs about" in line[0]
    assert "Traceback" not in out.stderr
    assert not [p for p in run.rglob("*.partial")] and not [p for p in run.rglob(".*.tmp")]  # nothing half-written
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)  # room again
    out = _train(tmp_path, *args, "ckpt_path=last")
    assert "== lrlhf ppo: done ==" in out.stdout and (run / "summary.json").is_file()
    assert os.path.realpath(run / "checkpoints" / "last.ckpt").endswith("rollout=000008.ckpt")  # 16 steps, 2 each


def test_any_write_the_storage_refuses_ends_the_run_in_one_line(tmp_path, monkeypatch, capsys):
    """An export (save_pretrained) or any other write outside the atomic helpers: its errno is enough."""
    from omegaconf import OmegaConf

    from lrlhf.run import cli

    cfg = OmegaConf.create({"paths": {"run_dir": str(tmp_path)}})
    target = tmp_path / "export" / "merged" / "model.safetensors"

    def export_fails(cfg):
        raise OSError(errno.ENOSPC, "No space left on device", str(target))

    monkeypatch.setattr(cli, "run", export_fails)
    with pytest.raises(SystemExit) as stop:
        cli._task(cfg)
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"lrlhf: error: cannot write {target}: no space left on the device (")
    assert "Traceback" not in err
    monkeypatch.setattr(cli, "run", lambda cfg: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error", str(target))))
    with pytest.raises(OSError, match="I/O error"):  # not the storage's refusal: its traceback, a bug to report
        cli._task(cfg)
