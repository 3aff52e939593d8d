"""What the shim sees of its process's end, for the daemon to tell how a sender ended.

Three observations, none of which changes what the trainer does:

- the terminating signal the shim's SIGTERM/SIGINT handling saw (``note_signal``), written into
  the final tally so the daemon books the end as ``terminated``;
- the type of an uncaught exception (``sys.excepthook``, chained to the one before it): a
  ``KeyboardInterrupt`` that ends the process is SIGINT's doing;
- a fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL): ``faulthandler`` is pointed at a crash
  file beside the tally (``wire.CRASH_SUFFIX``) when the trainer has not enabled it itself.
  faulthandler's handler is C, async-signal-safe and bounded (it writes the traceback with
  ``write(2)`` and re-raises the signal with its previous disposition); no Python runs in it.
  A trainer that enables faulthandler itself, before or after, keeps it: the shim never
  re-points a faulthandler it did not enable.

Everything here is best effort and never raises into the trainer.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
from typing import Any

log = logging.getLogger("trainer_shim")

_seen: dict[str, Any] = {"pid": None, "signal": 0, "detail": ""}
"""The signal and exception this process saw (reset in a forked child, by pid)."""
_hook: dict[str, Any] = {"pid": None, "previous": None}
_crash: dict[str, Any] = {"pid": None, "file": None, "refs": 0}
"""The crash file faulthandler writes to, if the shim enabled it: ``refs`` is the file object's
reference count with faulthandler holding it (see ``_faulthandler_is_ours``)."""


def _mine() -> dict[str, Any]:
    pid = os.getpid()
    if _seen["pid"] != pid:
        _seen.update(pid=pid, signal=0, detail="")
    return _seen


def note_signal(signum: int) -> None:
    """Remember that ``signum`` (SIGTERM or SIGINT) reached this process (async-safe enough: a
    dict update, called from a Python signal handler)."""
    _mine()["signal"] = int(signum)


def seen() -> tuple[int, str]:
    """``(signal, detail)`` this process saw: the terminating signal (0: none) and the type of
    the uncaught exception that ends it (empty: none)."""
    state = _mine()
    return state["signal"], state["detail"]


def install_excepthook() -> None:
    """Once per process: chain ``sys.excepthook`` to note the uncaught exception's type. A hook
    the trainer installs later replaces this one (then the type is not told)."""
    if _hook["pid"] == os.getpid() or sys.excepthook is _excepthook:
        _hook["pid"] = os.getpid()
        return
    _hook.update(pid=os.getpid(), previous=sys.excepthook)
    sys.excepthook = _excepthook


def _excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
    try:
        state = _mine()
        state["detail"] = getattr(kind, "__name__", "exception")[:64]
        if issubclass(kind, KeyboardInterrupt) and not state["signal"]:
            state["signal"] = int(signal.SIGINT)  # Python's own SIGINT handler raised it
    except Exception:  # noqa: BLE001 - the trainer's hook must run whatever happens here
        pass
    previous = _hook["previous"]
    (previous if callable(previous) else sys.__excepthook__)(kind, value, tb)


def arm_crash_file(path: str) -> None:
    """Point faulthandler at a new file ``path`` (created ``O_EXCL | O_NOFOLLOW``, mode 0640), for
    every thread, unless the trainer enabled faulthandler itself or it is armed already in this
    process. Never raises."""
    if _crash["pid"] == os.getpid() or faulthandler.is_enabled():
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
    except OSError as exc:
        log.debug("trainer_shim: no crash file in %s: %s", os.path.dirname(path), exc.strerror)
        return
    try:
        os.fchmod(fd, 0o640)
        _crash.update(pid=os.getpid(), file=os.fdopen(fd, "wb", buffering=0), refs=-1)
        before = _refcount()
        faulthandler.enable(file=_crash["file"], all_threads=True)
        after = _refcount()
        if after > before:  # else not a CPython that keeps the file: we could not tell it is ours
            _crash["refs"] = after
    except Exception as exc:  # noqa: BLE001
        log.debug("trainer_shim: faulthandler not armed: %r", exc)


def _refcount() -> int:
    return sys.getrefcount(_crash["file"])


def _faulthandler_is_ours() -> bool:
    """Whether faulthandler still writes to the crash file: faulthandler holds a reference to the
    file object it writes to, and drops it when anyone enables it again with another file."""
    if _crash["file"] is None or _crash["refs"] <= 0:
        return False
    return faulthandler.is_enabled() and _refcount() >= _crash["refs"]


def _after_fork_in_child() -> None:
    """A forked child must not write its crash into its parent's file: disable the shim's
    faulthandler (the child arms its own with its first tally); a trainer's stays as it is."""
    if _crash["file"] is None:
        return
    try:
        if _faulthandler_is_ours():
            faulthandler.disable()
    except Exception:  # noqa: BLE001
        pass
    _crash.update(pid=None, file=None, refs=0)


os.register_at_fork(after_in_child=_after_fork_in_child)
