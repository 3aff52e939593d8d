"""The shim's side of the sender's tally: one small file per publisher, beside the daemon's socket.

The flusher rewrites it after every flush cycle that changed a total (never per record): per
channel, records handed to the transport, records still queued, drops by reason. The daemon reads
it once the process is gone (or closed its publisher) and reconciles it with what arrived, so the totals
survive the process and the link: an exit while the daemon is behind, a SIGTERM, a SIGKILL. The
format is ``trainer_shim.wire``'s (``Tally``); the directory is ``endpoint.tally_dir``, created
by the daemon. Everything here is best effort and never raises: no directory (no daemon has bound
this socket yet, or tcp), no tally.

Writes are ``pwrite`` calls into alternating slots with a checksum (``wire.encode_tally_slot``),
so a process killed in the middle of one leaves the previous slot readable. The file is created
with ``O_EXCL | O_NOFOLLOW`` under a name with a random part, mode 0640, inside a directory the
daemon makes sticky: another user of the trainers' group can neither pre-empt, replace nor
remove it, and the daemon checks its owner against the sender's process (docs/PROTOCOL.md).
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from collections.abc import Iterable

import msgspec

from trainer_shim import exit_hooks, exit_status, wire
from trainer_shim.endpoint import tally_dir

log = logging.getLogger("trainer_shim")

RETRY_S = 5.0
"""While the tally directory is missing (the daemon has not bound the socket yet), look again
this often (seconds)."""

_START_TICKS: dict[int, int] = {}


def process_start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22), or
    None if it does not exist (or /proc is not there). With the pid it names one process: a
    reused pid has a later start."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read(4096)
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2:].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _own_start_ticks() -> int:
    pid = os.getpid()
    ticks = _START_TICKS.get(pid)
    if ticks is None:
        ticks = process_start_ticks(pid) or 0
        _START_TICKS[pid] = ticks
    return ticks


class TallyWriter:
    """Writes one publisher's tally. Used by one thread at a time (the flusher, or the SIGTERM
    handler while it holds the publisher's cycle lock)."""

    def __init__(self, endpoint: str, started_unix_s: float, flush_interval_s: float, max_pending: int = 0) -> None:
        """``max_pending``: the channels' queue size (told in the tally: the bound on what a process
        that dies without a final tally made after its last flush)."""
        self.directory = tally_dir(endpoint)
        self.path: str | None = None
        self._started_unix_s = started_unix_s
        self._flush_interval_s = flush_interval_s
        self._max_pending = max_pending
        self._fd: int | None = None
        self._seq = 0
        self._last: bytes | None = None
        self._next_try = 0.0
        self._encoder = msgspec.msgpack.Encoder()

    def write(self, entries: Iterable[wire.TallyChannel], end: wire.TallyEnd, now: float) -> bool:
        """Write the tally unless the file already says exactly this. ``now``: monotonic seconds
        (for the retry delay while the directory is missing). Returns whether the file now holds
        these totals. Never raises."""
        try:
            if self._fd is None and not self._open(now):
                return False
            assert self._fd is not None
            payload, omitted = self._encode(list(entries), end)
            if payload == self._last:
                return True
            slot = wire.encode_tally_slot(self._seq, payload)
            os.pwrite(self._fd, slot, wire.TALLY_SLOT_OFFSETS[self._seq % 2])
            self._seq += 1
            self._last = payload if not omitted else None
            return True
        except Exception as exc:  # noqa: BLE001 - a full disk: try again at the next cycle
            log.debug("trainer_shim: tally write failed: %r", exc)
            self._last = None  # the same file, never a second one (the daemon would reconcile both)
            return False

    def _encode(self, channels: list[wire.TallyChannel], end: wire.TallyEnd) -> tuple[bytes, int]:
        """The payload, leaving out the last channels if it would not fit a slot."""
        kept = channels
        signal, cause, detail, gpu, thread = exit_hooks.seen()
        while True:
            tally = wire.Tally(wire.TALLY_VERSION, os.getpid(), _own_start_ticks(), self._started_unix_s,
                                 int(end), self._flush_interval_s, kept, len(channels) - len(kept), signal, detail,
                                 self._max_pending, cause, gpu, thread)
            payload = self._encoder.encode(tally)
            if len(payload) <= wire.TALLY_MAX_PAYLOAD:
                return payload, len(channels) - len(kept)
            kept = kept[: len(kept) // 2]

    def _open(self, now: float) -> bool:
        directory = self.directory
        if directory is None or now < self._next_try:
            return False
        self._next_try = now + RETRY_S
        try:
            st = os.lstat(directory)
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode):
            return False  # a symlink or a file planted there: not the daemon's directory
        name = wire.tally_file_name(os.getpid(), _own_start_ticks(), secrets.token_hex(8))
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
        except OSError as exc:
            log.debug("trainer_shim: cannot create the tally in %s: %s", directory, exc.strerror)
            return False
        try:
            os.fchmod(fd, 0o640)  # whatever the umask: the daemon reads it through the group
        except OSError:
            pass
        self._fd, self.path, self._seq, self._last = fd, path, 0, None
        base = path[: -len(wire.TALLY_SUFFIX)]
        exit_hooks.arm_crash_file(base + wire.CRASH_SUFFIX)
        exit_status.arm(base + wire.EXIT_SUFFIX)
        return True

    def _forget(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def abandon(self) -> None:
        """In a forked child: close the parent's descriptor without touching the parent's file."""
        self._forget()
        self.directory = None
