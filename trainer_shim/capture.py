"""A profiler capture on request: N steps of ``torch.profiler`` from a live trainer, no change to
its code (docs/SHIM.md, "A capture on request").

The request path costs nothing while nobody asks. ``dflash-sidecar trace`` writes a small request
file beside the process's tally, in the daemon's tally directory (``trainer_shim.endpoint``: only
who may write there, the daemon's user and the socket's group, can ask). The flusher thread,
which wakes anyway, looks for it at most every ``POLL_S`` (one ``stat``); on a request it sets
``armed``. The trainer's thread reads that one flag at the step boundary it already reports,
``publish(step)`` (the module function, a channel's, the framework callbacks' step end): a global
load and a test while unarmed. Armed, the next boundary starts ``torch.profiler.profile`` (CPU,
and CUDA where the trainer initialised CUDA), each following one marks a step (``ProfilerStep#N``)
and the N-th stops it; the trace is written (``export_chrome_trace``) on a thread of its own, and
the result file tells the requester. The cost during a capture is the profiler's own.

Nothing here imports torch: a capture starts only in a process that already did (``sys.modules``);
one that never did answers ``no_torch``. One capture at a time per process, and at least
``DFLASH_TRACE_MIN_GAP_S`` between two; ``DFLASH_TRACE=0`` refuses every request. A forked child
(a DataLoader worker) is never asked: the request names the process by pid and start time. Never
raises into the trainer: a failed capture is counted (``failures``) and told in the result.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import stat
import sys
import threading
import time
from typing import Any

from trainer_shim.tally import process_start_ticks

log = logging.getLogger("trainer_shim")

armed = False
"""Read by ``publish`` at every step boundary: a capture waits for the next one, or runs."""

POLL_S = 0.25
"""How often the flusher looks for a request (seconds)."""
MAX_STEPS = 20
"""The most steps one capture may ask for."""
MAX_REQUEST_BYTES = 4096
MIN_GAP_ENV = "DFLASH_TRACE_MIN_GAP_S"
MIN_GAP_DEFAULT_S = 30.0
"""Between the end of one capture and the start of the next (seconds)."""
MAX_MB_ENV = "DFLASH_TRACE_MAX_MB"
MAX_MB_DEFAULT = 256.0
"""A written trace (gzip) larger than this is removed and the capture fails (MiB)."""
ENABLE_ENV = "DFLASH_TRACE"

REQUEST_SUFFIX = ".trace-request"
RESULT_SUFFIX = ".trace-result"
TRACE_SUFFIX = ".trace.json.gz"
FINAL = frozenset({"done", "failed", "no_torch", "busy", "too_soon", "expired", "disabled", "bad_request"})
"""The statuses after which the process does nothing more for a request (``accepted`` and
``capturing`` come before)."""


def stem(pid: int, start_ticks: int) -> str:
    """``<pid>-<start ticks>``: the name of one process's request, result and trace files."""
    return f"{pid}-{start_ticks}"


class _Capture:
    """One request, from acceptance to its result."""

    def __init__(self, request: dict[str, Any], directory: str, name: str) -> None:
        self.id = str(request["id"])
        self.steps_wanted = int(request["steps"])
        self.role = request.get("role")
        self.worker = request.get("worker")
        self.deadline_unix_s = float(request["deadline_unix_s"])
        self.directory, self.name = directory, name
        self.channel: Any = None
        self.source = "publish"
        """Which boundaries the capture counts, once started (``at_step``)."""
        self.prof: Any = None
        self.cuda = False
        self.steps: list[int] = []
        self.started_unix_s: float | None = None
        self.start_s: float | None = None
        self.stop_s: float | None = None
        """What the profiler's start and stop cost the trainer's thread (seconds)."""
        self.cancelled = False
        self.lock = threading.Lock()
        """Taken (never waited for) by the trainer's thread to start, by the flusher to cancel."""

    def result(self, status: str, detail: str = "", trace: str | None = None) -> dict[str, Any]:
        ch = self.channel
        return {"id": self.id, "status": status, "detail": detail, "trace": trace, "pid": os.getpid(),
                "steps": list(self.steps), "steps_wanted": self.steps_wanted,
                "role": getattr(ch, "role", self.role), "worker": getattr(ch, "worker", self.worker),
                "run": _state["run"], "cuda": self.cuda, "failures": _state["failures"],
                "started_unix_s": self.started_unix_s, "ended_unix_s": time.time(),
                "start_s": self.start_s, "stop_s": self.stop_s}


_state: dict[str, Any] = {"capture": None, "last_end": None, "seen": None, "bad": None, "next_poll": 0.0,
                          "failures": 0, "pending": [], "trace": None, "pid": os.getpid(), "run": None}
"""The process's capture state (reset in a forked child): the current capture, when the last one
ended (monotonic), the id of the last request answered, the last unreadable request file answered
(inode, mtime), results the trainer's thread left for the flusher to write, the last trace file
written (removed before the next)."""


def at_step(channel: Any, step: Any, source: str = "publish") -> None:
    """The step boundary while ``armed``, on the trainer's thread: ``publish(step, ...)`` of
    ``channel`` (``source="publish"``), or the next batch of a ``timed`` loader (``"loader"``,
    ``step`` its batch count). Starts the profiler at the first boundary of a channel the request
    matches; from then on only that channel's boundaries of that source count (a loop with both
    counts each step once), each marking a step, the N-th stopping it. Never raises."""
    global armed
    c: _Capture | None = _state["capture"]
    if c is None or c.cancelled:
        armed = False
        return
    try:
        if c.prof is None:
            if (c.role and channel.role != c.role) or (c.worker and channel.worker != c.worker):
                return
            if c.lock.acquire(blocking=False):
                try:
                    if not c.cancelled:
                        c.source = source
                        _start(c, channel)
                finally:
                    c.lock.release()
            return
        if channel is not c.channel or source != c.source:
            return
        c.steps.append(int(step) if type(step) is int else -1)
        if len(c.steps) >= c.steps_wanted or time.time() > c.deadline_unix_s:
            armed = False
            t0 = time.perf_counter()
            c.prof.stop()
            c.stop_s = time.perf_counter() - t0
            threading.Thread(target=_write_trace, args=(c,), name="trainer-shim-trace", daemon=True).start()
        else:
            c.prof.step()
    except Exception as exc:  # noqa: BLE001 - never into the trainer
        armed = False
        _fail(c, f"the profiler failed at a step boundary: {exc!r}")


def _start(c: _Capture, channel: Any) -> None:
    torch = sys.modules.get("torch")
    if torch is None:
        raise RuntimeError("torch is no longer imported")
    from torch.profiler import ProfilerActivity, profile

    if _own_profiler_running():
        raise RuntimeError("the trainer's own torch.profiler is running")
    cuda = bool(torch.cuda.is_initialized())  # a flag: never initialises CUDA, never touches the device
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=activities, schedule=_record_every_step)
    c.channel, c.cuda, c.started_unix_s = channel, cuda, time.time()
    c.prof = prof
    t0 = time.perf_counter()
    prof.start()
    c.start_s = time.perf_counter() - t0
    _state["pending"].append(c.result("capturing"))


def _own_profiler_running() -> bool:
    """Whether a profiler of the trainer's own is on (a second one would end its session)."""
    profiler = sys.modules.get("torch.autograd.profiler")
    return bool(getattr(profiler, "_is_profiler_enabled", False))


def _record_every_step(step: int) -> Any:
    """The profiler's schedule: record every step (a schedule makes it mark ``ProfilerStep#N``)."""
    from torch.profiler import ProfilerAction

    return ProfilerAction.RECORD


def _fail(c: _Capture, detail: str) -> None:
    _state["failures"] += 1
    prof, c.prof = c.prof, None
    if prof is not None:
        try:
            prof.stop()
        except Exception:  # noqa: BLE001
            pass
    _state["pending"].append(c.result("failed", detail))
    _state["capture"], _state["last_end"] = None, time.monotonic()
    log.warning("trainer_shim: capture %s failed: %s (counted; the trainer is unaffected)", c.id, detail)


def _write_trace(c: _Capture) -> None:
    """The trace's export, off the trainer's thread: to a temporary name, then the final one."""
    path = os.path.join(c.directory, f"{c.name}-{c.id}{TRACE_SUFFIX}")
    tmp = os.path.join(c.directory, f"{c.name}-{c.id}.{secrets.token_hex(4)}.tmp{TRACE_SUFFIX}")  # .gz: gzipped
    try:
        _remove(_state["trace"])
        c.prof.export_chrome_trace(tmp)
        os.chmod(tmp, 0o640)
        size_mb = os.path.getsize(tmp) / (1 << 20)
        limit = _env_float(MAX_MB_ENV, MAX_MB_DEFAULT)
        if size_mb > limit:
            _remove(tmp)
            raise RuntimeError(f"the trace is {size_mb:.0f} MiB, over {MAX_MB_ENV}={limit:g}")
        os.replace(tmp, path)
        _state["trace"] = path
        c.prof = None
        _state["pending"].append(c.result("done", trace=path))  # after "capturing", by the flusher: in order
        _state["capture"], _state["last_end"] = None, time.monotonic()
    except Exception as exc:  # noqa: BLE001
        _remove(tmp)
        _fail(c, f"writing the trace failed: {exc!r}")


def poll(directory: str | None, now: float, run: str | None = None) -> None:
    """The flusher's turn (``now``: monotonic seconds): write what the trainer's thread left, look
    for a request at most every ``POLL_S``, expire a capture whose steps never came. ``run``: the
    publisher's run (W&B run id or run label), told in the results. Never raises."""
    if directory is None or _state["pid"] != os.getpid():
        return
    name = stem(os.getpid(), _own_ticks())
    while _state["pending"]:  # every cycle, in the order they were left (the only writer of results but this)
        _write_result(directory, name, _state["pending"].pop(0))
    if now < _state["next_poll"]:
        return
    _state["run"] = run
    _state["next_poll"] = now + POLL_S
    _expire(directory, name)
    path = os.path.join(directory, name + REQUEST_SUFFIX)
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode):
        return
    try:
        request = _read_request(path)  # a pending request is read again at each look: its id tells it apart
    except ValueError as exc:
        if _state["bad"] != (st.st_ino, st.st_mtime_ns):  # answered once per version of the file
            _state["bad"] = (st.st_ino, st.st_mtime_ns)
            _write_result(directory, name, {"id": None, "status": "bad_request", "detail": str(exc),
                                            "pid": os.getpid()})
        return
    if request["id"] != _state["seen"]:
        _state["seen"] = request["id"]
        _answer(request, directory, name)


def _answer(request: dict[str, Any], directory: str, name: str) -> None:
    global armed
    refusal = _refusal()
    c = _Capture(request, directory, name)
    if refusal is not None:
        _write_result(directory, name, c.result(*refusal))
        return
    _state["capture"] = c
    _write_result(directory, name, c.result("accepted"))
    armed = True


def _refusal() -> tuple[str, str] | None:
    """Why a request cannot be served now, as ``(status, detail)``, or None."""
    if os.environ.get(ENABLE_ENV, "1") == "0":
        return "disabled", f"{ENABLE_ENV}=0 in the trainer's environment"
    if "torch" not in sys.modules:
        return "no_torch", "this process never imported torch: nothing to profile"
    if _state["capture"] is not None:
        return "busy", "a capture is already running in this process"
    if _own_profiler_running():
        return "busy", "the trainer's own torch.profiler is running"
    gap = _env_float(MIN_GAP_ENV, MIN_GAP_DEFAULT_S)
    last = _state["last_end"]
    if last is not None and time.monotonic() - last < gap:
        return "too_soon", f"the last capture ended {time.monotonic() - last:.0f} s ago; {MIN_GAP_ENV}={gap:g}"
    return None


def _expire(directory: str, name: str) -> None:
    """A capture not started by its deadline (no step boundary came) or whose request is gone."""
    global armed
    c: _Capture | None = _state["capture"]
    if c is None or c.prof is not None:
        return
    gone = not os.path.exists(os.path.join(directory, name + REQUEST_SUFFIX))
    if (gone or time.time() > c.deadline_unix_s) and c.lock.acquire(blocking=False):
        try:
            if c.prof is None:
                c.cancelled, armed = True, False
                _state["capture"] = None
                _write_result(directory, name, c.result(
                    "expired", "no step boundary came: the trainer called no publish() (nor a framework "
                    "callback's step end) before the deadline"))
        finally:
            c.lock.release()


def _read_request(path: str) -> dict[str, Any]:
    """The request at ``path``. Raises ``ValueError`` saying what is wrong with it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            raw = os.read(fd, MAX_REQUEST_BYTES + 1)
        finally:
            os.close(fd)
        request = json.loads(raw)
    except (OSError, ValueError) as exc:
        raise ValueError(f"unreadable request: {exc}") from None
    if len(raw) > MAX_REQUEST_BYTES or not isinstance(request, dict):
        raise ValueError("a request is a JSON object of at most 4 KiB")
    steps = request.get("steps")
    if type(steps) is not int or not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be an integer from 1 to {MAX_STEPS}")
    if not isinstance(request.get("id"), str) or not str(request["id"]).isalnum():
        raise ValueError("id must be an alphanumeric string")
    if not isinstance(request.get("deadline_unix_s"), (int, float)):
        raise ValueError("deadline_unix_s must be a number")
    for key in ("role", "worker"):
        if request.get(key) is not None and not isinstance(request[key], str):
            raise ValueError(f"{key} must be a string")
    return request


def _write_result(directory: str, name: str, result: dict[str, Any]) -> None:
    """Replace ``<name>.trace-result`` atomically (mode 0640). Never raises."""
    path = os.path.join(directory, name + RESULT_SUFFIX)
    tmp = f"{path}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
        try:
            os.write(fd, json.dumps(result).encode())
            os.fchmod(fd, 0o640)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except Exception as exc:  # noqa: BLE001
        _remove(tmp)
        log.debug("trainer_shim: cannot write the capture result: %r", exc)


def _own_ticks() -> int:
    """This process's start time in clock ticks (read once per process)."""
    if _state.get("ticks") is None:
        _state["ticks"] = process_start_ticks(os.getpid()) or 0
    return int(_state["ticks"])


def _env_float(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return value if value >= 0 else default


def _remove(path: str | None) -> None:
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


def remove_own_files(directory: str | None) -> None:
    """At close: remove this process's result file and the last trace it wrote that nobody took
    (best effort; the request is its writer's to remove)."""
    if _state["pid"] == os.getpid():
        _remove(_state["trace"])
        _state["trace"] = None
        if directory is not None and _state.get("ticks") is not None:
            _remove(os.path.join(directory, stem(os.getpid(), _own_ticks()) + RESULT_SUFFIX))


def _after_fork_in_child() -> None:
    global armed
    armed = False
    _state.update(capture=None, last_end=None, seen=None, bad=None, next_poll=0.0, failures=0, pending=[],
                  trace=None, pid=os.getpid(), ticks=None)


os.register_at_fork(after_in_child=_after_fork_in_child)
