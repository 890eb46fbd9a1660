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
