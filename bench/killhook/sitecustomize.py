"""Imported at start-up by the launches of bench/kill_loop.py (their PYTHONPATH): SIGKILL this process at a chosen
commit of an atomic write, or log every commit.

Every atomic write of lrlhf ends in ``os.replace`` (checkpoints and ``last.ckpt``, the two renames of an export's
folder swap, a stage's cache registration, a round's and a labelled file, summaries, JSON lines). With
``LRLHF_KILL_AT="<regex>|<n>|<before or after>"`` this process kills itself at the n-th ``os.replace`` whose
destination matches ``regex`` (``re.search``), just before the rename (the new bytes complete and fsynced, not yet in
place) or just after it (in place, nothing after it done: the folder's fsync, the next rename of a swap, the
bookkeeping). A phase that names a storage errno (``ENOSPC``, ``EROFS``, ``EACCES``) raises that ``OSError`` in place
of the rename instead: the storage refusing the write (bench/kill_loop.py's storage faults). With
``LRLHF_REPLACE_LOG=<file>`` it appends each destination to that file, one per line. Nothing else changes: without
either variable this module does nothing.
"""

import errno
import os
import re
import signal

_SPEC = os.environ.get("LRLHF_KILL_AT")
_LOG = os.environ.get("LRLHF_REPLACE_LOG")

if _SPEC or _LOG:
    _real_replace = os.replace
    _pattern, _nth, _phase = _SPEC.rsplit("|", 2) if _SPEC else ("(?!)", "0", "before")
    _regex, _nth, _seen = re.compile(_pattern), int(_nth), 0
    _FAULTS = {"ENOSPC": errno.ENOSPC, "EROFS": errno.EROFS, "EACCES": errno.EACCES}
    if _phase not in ("before", "after", *_FAULTS):
        raise SystemExit(f"LRLHF_KILL_AT={_SPEC!r}: the phase is 'before', 'after' or one of {', '.join(_FAULTS)}")

    def _replace(src, dst, *args, **kwargs):
        global _seen
        target = os.fsdecode(os.fspath(dst))
        if _LOG:
            with open(_LOG, "a") as f:
                f.write(target + "\n")
        hit = False
        if _regex.search(target):
            _seen += 1
            hit = _seen == _nth
        if hit and _phase == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        if hit and _phase in _FAULTS:
            raise OSError(_FAULTS[_phase], os.strerror(_FAULTS[_phase]), target)
        _real_replace(src, dst, *args, **kwargs)
        if hit and _phase == "after":
            os.kill(os.getpid(), signal.SIGKILL)

    os.replace = _replace
