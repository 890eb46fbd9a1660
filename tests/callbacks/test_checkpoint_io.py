"""ResumableCheckpoint's checkpoint IO: integrity before loading (flipped bytes, truncation), the fallback of
``ckpt_path="last"`` to the newest intact rollout checkpoint, explicit bad paths refused, no file in $TMPDIR."""

import os
import struct
import tempfile
import zipfile

import pytest
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from lrlhf.callbacks import ResumableCheckpoint
from lrlhf.callbacks.checkpoint_io import CorruptCheckpointError, _VerifyingCheckpointIO

from .conftest import make_data, make_module, make_trainer
from .test_checkpoint import RecordSamples


def flip(path, n=64):
    """Flip ``n`` bytes in the middle of the largest record's data (tensor bytes, not a zip header)."""
    with zipfile.ZipFile(path) as archive:
        record = max(archive.infolist(), key=lambda r: r.file_size)
    with open(path, "r+b") as f:
        f.seek(record.header_offset + 26)  # the local header's name and extra-field lengths
        name, extra = struct.unpack("<HH", f.read(4))
        start = record.header_offset + 30 + name + extra + record.file_size // 2
        f.seek(start)
        data = f.read(n)
        f.seek(start)
        f.write(bytes(b ^ 0xFF for b in data))


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _folder(tmp_path, n=3):
    """``rollout=1..n`` (tiny torch checkpoints holding their number) and ``last.ckpt`` -> the newest."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for i in range(1, n + 1):
        torch.save({"n": i, "w": torch.full((4096,), float(i))}, folder / f"rollout={i:06d}.ckpt")
    os.symlink(f"rollout={n:06d}.ckpt", folder / "last.ckpt")
    return folder


def _io(folder):
    callback = ResumableCheckpoint(dirpath=folder)  # no module attached: verify() checks nothing else
    return callback, _VerifyingCheckpointIO(TorchCheckpointIO(), callback)


@pytest.mark.parametrize("damage", [flip, truncate], ids=["flipped", "truncated"])
def test_explicit_bad_checkpoint_is_refused_naming_the_path(tmp_path, damage):
    folder = _folder(tmp_path)
    bad = folder / "rollout=000003.ckpt"
    damage(bad)
    _, io = _io(folder)
    what = "CRC-32 mismatch" if damage is flip else "truncated"
    with pytest.raises(CorruptCheckpointError, match=rf"cannot resume from {bad}: the checkpoint is .*{what}"):
        io.load_checkpoint(str(bad))
    assert io.load_checkpoint(str(folder / "rollout=000002.ckpt"))["n"] == 2  # an intact one loads


@pytest.mark.parametrize("damage", [flip, truncate, lambda p: p.unlink()], ids=["flipped", "truncated", "missing"])
def test_last_falls_back_to_the_newest_intact_rollout_with_a_warning(tmp_path, damage):
    folder = _folder(tmp_path)
    damage(folder / "rollout=000003.ckpt")
    callback, io = _io(folder)
    with pytest.warns(UserWarning, match=r"last.ckpt \(-> rollout=000003.ckpt\) is .*; resuming from .*"
                                         r"rollout=000002.ckpt instead"):
        (last,) = callback._find_last_checkpoints(None)  # what ckpt_path="last" resolves to
        assert io.load_checkpoint(last)["n"] == 2
    # ckpt_path=<the same symlink> (explicit; another run: nothing resolved "last") is refused, not replaced
    with pytest.raises(CorruptCheckpointError, match=rf"cannot resume from {folder / 'last.ckpt'} \(-> rollout"):
        _io(folder)[1].load_checkpoint(str(folder / "last.ckpt"))


def test_last_with_nothing_intact_names_the_folder(tmp_path):
    folder = _folder(tmp_path, n=2)
    for i in (1, 2):
        flip(folder / f"rollout={i:06d}.ckpt")
    callback, io = _io(folder)
    (last,) = callback._find_last_checkpoints(None)
    with pytest.raises(CorruptCheckpointError, match=rf"no intact rollout=\*.ckpt is left in {folder}"):
        io.load_checkpoint(last)


def test_a_checkpoint_with_flipped_bytes_does_not_resume(world, tokenizer, tmp_path):
    """End to end: rollouts 1 and 2 saved, 64 bytes of rollout 2's tensor data flipped; ckpt_path="last" resumes
    from rollout 1 (warning), an explicit path to rollout 2 is refused."""
    def run(rollouts, ckpt_path=None):
        module = make_module(world, tokenizer, cls=RecordSamples)
        trainer = make_trainer(tmp_path, rollouts, module, [ResumableCheckpoint(dirpath=tmp_path / "ckpt")])
        trainer.fit(module, datamodule=make_data(world, tokenizer), ckpt_path=ckpt_path)
        return module

    run(2)
    bad = tmp_path / "ckpt" / "rollout=000002.ckpt"
    flip(bad)
    with pytest.raises(CorruptCheckpointError, match=rf"{bad}: the checkpoint is corrupt \(CRC-32 mismatch"):
        run(3, ckpt_path=str(bad))
    with pytest.warns(UserWarning, match="resuming from .*rollout=000001.ckpt instead"):
        module = run(3, ckpt_path="last")
    assert module.rollouts_done == 3 and len(module.sampled) == 2  # rollouts 2 and 3 again


def test_saving_writes_nothing_to_tmpdir(tmp_path, monkeypatch):
    """Lightning's TorchCheckpointIO wrote through an fsspec transaction whose temporary file was made by
    tempfile.mkstemp() in $TMPDIR (a SIGKILL mid-write left it there, full size); the wrapper writes locally."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
    made = []
    for name in ("mkstemp", "mkdtemp", "NamedTemporaryFile", "TemporaryFile"):
        original = getattr(tempfile, name)

        def spy(*args, _original=original, _name=name, **kwargs):
            made.append((_name, kwargs.get("dir")))
            return _original(*args, **kwargs)

        monkeypatch.setattr(tempfile, name, spy)
    folder = tmp_path / "ckpt"
    _, io = _io(folder)
    state = {"w": torch.arange(1000.0)}
    io.save_checkpoint(state, folder / ".rollout=000001.ckpt.7.partial")  # atomic_save_checkpoint's temporary
    io.save_checkpoint(state, folder / "best.ckpt")  # any other path: atomic through a .partial next to it
    assert not made and not list(tmpdir.iterdir())
    assert sorted(p.name for p in folder.iterdir()) == [".rollout=000001.ckpt.7.partial", "best.ckpt"]
    for name in (".rollout=000001.ckpt.7.partial", "best.ckpt"):
        assert torch.equal(torch.load(folder / name, weights_only=True)["w"], state["w"])
        assert zipfile.ZipFile(folder / name).testzip() is None  # written with CRC-32s
