"""The iterative loop's labelling round completed on the page: ``recipe=iterative_ppo rounds/annotator=web`` on the
toy world serves round 2's pairs, a person (here a script posting the page's own form) labels them, and the round
goes on with exactly those labels to the end of the run."""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("flask", reason="the labelling page needs flask: pip install 'lrlhf[label]'")

ROOT = Path(__file__).resolve().parents[2]
TINY = ["recipe=iterative_ppo", "logger=csv", "world=toy_tiny", "world.sizes.pref_train=40", "rounds.settings.n=2",
        "rounds.settings.initial_labels=40", "rounds.settings.labels_per_round=12", "rounds.settings.ppo_steps=4",
        "rounds.settings.rm_steps=6", 'stage_overrides.sft=["trainer.max_steps=6"]', "data.batch_size=8",
        "module.config.minibatch_size=8", "callbacks.early_stopping.every_n_rollouts=1",
        "callbacks.early_stopping.patience=null"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_round_of_iterative_rlhf_is_labelled_on_the_page(tmp_path):
    run, port = tmp_path / "run", _free_port()
    env = {**os.environ, "LRLHF_CACHE_DIR": str(tmp_path / "cache"), "WANDB_MODE": "offline",
           "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, "train.py", *TINY, "rounds/annotator=web", f"rounds.annotator.port={port}",
                             f"hydra.run.dir={run}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines, announced = [], threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if "rounds: label round 2" in line:
                announced.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert announced.wait(timeout=600), "".join(lines[-60:])
        url = re.search(r"at (http://\S+)", next(x for x in lines if "rounds: label round 2" in x)).group(1)
        assert url == f"http://127.0.0.1:{port}/"
        given = {}
        while True:
            state = json.loads(urllib.request.urlopen(url + "api/state/bob").read())
            if state["current"] is None:
                break
            page = urllib.request.urlopen(url + "label/bob").read().decode()
            key = re.search(r'name="key" value="([^"]+)"', page).group(1)  # the page's own form
            assert key == state["current"]
            choice = "left" if int(key) % 2 else "right"
            urllib.request.urlopen(url + "label/bob", data=urllib.parse.urlencode({"key": key, "choice": choice})
                                   .encode()).read()
            given[int(key)] = choice
        assert proc.wait(timeout=600) == 0, "".join(lines[-60:])
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(timeout=10)
    out = "".join(lines)
    assert "== lrlhf iterative: done ==" in out
    labelled = [json.loads(x) for x in (run / "labelling" / "round_2.labelled.jsonl").read_text().splitlines()]
    assert sorted(given) == [r["id"] for r in labelled]
    for row in labelled:  # the page's left / right mapped to the written chosen / rejected by the recorded order
        (note,) = row["annotations"]
        on_left = note["left"] == "chosen"
        assert row["label"] == (1.0 if (given[row["id"]] == "left") == on_left else 0.0)
    labels = [json.loads(x) for x in (run / "round_2" / "labels.jsonl").read_text().splitlines()]
    assert len(labels) == len(labelled) and {r["round"] for r in labels} == {2}
    with pytest.raises(urllib.error.URLError):  # the round stopped the page once the budget was labelled
        urllib.request.urlopen(url, timeout=5)
