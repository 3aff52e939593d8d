"""The daemon's side of the senders' tallies: the directory beside each ipc socket
(``<socket>.tallies``, and for one release the deprecated ``<socket>.ledger`` that shims of the
previous release write into: ``trainer_shim.endpoint.tally_dirs``), and the files in it of
processes that are gone.

Each shim publisher rewrites a small file there after its flush cycles (``trainer_shim.tally``).
This module creates the directory (the daemon's own: mode 3730, sticky and setgid, so members of
the socket's group can create files but not list, replace or remove each other's), and once per
``SCAN_S`` lists it and reports the tallies that are ready to be reconciled: the process named by the
file is gone (its pid no longer exists, or exists with another start time), or its publisher
closed, for at least ``model.liveness.GONE_AFTER_S``. What the tally says beyond what arrived is reconciled by
``SenderRegistry.reconcile_tally``; the file is then removed. Beside a tally, the process's crash file
(the fatal signal faulthandler wrote down) and exit-status file (the status the C library wrote
at ``exit(3)``, ``trainer_shim.exit_status``) are read with it and removed once its tallies are
all reconciled. Nothing here raises: an unreadable file is skipped, a malformed one counted and removed.
"""

from __future__ import annotations

import logging
import os
import stat
import sys
from dataclasses import dataclass
from typing import NamedTuple

import msgspec

from sidecar.model.liveness import GONE_AFTER_S
from sidecar.sources.cgroup import Baseline, oom_baseline, oom_killed
from trainer_shim import wire
from trainer_shim.endpoint import tally_dirs

log = logging.getLogger("sidecar")

SCAN_S = 1.0
"""How often the tally directories are listed (seconds)."""
MAX_FILES_PER_SCAN = 4096
"""Entries looked at per directory per scan: a directory flooded with files costs a bounded scan."""
MAX_TALLY_BYTES = wire.TALLY_SLOT_OFFSETS[1] + wire.TALLY_MAX_PAYLOAD + 64
MAX_PROCESSES = 4096
"""Processes whose memory cgroup's OOM-kill counts are kept from their first frame (the sender
table's size); beyond it the oldest are forgotten (their tallies' first sight is the baseline)."""
MAX_CRASH_BYTES = 4096
"""Of a crash file, the head read: faulthandler's first line names the fatal signal."""
FATAL_ERRORS = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
                "Floating-point exception": "SIGFPE", "Floating point exception": "SIGFPE",
                "Illegal instruction": "SIGILL"}
"""faulthandler's words for the fatal signals it handles (``Fatal Python error: <words>``)."""
DIR_MODE = 0o3730
Sides = dict[str, dict[tuple[int, int], tuple[str, int]]]
"""Per suffix (crash, exit status), the files beside the tallies: ``(pid, start ticks)`` to
``(path, owner uid)``."""

_decoder = msgspec.msgpack.Decoder(wire.Tally)


@dataclass(slots=True)
class ReadyTally:
    """A tally to reconcile. ``uid``: the file's owner; ``final``: written by ``close()`` or the SIGTERM
    handler (the totals are exact), else the last flush of a process that died without either;
    ``written_unix_s``: the file's last write (its mtime, Unix seconds)."""

    path: str
    tally: wire.Tally
    uid: int
    final: bool
    written_unix_s: float
    crash: str = ""
    """The fatal signal faulthandler wrote down in the process's crash file (``SIGSEGV``...;
    ``fatal`` for a report it does not name; empty: none)."""
    oom: bool = False
    """The process's memory cgroup counted an OOM kill after the tally was first seen."""
    exit_status: int | None = None
    """The status the process exited with (0-255), as the C library wrote it into its exit-status
    file (``trainer_shim.exit_status``); None: not told (no file, or the process did not end
    through ``exit(3)``: ``os._exit``, a signal, a crash, or it still runs)."""


@dataclass(slots=True)
class _Seen:
    mtime_ns: int
    tally: wire.Tally | None
    uid: int
    ready_since: float | None = None
    oom: Baseline = ()


class TallyScan(NamedTuple):
    """What one ``TallyDirectory.scan`` found."""

    ready: list[ReadyTally]
    """The tallies ready to be reconciled."""
    malformed: int
    """Files of gone processes that held no intact tally (removed)."""


