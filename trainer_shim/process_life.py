"""The process's life as the publishers see it: fork, signals, multiprocessing's exit, atexit.

Every publisher enrols here when it is made (``enrol``); what happens to the process then reaches
each one of this process: a fork gives the child clean publishers, SIGTERM and SIGINT write every
final tally before the signal takes effect, an exception that ends the process rewrites the tally
at once, and the interpreter's exit (``atexit``, or multiprocessing's own exit path, which skips
it) closes them. ``install()`` registers the hooks, once, when ``trainer_shim.publisher`` loads.
Nothing here raises into the trainer.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Protocol

from trainer_shim import exit_hooks

log = logging.getLogger("trainer_shim")

SIGTERM_WAIT_S = 0.5
"""The SIGTERM handler waits at most this long for a flush cycle in progress (a cycle never
blocks: its sends are non-blocking)."""

SIGTERM_ENV = "DFLASH_TELEMETRY_SIGTERM"
"""Set to ``0`` to leave SIGTERM and SIGINT alone (then a SIGTERMed process is told as
``ended_unclean``, its end as ``unclean``)."""


class Member(Protocol):
    """A publisher as its process's life sees it (``trainer_shim.publisher.Publisher``)."""

    _pid: int
    """The process the publisher belongs to (a forked child's copy belongs to the child only
    once its after-fork hook ran)."""

    def close(self) -> None: ...

    def _after_fork_in_child(self) -> None: ...

    def _tally_at_sigterm(self, final: bool) -> None: ...

    def _tally_on_seen(self) -> None: ...

    def _internal_error(self, what: str, exc: BaseException) -> None: ...


PUBLISHERS: weakref.WeakSet[Member] = weakref.WeakSet()
"""Every publisher of this process not yet garbage collected (closed ones included)."""

_Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None

_signals_pid: list[int] = []
"""The pid whose signal handlers are installed (a forked child installs its own)."""

_previous: dict[int, _Handler] = {}
"""Per signal number, the handler the shim's replaced (and chains to)."""


def enrol(publisher: Member) -> None:
    """Count ``publisher`` among this process's (weakly) and have multiprocessing's exit path
    close it."""
    PUBLISHERS.add(publisher)
    register_multiprocessing_exit(publisher)


def install_signal_handlers() -> None:
    """Once per process, from the main thread only: handlers for SIGTERM and SIGINT that note the
    signal (``exit_hooks``), write every publisher's final tally and then let the signal do
    what it did before: with the default disposition the process still dies of it (the handler
    restores it and re-raises), a Python handler of the trainer's own is called next. Never over
    SIG_IGN or a handler installed from C, off the main thread (Python cannot), or with
    ``DFLASH_TELEMETRY_SIGTERM=0``; never over Python's own SIGINT handler (code such as
    ``asyncio.run`` checks for it: its ``KeyboardInterrupt`` is told by ``exit_hooks`` instead).
    Caveat (docs/RELIABILITY.md): a Python handler runs between bytecodes, so a signal that
    arrives while the main thread is inside one long C call takes effect when that call returns."""
    pid = os.getpid()
    if _signals_pid == [pid] or os.environ.get(SIGTERM_ENV, "1") == "0":
        return
    if threading.current_thread() is not threading.main_thread():
        return
    _signals_pid[:] = [pid]
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            previous = signal.getsignal(signum)
            if previous is _on_signal:  # inherited across fork
                continue
            if previous is signal.default_int_handler or (previous is not signal.SIG_DFL and not callable(previous)):
                continue
            signal.signal(signum, _on_signal)
            _previous[int(signum)] = previous
        except Exception as exc:  # noqa: BLE001 - e.g. an embedded interpreter without signals
            log.debug("trainer_shim: no handler for signal %s: %r", int(signum), exc)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    previous = _previous.get(signum, signal.SIG_DFL)
    chained = callable(previous) and previous not in (signal.SIG_DFL, signal.SIG_IGN)
    # Called from a handler installed over ours (Lightning's, or any that calls the previous
    # handler when it is callable): where we replaced SIG_DFL there was nothing to call, so the
    # process's fate is that handler's, never ours.
    kills = not chained and signal.getsignal(signum) is _on_signal
    try:
        exit_hooks.note_signal(signum)
        for publisher in list(PUBLISHERS):
            if publisher._pid == os.getpid():
                publisher._tally_at_sigterm(final=kills)
    except Exception:  # noqa: BLE001 - the signal must still take effect
        pass
    if chained and callable(previous):
        previous(signum, frame)
        return
    if not kills:
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def child_suffix() -> str:
    """What a child process adds to its parent's worker label: ``loader<id>`` in a DataLoader
    worker (read only if the trainer imported torch), else ``pid<pid>``."""
    data = sys.modules.get("torch.utils.data")
    try:
        info = data.get_worker_info() if data is not None else None
    except Exception:  # noqa: BLE001
        info = None
    if info is not None:
        return f"loader{info.id}"
    return f"pid{os.getpid()}"


