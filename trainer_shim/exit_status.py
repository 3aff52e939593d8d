"""The process's exit status, written down by the C library as the process exits.

Python runs ``atexit`` (where the shim writes its final tally) before it knows, or says, the
status the process will exit with: a ``sys.exit(2)`` or a ``raise SystemExit("message")`` has been
handled and cleared by then, and neither reaches ``sys.excepthook``. The C library knows it: glibc
calls the functions registered with ``on_exit(3)`` with the status given to ``exit(3)``, after
the interpreter has finalized. So the shim registers ``putw(status, stream)`` (a C library
function: no Python runs at that point) on a stream that writes into a small file beside the
tally, ``<pid>-<start ticks>-<random>.exit`` (``wire.EXIT_SUFFIX``).

The stream is ``fmemopen(3)`` over a shared mapping of the file: at exit the status is copied into
memory the kernel writes back, with no file descriptor involved (a trainer that closes descriptors
it did not open cannot make it write into another file). The file is ``EXIT_FILE_BYTES`` long and
holds ``wire.EXIT_UNSET`` until the process exits through ``exit(3)``; then its first four bytes are
the status as a native ``int``. No write happens, and the file keeps ``EXIT_UNSET``, when the
process ends otherwise: ``os._exit`` (multiprocessing's children: ``exit_hooks`` reads their
exception instead), a signal, a crash.

A forked child inherits the registration and the mapping: ``_after_fork_in_child`` replaces the
child's copy of the mapping with a private anonymous page at the same address (so the child's exit
writes into its own memory, not its parent's file); the child arms its own file with its own tally.
A fork made in C by an extension, without ``exec``, runs no Python hook: its ``exit`` would write
its status into its parent's file.

Where the C library has no ``on_exit`` (musl), with ``DFLASH_TELEMETRY_EXIT_STATUS=0``, or where
anything here fails, nothing is armed and the daemon falls back to what ``exit_hooks`` saw.
Everything here is best effort, runs once per process (never on the trainer's hot path) and never
raises.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from trainer_shim import wire

log = logging.getLogger("trainer_shim")

_armed: dict[str, Any] = {"pid": None, "stream": None, "address": None}
ENV = "DFLASH_TELEMETRY_EXIT_STATUS"
"""Set to ``0`` to arm nothing (then a ``sys.exit(2)`` reads ``clean``; an uncaught exception is
still told by ``exit_hooks``)."""
_MAP_FIXED = 0x10
"""Linux's ``MAP_FIXED`` (Python's ``mmap`` module does not name it)."""


def arm(path: str) -> bool:
    """Create the exit-status file ``path`` (``O_EXCL | O_NOFOLLOW``, mode 0640) and register its
    writer with ``on_exit``, once per process. Returns whether it is armed. Never raises."""
    if _armed["pid"] == os.getpid():
        return _armed["stream"] is not None
    _armed.update(pid=os.getpid(), stream=None, address=None)
    if os.environ.get(ENV, "1") == "0":
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        on_exit, putw = libc.on_exit, libc.putw  # AttributeError where the C library lacks them
    except (OSError, AttributeError) as exc:
        log.debug("trainer_shim: no exit status: %r", exc)
        return False
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
    except OSError as exc:
        log.debug("trainer_shim: no exit-status file in %s: %s", os.path.dirname(path), exc.strerror)
        return False
    try:
        os.fchmod(fd, 0o640)
        os.write(fd, wire.EXIT_UNSET)
        mapped = _stream_over(libc, fd)
        if mapped is None:
            return False
        stream, _armed["address"] = mapped
        on_exit.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        if on_exit(ctypes.cast(putw, ctypes.c_void_p), ctypes.c_void_p(stream)) != 0:
            return False
        _armed["stream"] = stream
        return True
    except Exception as exc:  # noqa: BLE001
        log.debug("trainer_shim: exit status not armed: %r", exc)
        return False
    finally:
        os.close(fd)  # the mapping stays: no descriptor is left open


def _stream_over(libc: Any, fd: int) -> tuple[int, int] | None:
    """An unbuffered ``fmemopen`` stream over a shared mapping of the file's first bytes, and the
    mapping's address; None if either cannot be made."""
    import ctypes

    size = len(wire.EXIT_UNSET)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    import mmap

    address = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        return None
    libc.fmemopen.restype = ctypes.c_void_p
    libc.fmemopen.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    stream = libc.fmemopen(ctypes.c_void_p(address), size, b"r+")
    if not stream:
        return None  # the mapping is left: a few bytes, once
    libc.setvbuf.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t]
    libc.setvbuf(ctypes.c_void_p(stream), None, 2, 0)  # _IONBF: each write goes to the mapping at once
    return int(stream), int(address)


def _after_fork_in_child() -> None:
    """The parent's stream, inherited with its ``on_exit`` registration, writes into the page
    mapped from the parent's file: the child maps a private, anonymous page at the same address
    (``MAP_FIXED``), so that its exit writes nothing into its parent's file."""
    address = _armed["address"]
    _armed.update(pid=None, stream=None, address=None)
    if address is None:
        return
    try:
        import ctypes
        import mmap

        libc = ctypes.CDLL(None)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.mmap(ctypes.c_void_p(address), len(wire.EXIT_UNSET), mmap.PROT_READ | mmap.PROT_WRITE,
                  mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED, -1, 0)
    except Exception:  # noqa: BLE001
        pass


os.register_at_fork(after_in_child=_after_fork_in_child)