class TallyDirectory:
    """The tally directories of a daemon's ipc endpoints."""

    def __init__(self, endpoints: list[str]) -> None:
        self.directories = [d for e in endpoints for d in tally_dirs(e)]
        self._seen: dict[str, _Seen] = {}
        self._baselines: dict[int, Baseline] = {}
        self._next_scan = 0.0
        self._malformed = 0
        """Files of gone processes that held no intact tally (removed) in the current scan."""

    def prepare(self) -> None:
        """Create each directory (after the socket is bound: the socket's directory exists and is
        ours), or take over one a previous life left. A path that is not a directory of this user
        disables its tallies, with a warning."""
        usable = []
        for directory in self.directories:
            try:
                os.mkdir(directory, 0o700)
            except FileExistsError:
                pass
            except OSError as exc:
                log.warning("sidecar: cannot create %s (%s): losses at exit will not be counted", directory,
                            exc.strerror)
                continue
            try:
                st = os.lstat(directory)
                if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                    raise PermissionError("not a directory of this user")
                os.chmod(directory, DIR_MODE)
            except OSError as exc:
                log.warning("sidecar: ignoring %s (%s): losses at exit will not be counted", directory, exc)
                continue
            usable.append(directory)
        self.directories = usable

    def note_process(self, pid: int | None) -> None:
        """At a frame from process ``pid`` (the kernel's word, ipc): the first time, read its
        memory cgroup's OOM-kill counts (``sources.cgroup``), against which its end is told.
        A dictionary lookup for a process already noted."""
        if pid is None or pid in self._baselines:
            return
        if len(self._baselines) >= MAX_PROCESSES:
            del self._baselines[next(iter(self._baselines))]
        self._baselines[pid] = oom_baseline(pid)

    def due(self, now: float) -> bool:
        """Whether a scan is due (monotonic seconds)."""
        return bool(self.directories) and now >= self._next_scan

    def scan(self, now: float, grace_s: float = GONE_AFTER_S) -> TallyScan:
        """The tallies ready to be reconciled now (gone or closed for ``grace_s``; 0 at the daemon's
        shutdown, once what arrived is drained), and how many files of gone processes held no
        intact tally (removed: the caller counts them)."""
        self._next_scan = now + SCAN_S
        self._malformed = 0
        ready: list[ReadyTally] = []
        present: set[str] = set()
        sides: Sides = {wire.CRASH_SUFFIX: {}, wire.EXIT_SUFFIX: {}}
        for directory in self.directories:
            try:
                with os.scandir(directory) as it:
                    for i, entry in enumerate(it):
                        if i >= MAX_FILES_PER_SCAN:
                            break
                        present.add(entry.path)
                        for suffix, found_sides in sides.items():
                            side = wire.parse_tally_file_name(entry.name, suffix)
                            if side is not None:
                                found_sides[side] = (entry.path, _owner(entry))
                        found = self._look(entry, now, grace_s)
                        if found is not None:
                            ready.append(found)
            except OSError:
                continue
        for path in [p for p in self._seen if p not in present]:
            del self._seen[path]
        self._tell_sides(ready, sides)
        return TallyScan(ready, self._malformed)

    def _tell_sides(self, ready: list[ReadyTally], sides: Sides) -> None:
        """Read the crash file and the exit-status file of each ready tally's process (those its
        owner made: another member of the socket's group cannot speak for it); remove the files
        of gone processes whose tallies are all reconciled (none left in the directory)."""
        for r in ready:
            ident = (r.tally.pid, r.tally.start_ticks)
            path, uid = sides[wire.CRASH_SUFFIX].get(ident, ("", -1))
            if path and uid == r.uid and not r.final:
                r.crash = _fatal_signal(path)
            path, uid = sides[wire.EXIT_SUFFIX].get(ident, ("", -1))
            if path and uid == r.uid and _gone(*ident):
                r.exit_status = read_exit_status(path)
        for found in sides.values():
            self._sweep(found)

    def _sweep(self, files: dict[tuple[int, int], tuple[str, int]], running_too: bool = False) -> None:
        """Remove the crash or exit-status files no tally left in the directory needs, of gone
        processes (and of running ones too with ``running_too``: at the daemon's exit, a closed
        publisher's)."""
        pending = {(s.tally.pid, s.tally.start_ticks) for s in self._seen.values() if s.tally is not None}
        for ident, (path, _) in files.items():
            if ident not in pending and (running_too or _gone(*ident)):
                self.remove(path)

    def _look(self, entry: os.DirEntry[str], now: float, grace_s: float) -> ReadyTally | None:
        ident = wire.parse_tally_file_name(entry.name)
        if ident is None:
            return None
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        seen = self._seen.get(entry.path)
        pid, ticks = ident
        if seen is None or seen.mtime_ns != st.st_mtime_ns:
            seen = _Seen(st.st_mtime_ns, self._read(entry.path), st.st_uid,
                         seen.ready_since if seen is not None else None,
                         seen.oom if seen is not None else self._baseline(pid, ticks))
            self._seen[entry.path] = seen
        tally = seen.tally
        gone = _gone(pid, ticks)
        if tally is None or tally.pid != pid:
            if gone:  # not a tally (a running process may be writing its first slot: wait for it)
                self._malformed += 1
                self.remove(entry.path)
            return None
        final = tally.end != wire.TallyEnd.RUNNING
        if not (final or gone):
            seen.ready_since = None
            return None
        if seen.ready_since is None:
            seen.ready_since = now
        if now - seen.ready_since < grace_s:
            return None
        return ReadyTally(entry.path, tally, seen.uid, final, seen.mtime_ns / 1e9,
                           oom=not final and oom_killed(seen.oom))

    def _baseline(self, pid: int, ticks: int) -> Baseline:
        """The OOM-kill counts of ``pid``'s cgroup from its first frame, else from now (if it lives)."""
        noted = self._baselines.get(pid)
        if noted is not None:
            return noted
        return () if _gone(pid, ticks) else oom_baseline(pid)

    def _read(self, path: str) -> wire.Tally | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            payload = wire.read_tally_slots(lambda offset, n: os.pread(fd, min(n, MAX_TALLY_BYTES), offset))
            if payload is None:
                return None
            tally = _decoder.decode(payload)
            return tally if tally.version == wire.TALLY_VERSION else None
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            return None
        finally:
            os.close(fd)

    def close(self) -> None:
        """At daemon exit: remove each directory if it is empty (tallies of running senders, or of
        gone ones not reconciled yet, keep it for the next daemon); the crash files whose tallies were
        all reconciled go first. Idempotent."""
        for directory in self.directories:
            try:
                names = os.listdir(directory)[:MAX_FILES_PER_SCAN]
            except OSError:
                names = []
            tallies = {wire.parse_tally_file_name(name) for name in names}
            for suffix in (wire.CRASH_SUFFIX, wire.EXIT_SUFFIX):
                files = {ident: (os.path.join(directory, name), -1) for name in names
                         if (ident := wire.parse_tally_file_name(name, suffix)) is not None and ident not in tallies}
                self._sweep(files, running_too=True)
            try:
                os.rmdir(directory)
            except OSError:
                pass

    def remove(self, path: str) -> None:
        """Remove a reconciled (or unusable) tally file."""
        self._seen.pop(path, None)
        ident = wire.parse_tally_file_name(os.path.basename(path))
        if ident is not None:
            self._baselines.pop(ident[0], None)
        try:
            os.unlink(path)
        except OSError:
            pass


