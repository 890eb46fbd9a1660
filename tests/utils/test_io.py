import pytest

from lrlhf.utils.io import atomic_save_folder, atomic_write_text, recover_folder, swap_folder_in


def test_atomic_write_text_replaces_and_keeps_no_temp(tmp_path):
    path = atomic_write_text(tmp_path / "a.txt", "one\n")
    atomic_write_text(path, "two\n")
    assert path.read_text() == "two\n"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_atomic_save_folder_swaps_in_and_a_failure_keeps_the_old_folder(tmp_path):
    def save(text):
        def write(folder):
            (folder / "weights").write_text(text)

        return write

    target = atomic_save_folder(tmp_path / "ckpt", save("v1"))
    atomic_save_folder(target, save("v2"))
    assert (target / "weights").read_text() == "v2"

    def broken(folder):
        (folder / "weights").write_text("half")
        raise RuntimeError("crashed mid-save")

    with pytest.raises(RuntimeError, match="mid-save"):
        atomic_save_folder(target, broken)
    assert (target / "weights").read_text() == "v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def _interrupted_swap(tmp_path, second_rename_done: bool):
    """The folder state a crash leaves inside atomic_save_folder's swap (v1 replaced by v2)."""
    target, old = tmp_path / "ckpt", tmp_path / ".ckpt.old"
    old.mkdir()
    (old / "weights").write_text("v1")
    if second_rename_done:
        target.mkdir()
        (target / "weights").write_text("v2")
    return target


def test_recover_folder_moves_the_old_version_back_after_a_crash_between_the_renames(tmp_path):
    target = _interrupted_swap(tmp_path, second_rename_done=False)
    assert recover_folder(target) == target
    assert (target / "weights").read_text() == "v1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_recover_folder_keeps_the_new_version_after_a_crash_before_the_removal(tmp_path):
    target = recover_folder(_interrupted_swap(tmp_path, second_rename_done=True))
    assert (target / "weights").read_text() == "v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert recover_folder(target) == target  # nothing to do: a no-op


def test_atomic_save_folder_repairs_an_interrupted_swap_first(tmp_path):
    target = _interrupted_swap(tmp_path, second_rename_done=False)

    def broken(folder):
        raise RuntimeError("crashed mid-save")

    with pytest.raises(RuntimeError):
        atomic_save_folder(target, broken)
    assert (target / "weights").read_text() == "v1"  # the repaired old version survives the failed save
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_swap_folder_in_replaces_a_folder_or_a_file(tmp_path):
    for kind in ("folder", "file"):
        target = tmp_path / kind
        if kind == "folder":
            target.mkdir()
            (target / "weights").write_text("old")
        else:
            target.write_text("old")
        new = tmp_path / f".{kind}.new"
        new.mkdir()
        (new / "weights").write_text("new")
        assert swap_folder_in(new, target) == target
        assert (target / "weights").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder"]


def test_a_killed_writers_temporaries_are_removed_by_the_next_write_and_a_live_or_foreign_ones_kept(tmp_path):
    """A writer SIGKILLed just before its rename leaves its temporary file (and a folder's): the next write of the
    same path removes them; a temporary of a live process (a writer still at work) or of another host stays."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    child = (  # dies at its first rename, as bench/kill_loop.py's hook does
        "import os, signal, sys\n"
        "from lrlhf.utils.io import atomic_save_folder, atomic_write_text\n"
        "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)\n"
        "atomic_write_text(sys.argv[1] + '/summary.json', '{}') if sys.argv[2] == 'file' else "
        "atomic_save_folder(sys.argv[1] + '/model', lambda d: (d / 'w').write_text('w'))\n")
    for what in ("file", "folder"):
        done = subprocess.run([sys.executable, "-c", child, str(tmp_path), what])
        assert done.returncode == -signal.SIGKILL
    left = sorted(p.name for p in tmp_path.iterdir())
    assert len(left) == 2 and all(name.endswith(".tmp") for name in left), left
    live = tmp_path / f".summary.json.{os.getpid()}@{socket.gethostname()}.abcd1234.tmp"
    foreign = tmp_path / ".summary.json.1@another-host.abcd1234.tmp"
    live.write_text("being written")
    foreign.write_text("written elsewhere")

    atomic_write_text(tmp_path / "summary.json", "{}")
    atomic_save_folder(tmp_path / "model", lambda d: (d / "w").write_text("w"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["summary.json", "model", live.name, foreign.name])
