"""``rounds/annotator=web``: a round of iterative RLHF labelled by people on the labelling page.

The round writes its to-label file as :class:`~lrlhf.eval.annotators.FileExchange` does, serves the page for it
(:class:`~lrlhf.labelling.app.Server`) and prints the address; once ``budget`` pairs (all by default) have a
decision the page writes the labelled file, the server stops and the round goes on with those labels. A round
stopped while waiting resumes with ``ckpt_path=last``: the labels already given are in the annotators' logs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from lrlhf.eval.annotators import FileExchange, Pair, read_labels
from lrlhf.labelling.app import LOOPBACK, MIN_TOKEN, Server, need_web
from lrlhf.labelling.store import LabelStore


class WebLabelling(FileExchange):
    """People label a round on the page; ``timeout_seconds`` None waits for them without limit."""

    built_when_planning = True  # cheap: planning builds it (and so checks flask is there) before any work

    def __init__(self, folder: str, host: str = "127.0.0.1", port: int = 8765, token: str | None = None,
                 budget: int | None = None, checks: str | None = None, timeout_seconds: float | None = None,
                 seed: int = 0, linger_seconds: float = 2.0):
        need_web()
        if host not in LOOPBACK and not token:
            raise ValueError(f"rounds.annotator.host={host!r} serves the page beyond this machine: set "
                             "rounds.annotator.token")
        if token is not None and len(token) < MIN_TOKEN:
            raise ValueError(f"rounds.annotator.token has {len(token)} characters: give at least {MIN_TOKEN}")
        if budget is not None and budget < 1:
            raise ValueError(f"rounds.annotator.budget must be >= 1 (or null: every pair), got {budget}")
        super().__init__(folder, timeout_seconds=0.0)
        self.host, self.port, self.token = host, port, token
        self.budget, self.checks, self.wait_seconds, self.seed = budget, checks, timeout_seconds, seed
        self.linger_seconds = linger_seconds

    def label(self, pairs: Sequence[Pair], round_index: int) -> list[float | None]:
        out, back = self.write_pairs(pairs, round_index)
        store = LabelStore(out, checks=self.checks, seed=self.seed,
                           budget=None if self.budget is None else min(self.budget, len(pairs)))
        # the budget of decisions with at least one label; an undo may have taken a labelled file below it
        if not store.complete.is_set():
            server = Server(store, self.host, self.port, self.token).start()
            print(f"rounds: label round {round_index}'s {len(pairs)} pairs at {server.url} "
                  f"(the round goes on once {store.budget} have a decision)", flush=True)
            started = time.monotonic()
            try:
                while not store.complete.wait(timeout=1.0):
                    if self.wait_seconds is not None and time.monotonic() - started > self.wait_seconds:
                        raise TimeoutError(
                            f"rounds.annotator: {self.wait_seconds} s passed before {store.budget} pairs of {out} "
                            f"were labelled at {server.url}; the labels given are kept in {store.log_dir}: "
                            "resume with ckpt_path=last")
                time.sleep(self.linger_seconds)  # the last label's page (all done) still reaches the browser
            finally:
                server.stop()
        return read_labels(back, pairs)


__all__ = ["WebLabelling"]
