import pytest

from lrlhf.utils.io import atomic_save_folder, atomic_write_text


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
