"""What the shim sees of its process's end, for the daemon to tell how a sender ended.

Observations, none of which changes what the trainer does, and all made only as the process (or
a thread) dies, never on the hot path:

- the terminating signal the shim's SIGTERM/SIGINT handling saw (``note_signal``), written into
  the final tally so the daemon tells the end as ``terminated``;
- an uncaught exception: ``sys.excepthook`` and ``threading.excepthook``, each chained to the hook
  before it (the trainer's own runs, always, after the shim's note), and in a multiprocessing
  child the exception in flight when its exit path closes the publisher (``note_in_flight``: its
  ``run()``'s exception or ``SystemExit`` never reaches a hook). ``exit_causes`` tells what it
  means (``exception``, ``cuda_oom``, ``host_oom``, ``nccl``...) and its detail (type and first
  line, cut; never a traceback or locals). A ``KeyboardInterrupt`` that ends the process is
  SIGINT's doing;
- the exit status: ``exit_status`` has the C library write it beside the tally as the process
  exits (``sys.exit(2)``, ``raise SystemExit``, the status 1 of an uncaught exception);
- a fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL): ``faulthandler`` is pointed at a crash
  file beside the tally (``wire.CRASH_SUFFIX``) when the trainer has not enabled it itself.
  faulthandler's handler is C, async-signal-safe and bounded (it writes the traceback with
  ``write(2)`` and re-raises the signal with its previous disposition); no Python runs in it.
  A trainer that enables faulthandler itself, before or after, keeps it: the shim never
  re-points a faulthandler it did not enable.

A hook the trainer installs later without chaining replaces the shim's (then the exception is not
told; its exit status still is). Everything here is best effort and never raises into the trainer.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from trainer_shim import exit_causes

log = logging.getLogger("trainer_shim")

Seen = tuple[int, str, str, int, str]
"""``(signal, cause, detail, gpu, thread)`` as the tally carries them (``wire.Tally``)."""

_seen: dict[str, Any] = {"pid": None, "signal": 0, "cause": "", "detail": "", "gpu": -1, "thread": ""}
"""The signal and exception this process saw (reset in a forked child, by pid)."""
_hook: dict[str, Any] = {"pid": None, "previous": None, "thread_previous": None}
_crash: dict[str, Any] = {"pid": None, "file": None, "refs": 0}
"""The crash file faulthandler writes to, if the shim enabled it: ``refs`` is the file object's
reference count with faulthandler holding it (see ``_faulthandler_is_ours``)."""
_listeners: list[Callable[[], None]] = []


def _mine() -> dict[str, Any]:
    pid = os.getpid()
    if _seen["pid"] != pid:
        _seen.update(pid=pid, signal=0, cause="", detail="", gpu=-1, thread="")
    return _seen


def note_signal(signum: int) -> None:
    """Remember that ``signum`` (SIGTERM or SIGINT) reached this process (async-safe enough: a
    dict update, called from a Python signal handler)."""
    _mine()["signal"] = int(signum)


def seen() -> Seen:
    """``(signal, cause, detail, gpu, thread)`` this process saw: the terminating signal (0:
    none); what ended it (``exit_causes.CAUSES``, empty: nothing seen), its detail and the GPU an
    out-of-memory error names (-1: none); ``thread``: the name of the thread whose exception the
    cause tells, when no exception ended the process itself (empty otherwise)."""
    s = _mine()
    return s["signal"], s["cause"], s["detail"], s["gpu"], s["thread"]


def on_seen(callback: Callable[[], None]) -> None:
    """Call ``callback`` (no arguments; it must not raise) whenever what this process saw of its
    end changes: the publisher rewrites its tally, so that a process that then dies without a
    final one (``os._exit`` from a trainer's hook) still tells it."""
    _listeners.append(callback)


def note_exception(exc: BaseException | None, thread: str = "") -> None:
    """Remember ``exc`` as what ends this process (``thread`` empty), or as what ended the thread
    named ``thread`` (kept only while nothing ended the process itself). ``SystemExit`` tells its
    status, ``KeyboardInterrupt`` SIGINT. Never raises."""
    try:
        if exc is None:
            return
        state = _mine()
        if thread and state["cause"]:
            return  # the process's own end, or an earlier thread's, is told already
        if isinstance(exc, SystemExit):
            if thread:
                return  # a thread's SystemExit ends the thread only, silently
            cause, detail = exit_causes.exit_detail(exc.code)
            gpu = -1
        else:
            cause, detail, gpu = exit_causes.classify(exc)
            if cause == "signal" and not state["signal"] and not thread:
                state["signal"] = int(signal.SIGINT)  # Python's own SIGINT handler raised it
        if not cause:
            return
        state.update(cause=cause, detail=detail, gpu=gpu, thread=exit_causes.cut(thread, 64))
    except Exception:  # noqa: BLE001
        return
    for callback in list(_listeners):
        try:
            callback()
        except Exception:  # noqa: BLE001
            pass


def note_in_flight() -> None:
    """In a multiprocessing child's exit path (run inside ``Process._bootstrap``'s ``finally``):
    the exception leaving ``run()``, ``SystemExit`` included, is the one in flight."""
    if _mine()["cause"] and not _seen["thread"]:
        return
    note_exception(sys.exc_info()[1])


def install_excepthook() -> None:
    """Once per process: chain ``sys.excepthook`` and ``threading.excepthook`` to note the
    uncaught exception. A hook the trainer installs later replaces the shim's (then it is not
    told; the exit status still is)."""
    pid = os.getpid()
    if _hook["pid"] == pid:
        return
    _hook["pid"] = pid
    if sys.excepthook is not _excepthook:
        _hook["previous"] = sys.excepthook
        sys.excepthook = _excepthook
    if threading.excepthook is not _thread_excepthook:
        _hook["thread_previous"] = threading.excepthook
        threading.excepthook = _thread_excepthook


def _excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    note_exception(value)
    previous = _hook["previous"]
    (previous if callable(previous) and previous is not _excepthook else sys.__excepthook__)(kind, value, tb)


def _thread_excepthook(args: threading.ExceptHookArgs) -> None:
    thread = getattr(args, "thread", None)
    note_exception(getattr(args, "exc_value", None), getattr(thread, "name", None) or "thread")
    previous = _hook["thread_previous"]
    hook = previous if callable(previous) and previous is not _thread_excepthook else threading.__excepthook__
    hook(args)


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
