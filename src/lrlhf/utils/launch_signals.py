"""A SIGTERM to a launch outside training: the launch stops at once, or, inside a Trainer that does not train, as
soon as that Trainer's run ends.

Inside ``fit`` the clean stop (:class:`lrlhf.callbacks.StopOnSignal`) owns SIGTERM and SIGINT: it stops at the next
safe point with a checkpoint. Elsewhere in a launch (building the world, sampling pairs or an evaluation, exporting)
there is nothing to save mid-way, and SIGTERM's default action ended the process without a word. Inside a Trainer
run that does not train (a stage's held-out test loop, :mod:`lrlhf.modules.reward_eval`) Lightning composes its own
handler with the one it finds and raises its ``SIGTERMException`` before the loop's next batch, but not after the
last: its flag then died with the Trainer and the launch went on into the next stage (seen 2026-12-06: a launch
signalled during its RM's test built the RM, then started PPO). So a single-process launch installs :func:`install`:

1. while it is SIGTERM's handler (no Trainer run holds the signal), it raises :class:`Stopped` at once: a stage
   being built is dropped (its building folder removed, its lock released) and the launch exits 143;
2. when Lightning's handler calls it (inside a Trainer run), it only records the signal; :func:`stop_if_signalled`
   raises it at the next check: once the stage in hand is built into the cache, or before a comparison's sampling.
"""

from __future__ import annotations

import contextlib
import signal
import threading

_pending: int | None = None


class Stopped(KeyboardInterrupt):
    """The launch was stopped by a signal (``signum``) outside training; it exits with 128 + ``signum``."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    def __reduce__(self):  # raised in a worker process, re-raised in the launch
        return type(self), (self.signum,)


def _handle(signum: int, frame) -> None:
    global _pending
    if signal.getsignal(signum) is _handle:  # no Trainer run holds the signal: nothing to finish first
        raise Stopped(signum)
    _pending = signum  # called by Lightning's composed handler: the Trainer's run goes on to its end


def install() -> bool:
    """SIGTERM's handler for this process (main thread only; a handler already set is kept). Returns whether set."""
    global _pending
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, _handle):
        return False
    _pending = None
    signal.signal(signal.SIGTERM, _handle)
    return True


@contextlib.contextmanager
def handled(enabled: bool = True):
    """:func:`install` for the block (when ``enabled``), the previous handler back after it."""
    global _pending
    previous = signal.getsignal(signal.SIGTERM)
    installed = enabled and install()
    try:
        yield
    finally:
        if installed and signal.getsignal(signal.SIGTERM) is _handle:
            signal.signal(signal.SIGTERM, previous)
            _pending = None


def stop_if_signalled() -> None:
    """Raise :class:`Stopped` if a SIGTERM arrived inside a Trainer run since the last check."""
    global _pending
    signum, _pending = _pending, None
    if signum is not None:
        raise Stopped(signum)


__all__ = ["Stopped", "handled", "install", "stop_if_signalled"]