def _owner(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat(follow_symlinks=False).st_uid
    except OSError:
        return -1


def _fatal_signal(path: str) -> str:
    """The fatal signal a crash file names (``FATAL_ERRORS``), ``fatal`` if it holds another
    report, empty if it is empty or unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        head = os.read(fd, MAX_CRASH_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""
    finally:
        os.close(fd)
    if not head.strip():
        return ""
    first = head.lstrip().splitlines()[0]
    words = first.partition("Fatal Python error: ")[2].strip()
    return FATAL_ERRORS.get(words, "fatal")


def read_exit_status(path: str) -> int | None:
    """The exit status an exit-status file holds (``wire.EXIT_UNSET``: none), None if unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        head = os.read(fd, len(wire.EXIT_UNSET))
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(head) != len(wire.EXIT_UNSET) or head == wire.EXIT_UNSET:
        return None
    return int.from_bytes(head[:4], sys.byteorder, signed=True) & 0xFF


def _gone(pid: int, ticks: int) -> bool:
    """Whether the process that wrote a tally under ``pid`` and start time ``ticks`` is gone: no
    such pid, the pid of a later process, or a zombie (dead, not yet reaped by its parent)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read(4096)
    except FileNotFoundError:
        return True
    except OSError:
        return not _exists(pid)  # no /proc: only whether the pid exists
    fields = data[data.rfind(b")") + 2:].split()
    if fields[:1] in ([b"Z"], [b"X"]):
        return True
    try:
        return ticks != 0 and int(fields[19]) != ticks
    except (IndexError, ValueError):
        return False


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
