"""Exclusive locks a launch holds on what it owns: its run folder, a stage it is building into the cache.

The lock is the operating system's (``filelock``: ``fcntl.flock`` on POSIX), held on an open file and released by
the kernel when its process ends, however it ends: a launch killed midway leaves nothing to clear, and the next
launch takes the lock over at once. Who holds it (host, pid, since when) is written beside it, for the message of
the launch that finds it held. The lock file itself stays (removing a lock file another process may have opened is
a race); it is empty.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from filelock import FileLock, Timeout

from lrlhf.utils.io import atomic_write_text


class OwnedLock:
    """An exclusive lock at ``path`` with its owner written to ``<path>.owner`` while held."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.owner_file = self.path.with_name(self.path.name + ".owner")
        self._lock = FileLock(str(self.path))

    @property
    def held(self) -> bool:
        """Whether this object holds it."""
        return self._lock.is_locked

    def acquire(self, timeout: float = 0, poll: float = 1.0) -> bool:
        """Take the lock, waiting up to ``timeout`` seconds (0: only if free now; None: as long as it takes);
        whether it was taken."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire(timeout=-1 if timeout is None else timeout, poll_interval=poll)
        except Timeout:
            return False
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        atomic_write_text(self.owner_file, f"pid {os.getpid()} on {socket.gethostname()}, since {stamp}\n")
        return True

    def owner(self) -> str:
        """Who holds it, as its owner wrote it ("unknown" when it wrote nothing yet)."""
        try:
            return self.owner_file.read_text().strip() or "unknown"
        except OSError:
            return "unknown"

    def release(self) -> None:
        if self._lock.is_locked:
            self.owner_file.unlink(missing_ok=True)
            self._lock.release()


__all__ = ["OwnedLock"]
