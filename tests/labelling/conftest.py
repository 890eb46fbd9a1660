"""The labelling page as a user runs it: ``python -m lrlhf.labelling label FILE`` in a subprocess on a free port,
started again on the same port after a kill (``LabelServer``)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class LabelServer:
    def __init__(self, file: Path, *args: str):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.file, self.args, self.proc = file, args, None
        self.url = f"http://127.0.0.1:{self.port}/"

    def start(self) -> "LabelServer":
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        self.proc = subprocess.Popen([sys.executable, "-m", "lrlhf.labelling", "label", str(self.file), "--port",
                                      str(self.port), *self.args], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(self.url, timeout=2).read()
                return self
            except urllib.error.HTTPError as err:
                raise RuntimeError(f"the page answered {err.code}: {self.proc.stdout.read()}") from err
            except (urllib.error.URLError, ConnectionError, OSError):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the server stopped: {self.proc.stdout.read()}") from None
                time.sleep(0.05)
        raise TimeoutError("the labelling server did not answer within 60 s")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()
        if self.proc is not None:
            self.proc.stdout.close()


@pytest.fixture
def label_server():
    servers = []

    def serve(file: Path, *args: str) -> LabelServer:
        server = LabelServer(file, *args)
        servers.append(server)
        return server.start()

    yield serve
    for server in servers:
        server.stop()


def write_pairs(path: Path, n: int, answers=None) -> list[dict]:
    """``n`` pairs in the to-label format (``answers(i) -> (chosen, rejected)`` when given)."""
    rows = []
    for i in range(n):
        chosen, rejected = answers(i) if answers else (f"good answer {i}", f"bad answer {i}")
        rows.append({"id": i, "prompt": f"Question {i}: which answer is better?",
                     "chosen": [{"role": "assistant", "content": chosen}],
                     "rejected": [{"role": "assistant", "content": rejected}], "label": None})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows
