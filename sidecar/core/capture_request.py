"""Asking a live trainer for a profiler capture and keeping it (``dflash-sidecar trace``, and the
daemon's automatic captures): the shim's own path (``trainer_shim.capture``), a request file beside
the trainer's tally in the daemon's tally directory, which only the daemon's user and the socket's
group may write. The trainers are found there too: each live process with a tally, its roles and
workers read from it. The trace is kept in the state folder (``sidecar.core.captures``) with its
breakdown (``sidecar.aggregation.trace_breakdown``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from sidecar.aggregation.trace_breakdown import breakdown, load_trace
from sidecar.core import captures
from trainer_shim import capture as shim_capture
from trainer_shim import wire
from trainer_shim.endpoint import tally_dir, tally_dirs
from trainer_shim.tally import process_start_ticks

POLL_S = 0.1
_decoder = msgspec.msgpack.Decoder(wire.Tally)


class TraceError(Exception):
    """What the command tells and exits non-zero for."""


@dataclass(frozen=True)
class Trainer:
    """A live process with a tally: the shim of a trainer (or of one of its helper processes)."""

    pid: int
    ticks: int
    directory: str
    channels: tuple[tuple[str, str], ...]
    """Its ``(role, worker)`` pairs."""

    @property
    def stem(self) -> str:
        return shim_capture.stem(self.pid, self.ticks)

    @property
    def loader_worker(self) -> bool:
        """A DataLoader worker process (every worker label ends ``/loader<N>``): never asked unless named."""
        return bool(self.channels) and all(re.search(r"/loader\d+$", w) for _, w in self.channels)

    def label(self) -> str:
        names = ", ".join(f"{r}/{w}" for r, w in self.channels) or "no channel yet"
        return f"pid {self.pid} ({names})"


def live_trainers(endpoints: tuple[str, ...]) -> list[Trainer]:
    """The live processes with a tally in the endpoints' tally directories. Raises ``TraceError``
    when no directory can be listed (no daemon bound the endpoint, or this user may not list it)."""
    found, listed, refused = [], False, ""
    for directory in (d for e in endpoints for d in tally_dirs(e)):
        try:
            names = os.listdir(directory)
        except PermissionError:
            refused = directory
            continue
        except OSError:
            continue
        listed = True
        for name in names:
            ident = wire.parse_tally_file_name(name)
            if ident is None or process_start_ticks(ident[0]) != ident[1]:
                continue
            found.append(Trainer(ident[0], ident[1], directory, _channels(os.path.join(directory, name))))
    if not listed:
        if refused:
            why = f"this user may not list {refused} (run trace as the daemon's user, or give --pid)"
        elif not any(tally_dir(e) for e in endpoints):
            why = f"{', '.join(endpoints)}: a capture needs an ipc:// endpoint (the tally directory beside its socket)"
        else:
            why = f"no daemon's tally directory beside {', '.join(endpoints)} (is the daemon running?)"
        raise TraceError(f"no live trainer: {why}")
    return found


def _channels(path: str) -> tuple[tuple[str, str], ...]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return ()
    try:
        payload = wire.read_tally_slots(lambda offset, n: os.pread(fd, n, offset))
        tally = _decoder.decode(payload) if payload is not None else None
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        tally = None
    finally:
        os.close(fd)
    return tuple((c.role, c.worker) for c in tally.channels) if tally is not None else ()


def choose(trainers: list[Trainer], role: str | None, worker: str | None, pid: int | None) -> list[Trainer]:
    """The trainers a request goes to. Raises ``TraceError`` when none matches."""
    chosen = [t for t in trainers if (pid is None or t.pid == pid)
              and (role is None or any(r == role for r, _ in t.channels))
              and (worker is None or any(w == worker for _, w in t.channels))
              and (pid is not None or not t.loader_worker)]
    if not trainers:
        raise TraceError("no live trainer: no process publishes to the daemon")
    if not chosen:
        have = "; ".join(t.label() for t in trainers)
        raise TraceError(f"no live trainer matches (role={role}, worker={worker}, pid={pid}); live: {have}")
    return chosen


def request(t: Trainer, steps: int, role: str | None, worker: str | None, wait_s: float) -> str:
    """Write ``t``'s request file, whole (written under a name of its own, then linked to the
    request's name: the shim never reads half a request); returns its id. Raises ``TraceError``
    if another request is pending for it (a capture already running) or it cannot be written."""
    path = os.path.join(t.directory, t.stem + shim_capture.REQUEST_SUFFIX)
    rid = secrets.token_hex(6)
    body = json.dumps({"id": rid, "steps": steps, "role": role, "worker": worker,
                       "deadline_unix_s": time.time() + wait_s}).encode()
    tmp = f"{path}.{rid}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
        try:
            os.fchmod(fd, 0o640)  # whatever the umask: the trainer's user reads it through the group
            os.write(fd, body)
        finally:
            os.close(fd)
        for _ in range(2):
            try:
                os.link(tmp, path)  # fails if a request is there: one capture at a time
                return rid
            except FileExistsError:
                if not _stale(path):
                    raise TraceError(f"{t.label()}: a capture already running (a request is pending: "
                                     f"{path})") from None
                _unlink(path)
        raise TraceError(f"{t.label()}: a capture already running")
    except OSError as exc:
        raise TraceError(f"cannot ask {t.label()}: {exc.strerror} ({path})") from None
    finally:
        _unlink(tmp)


def _stale(path: str) -> bool:
    """A pending request whose deadline passed (its requester died)."""
    try:
        return float(json.loads(Path(path).read_text())["deadline_unix_s"]) + 5.0 < time.time()
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def owner(pid: int) -> int | None:
    """The uid process ``pid`` runs as (the owner of ``/proc/<pid>``), or None if it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _owned_by(path: str, uid: int | None) -> bool:
    """Whether ``path`` is a regular file (not a link) owned by ``uid``: what the trainer wrote,
    not what another member of the socket's group planted under the same name."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and uid is not None and st.st_uid == uid


def result(t: Trainer, rid: str) -> dict[str, Any] | None:
    """``t``'s result for request ``rid``, or None (none yet, another request's, or a file the
    trainer's user did not write)."""
    path = os.path.join(t.directory, t.stem + shim_capture.RESULT_SUFFIX)
    if not _owned_by(path, owner(t.pid)):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            data = json.loads(os.read(fd, 1 << 16))
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("id") == rid else None


def _trace_of(t: Trainer, rid: str, done: dict[str, Any]) -> str:
    """The trace a ``done`` result names, if it is the one the shim writes: in the tally directory,
    under the shim's own name for this request, a regular file of the trainer's user. Raises
    ``TraceError`` otherwise."""
    expected = os.path.join(t.directory, f"{t.stem}-{rid}{shim_capture.TRACE_SUFFIX}")
    if done.get("trace") != expected or not _owned_by(expected, owner(t.pid)):
        raise TraceError(f"{t.label()}: the result names no trace of the trainer's own ({done.get('trace')!r})")
    return expected


_TOLD = {
    "no_torch": "a trainer without torch",
    "busy": "a capture already running",
    "too_soon": "too soon after the last capture",
    "expired": "the steps never came",
    "disabled": "captures are off in this trainer",
    "bad_request": "the trainer refused the request",
    "failed": "the capture failed",
}


def wait_for(t: Trainer, rid: str, wait_s: float) -> dict[str, Any]:
    """The final result of ``rid``. Raises ``TraceError`` for every outcome but ``done``."""
    deadline = time.monotonic() + wait_s + 10.0  # the trace's export follows the last step
    last: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        got = result(t, rid)
        if got is not None:
            last = got
            if got["status"] == "done":
                return got
            if got["status"] in shim_capture.FINAL:
                raise TraceError(f"{t.label()}: {_TOLD.get(got['status'], got['status'])}: {got.get('detail', '')}")
        if process_start_ticks(t.pid) != t.ticks:
            raise TraceError(f"{t.label()}: the trainer ended before the capture did")
        time.sleep(POLL_S)
    if last is None:
        raise TraceError(f"{t.label()}: no answer in {wait_s:g} s (a shim older than captures, or a stalled flusher)")
    raise TraceError(f"{t.label()}: the steps never came within {wait_s:g} s ({len(last.get('steps', []))} of "
                     f"{last.get('steps_wanted')} captured)")


def capture_one(t: Trainer, steps: int, role: str | None, worker: str | None, wait_s: float,
                state_dir: Path, why: str = "asked (dflash-sidecar trace)") -> captures.Capture:
    """Ask ``t``, wait for its capture, keep it with its breakdown (``why`` goes with it).
    Raises ``TraceError`` saying what happened when there is no capture to keep."""
    return collect(t, request(t, steps, role, worker, wait_s), wait_s, state_dir, why)


def collect(t: Trainer, rid: str, wait_s: float, state_dir: Path,
            why: str = "asked (dflash-sidecar trace)") -> captures.Capture:
    """Wait for the capture of request ``rid`` (``request``), remove the request, keep the capture.
    Raises ``TraceError`` saying what happened when there is no capture to keep."""
    try:
        done = wait_for(t, rid, wait_s)
    finally:
        _unlink(os.path.join(t.directory, t.stem + shim_capture.REQUEST_SUFFIX))
    trace = _trace_of(t, rid, done)
    try:
        result_ = breakdown(load_trace(trace))
    except (OSError, ValueError) as exc:
        raise TraceError(f"{t.label()}: the trace cannot be read: {exc}") from None
    meta = {k: done.get(k) for k in ("pid", "role", "worker", "run", "steps", "cuda", "started_unix_s",
                                     "ended_unix_s", "start_s", "stop_s")}
    meta["why"] = why
    try:
        return captures.keep(state_dir, trace, meta, result_)
    except OSError as exc:
        raise TraceError(f"cannot keep the trace in {captures.folder(state_dir)}: {exc} (it stays at "
                         f"{trace})") from None


