"""A SIGTERM to a launch outside training: the launch stops at once, or, inside a Trainer run, at its next safe point.

Inside ``fit`` the clean stop (:class:`lrlhf.callbacks.StopOnSignal`) owns SIGTERM and SIGINT: it stops at the next
safe point with a checkpoint. Elsewhere in a launch (building the world, sampling pairs or an evaluation, exporting)
there is nothing to save mid-way, and SIGTERM's default action ended the process without a word. Inside a Trainer
run that does not train (a stage's held-out test loop, :mod:`lrlhf.modules.reward_eval`) Lightning composes its own
handler with the one it finds and raises its ``SIGTERMException`` before the loop's next batch, but not after the
last: its flag then died with the Trainer and the launch went on into the next stage (seen 2026-12-06: a launch
signalled during its RM's test built the RM, then started PPO). So a one-process launch holds :func:`handled`:

1. while this is SIGTERM's handler (no Trainer has taken the signal), it raises :class:`Stopped` at once, a
   ``SystemExit`` with status 143: a stage being built is dropped (its building folder removed, its lock released).
   Not a ``KeyboardInterrupt``: Lightning turns one raised while it sets a run up into ``sys.exit(1)``, a failure.
2. when Lightning's handler calls it (inside a Trainer run), it only records the signal: the next ``fit`` of the
   launch takes it over (:func:`take_pending`, by the clean stop: a checkpoint at the first safe point), and
   :func:`stop_if_signalled` raises it once the stage in hand is built into the cache, or before the launch's own
   policy samples its comparison with SFT.
"""

from __future__ import annotations

import contextlib
import signal
import threading

_pending: int | None = None
_installed = False


class Stopped(SystemExit):
    """The launch was stopped by a signal (``signum``) outside training: exit status 128 + ``signum``."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum

    def __str__(self) -> str:
        return signal.Signals(self.signum).name

    def __reduce__(self):  # raised in a worker process, re-raised in the launch
        return type(self), (self.signum,)


def _handle(signum: int, frame) -> None:
    global _pending
    if signal.getsignal(signum) is _handle:  # no Trainer run holds the signal: nothing to finish first
        raise Stopped(signum)
    _pending = signum  # called by Lightning's composed handler: the Trainer's run goes on to a safe point


def install(replace: bool = False) -> bool:
    """SIGTERM's handler for this process (main thread only; a handler already set is kept unless ``replace``).
    Returns whether it is set."""
    global _pending, _installed
    if threading.current_thread() is not threading.main_thread():
        return False
    if not replace and signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, _handle):
        return False
    _pending, _installed = None, True
    signal.signal(signal.SIGTERM, _handle)
    return True


@contextlib.contextmanager
def handled(enabled: bool = True):
    """:func:`install` for the block (when ``enabled``), the previous handler back after it."""
    global _installed
    previous = signal.getsignal(signal.SIGTERM)
    installed = enabled and install()
    try:
        yield
    finally:
        if installed:
            _installed = False  # a signal recorded and not taken counts no more (install clears it too)
            if signal.getsignal(signal.SIGTERM) is _handle:
                signal.signal(signal.SIGTERM, previous)


def take_pending() -> int | None:
    """The SIGTERM recorded inside a Trainer run since the last check, now taken (None if none)."""
    global _pending
    signum, _pending = _pending, None
    return signum if _installed else None


def stop_if_signalled() -> None:
    """Raise :class:`Stopped` if a SIGTERM arrived inside a Trainer run since the last check."""
    signum = take_pending()
    if signum is not None:
        raise Stopped(signum)


__all__ = ["Stopped", "handled", "install", "stop_if_signalled", "take_pending"]