def in_multiprocessing_child() -> bool:
    """Whether this process is a multiprocessing child (read only if the trainer imported
    multiprocessing). Never raises."""
    process = sys.modules.get("multiprocessing.process")
    try:
        return process is not None and process.parent_process() is not None
    except Exception:  # noqa: BLE001
        return False


_said_unreachable: list[int] = []
"""The pid that said it reaches no daemon (a forked child says so again, for itself)."""


def say_unreachable_once(endpoint: str) -> None:
    """In a multiprocessing child, say once on stderr that records are being dropped because
    nothing subscribed at ``endpoint`` (its parent may have configured an endpoint the child
    never learnt of; the drops are counted as ``no_receiver``)."""
    pid = os.getpid()
    if pid in _said_unreachable or not in_multiprocessing_child():
        return
    _said_unreachable[:] = [pid]
    try:
        sys.stderr.write(f"trainer_shim: process {pid} reaches no daemon at {endpoint}: its "
                         "records are dropped and counted (no_receiver); set "
                         "DFLASH_SIDECAR_ENDPOINT or call telemetry.configure(endpoint=...) "
                         "before starting children\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - no stderr: the count still says it
        pass


def register_multiprocessing_exit(publisher: Member) -> None:
    """Have multiprocessing's exit path close ``publisher``: its children end with ``os._exit``
    after ``util._exit_function`` has run the registered finalizers, skipping ``atexit``. A
    child's ``_bootstrap`` clears the finalizers it inherited and then runs the after-fork
    hooks, so the finalizer is registered now (for this process) and again from an after-fork
    hook (for its multiprocessing children). Only if the trainer imported multiprocessing."""
    util = sys.modules.get("multiprocessing.util")
    if util is None:
        return
    try:
        util.Finalize(publisher, _close_if_alive, args=(weakref.ref(publisher),),
                      exitpriority=100)
        util.register_after_fork(publisher, register_multiprocessing_exit)
    except Exception as exc:  # noqa: BLE001
        publisher._internal_error("cannot register with multiprocessing", exc)


def _close_if_alive(ref: weakref.ref[Member]) -> None:
    """multiprocessing's exit path (``util._exit_function``, run before ``os._exit`` in every
    multiprocessing child): send what is queued, bounded like ``close``."""
    publisher = ref()
    if publisher is not None and publisher._pid == os.getpid():
        exit_hooks.note_in_flight()  # the exception or SystemExit leaving the child's run()
        publisher.close()


def _after_fork_in_child() -> None:
    for publisher in list(PUBLISHERS):
        publisher._after_fork_in_child()


def _tally_all_on_seen() -> None:
    for publisher in list(PUBLISHERS):
        publisher._tally_on_seen()


def _close_all_at_exit() -> None:
    for publisher in list(PUBLISHERS):
        if publisher._pid == os.getpid():
            publisher.close()


def install() -> None:
    """Register the process's hooks: after fork, at exit, on an exception that ends it. Called
    once, at the end of loading ``trainer_shim.publisher``: after the modules it loads, whose
    own after-fork hooks (the capture state, the GPU scalars, the exit hooks) then run first."""
    os.register_at_fork(after_in_child=_after_fork_in_child)
    atexit.register(_close_all_at_exit)
    exit_hooks.on_seen(_tally_all_on_seen)
