"""The kill soak's short version (bench/kill_loop.py; its long run is in bench/RESULTS.md): every recipe run straight
and run SIGKILLed twice, at commits of its atomic writes (just before or after the rename: a checkpoint, an export's
swap, a stage's cache registration, the world's build, a round's or labelled file, the run's files) or mid-way
through a checkpoint's bytes, drawn with a seed of its own, each launch resumed with ``ckpt_path=last``; then once
refused by the storage (ENOSPC, EROFS or EACCES at a commit: the launch must stop in one line naming the path). The
killed run must end equal to the straight one: exported weights bitwise, every metrics.csv row, every JSON / JSON
lines file, and no orphan (half-built stages, temporary files or folders, swap leftovers, files in TMPDIR)."""

import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT / "bench"))

import kill_loop  # noqa: E402  (bench/ is not a package)

NAMES = list(kill_loop.RECIPES)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_a_recipe_killed_at_its_writes_resumes_to_the_uninterrupted_result(name, tmp_path, request, capsys):
    tiny_real = None
    if name == "grpo_constraints":
        if not (SHARED / "llama-factory" / "alpaca_en_demo.json").is_file():
            pytest.skip("../shared/data is absent (an outside clone): the constraints world is built from it")
        tiny_real = request.getfixturevalue("tiny_real_model")
    ok, log = kill_loop.soak(name, tmp_path, 2, random.Random(NAMES.index(name)), tiny_real, faults=1)
    printed = capsys.readouterr().out
    assert ok, printed[-4000:]
    assert len(log) == 3 and any(entry["outcome"] == "killed" for entry in log), log
    faults = [entry for entry in log if entry["phase"] in kill_loop.FAULTS]
    assert len(faults) == 1 and faults[0]["outcome"] in ("refused", "not reached (the launch ended first)"), log


def test_the_hook_kills_at_the_chosen_commit_before_or_after_the_rename(tmp_path):
    """bench/killhook: the n-th os.replace whose destination matches dies before it (the old file stays) or
    after it (the new one is in place, the next write never happens); without the variables nothing changes."""
    import os
    import signal
    import subprocess

    writes = ("import sys; from lrlhf.utils.io import atomic_write_text\n"
              "for i in range(4): atomic_write_text(sys.argv[1] + f'/{i % 2}.txt', str(i))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(kill_loop.HOOK), str(ROOT / "src")])}
    cases = (("before", {"0.txt": "0", "1.txt": "1"}), ("after", {"0.txt": "2", "1.txt": "1"}),
             ("ENOSPC", {"0.txt": "0", "1.txt": "1"}), (None, None))
    for phase, expected in cases:
        folder = tmp_path / str(phase)
        folder.mkdir()
        extra = {"LRLHF_KILL_AT": rf"/0\.txt$|2|{phase}"} if phase else {}
        done = subprocess.run([sys.executable, "-c", writes, str(folder)], env={**env, **extra}, capture_output=True,
                              text=True)
        files = {p.name: p.read_text() for p in folder.iterdir() if not p.name.startswith(".")}
        if phase is None:
            assert done.returncode == 0 and files == {"0.txt": "2", "1.txt": "3"}
        elif phase == "ENOSPC":  # the storage refused the third write: the helper says so, the old file stays
            assert done.returncode == 1 and files == expected, (phase, files)
            assert f"StorageError: cannot write {folder}/0.txt: no space left" in done.stderr, done.stderr
        else:
            assert done.returncode == -signal.SIGKILL and files == expected, (phase, files)
