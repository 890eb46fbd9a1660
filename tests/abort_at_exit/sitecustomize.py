"""On PYTHONPATH of a multi-process test launch (tests/test_cli_ranks.py): a process of the launch that reaches the
interpreter's teardown aborts there (SIGABRT), as a rank did when a C++ thread of torch or gloo outlived it
("terminate called without an active exception", CI 2026-11-30 and 2026-12-05). A finished run must leave before
teardown (``lrlhf.run.cli._leave_launched_process``), so the launch still succeeds; the launcher (no WORLD_SIZE of
its own) is left alone."""

import atexit
import os


def _abort_if_a_rank() -> None:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        os.write(2, b"abort_at_exit: a rank reached the interpreter's teardown\n")
        os.abort()


atexit.register(_abort_if_a_rank)
