"""The NVML source: polls every GPU on one dedicated thread and publishes immutable snapshots.

NVML is initialized, called and shut down only on the poller thread. Readers (the Prometheus
collector at scrape time, the W&B exporter, the daemon) call ``latest()`` and ``status()``,
which read plain attributes and never touch NVML, so a wedged driver (an NVML call that does
not return for seconds) stalls nothing but the poller: readers keep the last snapshot, whose
``taken_monotonic_s`` gives its age, and ``status()`` reports ``STALLED`` with the hanging
call. When the call returns, polling simply goes on. ``shutdown()`` waits at most
``timeout_s`` for the thread and abandons a wedged one (it is a daemon thread).

Typical use::

    source = NvmlSource(interval_s=1.0)
    source.start()
    ...
    snapshot = source.latest()          # GpuSnapshot | None
    source.set_trainer_processes({pid: (role, worker)})
    source.shutdown()
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from sidecar.model.backoff import Backoff
from sidecar.model.gpu import GpuSnapshot, NvmlState, NvmlStatus, ProfilingState
from sidecar.sources.nvml_cadence import COST_AWARE, EVERY_POLL, MODES, Cadence
from sidecar.sources.nvml_driver import GpuLostError, NvmlDriver, NvmlUnavailableError, Outcome
from sidecar.sources.nvml_events import XidWatcher
from sidecar.sources.nvml_gpm import GpmSampler
from sidecar.sources.nvml_gpu import GpuReader
from sidecar.sources.settings import NVML_CPU_BUDGET, NVML_INTERVAL

_LOG = logging.getLogger("sidecar.nvml")

RECENT_SNAPSHOTS = 256
"""Polls ``recent`` keeps: over four minutes at the default 1 s interval (a window is 10 s)."""


def _check_settings(cadence: str, cpu_budget: float, **times_s: float) -> None:
    """Raise ``ValueError`` for an unknown ``cadence``, or a ``cpu_budget`` or time not above 0."""
    if cadence not in MODES:
        raise ValueError(f"cadence must be one of {', '.join(MODES)}, got {cadence!r}")
    if not cpu_budget > 0:
        raise ValueError(f"cpu_budget must be > 0, got {cpu_budget!r}")
    for name, value in times_s.items():
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")


class NvmlSource:
    """Background NVML poller. All public methods are thread-safe and return promptly."""

    def __init__(
        self,
        interval_s: float = NVML_INTERVAL.default,
        library_path: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        log: logging.Logger = _LOG,
        *,
        stall_after_s: float | None = None,
        profiler_backoff_s: float = 10.0,
        max_backoff_s: float = 300.0,
        init_retry_s: float = 10.0,
        cpu_budget: float = NVML_CPU_BUDGET.default,
        cadence: str = COST_AWARE,
        slow_periods_s: Mapping[str, float] | None = None,
    ) -> None:
        """Configure the source; nothing runs until ``start()``.

        ``interval_s``: seconds between polls (> 0). ``library_path``: an explicit
        ``libnvidia-ml.so*`` to use instead of the loader's search; it must be given before
        anything in the process has loaded NVML. ``stall_after_s``: how long one NVML call may
        run before ``status()`` says STALLED (default: 2 intervals, at least 1 s).
        ``profiler_backoff_s``/``max_backoff_s``: first and longest wait before retrying GPM
        while another profiler holds the counters (also the NVML init retry cap).
        ``init_retry_s``: first wait before retrying a failed ``nvmlInit`` (driver not loaded,
        ...); a missing library is not retried. ``cpu_budget``: the share of one core the poller
        may use (``cadence="cost-aware"``), kept by reading the slow groups of values less often
        (``nvml_cadence``); ``cadence="every-poll"`` reads every value every poll (no budget).
        ``slow_periods_s``: the slow groups' base periods (default ``SLOW_PERIODS_S``). Raises
        ``ValueError`` on non-positive times or budget, or an unknown cadence or group.
        """
        _check_settings(cadence, cpu_budget, interval_s=interval_s, profiler_backoff_s=profiler_backoff_s,
                        max_backoff_s=max_backoff_s, init_retry_s=init_retry_s)
        self.interval_s = float(interval_s)
        self.library_path = library_path
        self._clock = clock
        self._log = log
        self._stall_after_s = stall_after_s if stall_after_s is not None else max(1.0, 2.0 * self.interval_s)
        self._profiler_backoff_s = profiler_backoff_s
        self._max_backoff_s = max_backoff_s
        self._init_retry_s = init_retry_s
        self._driver = NvmlDriver(log, clock, self._stall_after_s)
        self._cadence = Cadence(self.interval_s, None if cadence == EVERY_POLL else cpu_budget, slow_periods_s, log)
        self._cpu_s: float | None = None
        """CPU time of the poller thread after its latest poll (seconds)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shut_down = False
        self._lock = threading.Lock()  # guards the fields below; never held across an NVML call
        self._state = NvmlState.DISABLED
        self._reason = ""
        self._since: float | None = None
        self._latest: GpuSnapshot | None = None
        self._recent: deque[GpuSnapshot] = deque(maxlen=RECENT_SNAPSHOTS)
        self._polls = 0
        self._trainer: Mapping[int, tuple[str, str]] = {}
        self._readers: list[GpuReader] = []
        self._xids: XidWatcher | None = None
        self._driver_version = ""
        self._loaded = False

    # ------------------------------------------------------------------ public API

    def start(self) -> None:
        """Start the poller thread and return at once. A second call does nothing.

        Raises ``RuntimeError`` after ``shutdown()``.
        """
        with self._lock:
            if self._shut_down:
                raise RuntimeError("NvmlSource cannot be restarted after shutdown(); create a new one")
            if self._thread is not None:
                return
            self._state = NvmlState.STARTING
            self._thread = threading.Thread(target=self._run, name="nvml-poller", daemon=True)
        self._thread.start()

    def shutdown(self, timeout_s: float = 2.0) -> None:
        """Stop polling; waits at most ``timeout_s`` for the thread. Idempotent, safe without start."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            if thread.is_alive():
                in_flight = self._driver.in_flight
                self._log.warning("NVML poller did not stop within %.1f s (%s still running); abandoning it",
                                  timeout_s, in_flight[0] if in_flight else "no NVML call")
        with self._lock:
            self._shut_down = True
            self._state = NvmlState.STOPPED

    def latest(self) -> GpuSnapshot | None:
        """The newest snapshot (None before the first poll or without NVML). Never blocks."""
        return self._latest

    def recent(self, within_s: float) -> tuple[GpuSnapshot, ...]:
        """The snapshots of polls started within the last ``within_s`` seconds, oldest first (at
        most ``RECENT_SNAPSHOTS``): what the insight averages a window's GPU busy share over."""
        since = self._clock() - within_s
        with self._lock:
            return tuple(s for s in self._recent if s.taken_monotonic_s >= since)

    def set_trainer_processes(self, procs: Mapping[int, tuple[str, str]]) -> None:
        """Set the trainer processes to look for on the GPUs: ``{pid: (role, worker)}``.

        Fed from the shims' hellos; an empty mapping stops the per-GPU process queries.
        """
        self._trainer = dict(procs)

    def attribute_trainers(self, trainers: Mapping[int, tuple[str, str]], *, complete: bool) -> None:
        """Feedback from the shims: attribute these trainer pids' GPU memory to ``(role, worker)``.

        ``complete=False`` (a hello): add to or update the pids already known. ``complete=True``
        (a window's live senders): exactly these, forgetting the pids of senders the registry
        has forgotten. Does nothing when nothing changes (the poller keeps its mapping).
        """
        current = self._trainer
        wanted = dict(trainers) if complete else {**current, **trainers}
        if wanted != current:
            self._trainer = wanted

    def status(self) -> NvmlStatus:
        """Health of the source. Never blocks on NVML."""
        with self._lock:
            state, reason, since, polls = self._state, self._reason, self._since, self._polls
            latest = self._latest
        stalled_call = None
        in_flight = self._driver.in_flight
        if state in (NvmlState.AVAILABLE, NvmlState.STARTING) and in_flight is not None:
            hanging_s = self._clock() - in_flight[1]
            if hanging_s > self._stall_after_s:
                state, since, stalled_call = NvmlState.STALLED, in_flight[1], in_flight[0]
                reason = f"NVML call {in_flight[0]} has not returned for {hanging_s:.1f} s"
        gpus = latest.gpus if latest is not None else ()
        hung: tuple[int, ...] = ()
        if in_flight is not None and in_flight[2] is not None and self._clock() - in_flight[1] > self.interval_s:
            hung = (in_flight[2],)  # it has missed its poll: "up" drops before a second one is missed
        return NvmlStatus(
            state=state,
            reason=reason,
            since_monotonic_s=since,
            stalled_call=stalled_call,
            last_poll_duration_s=latest.poll_duration_s if latest is not None else None,
            last_poll_calls=latest.nvml_calls if latest is not None else None,
            polls_total=polls,
            errors=tuple(sorted(self._driver.error_counts().items())),
            gpus_lost=tuple(g.index for g in gpus if not g.up),
            hung_gpus=hung,
            profiler_busy_gpus=tuple(g.index for g in gpus if g.profiling is ProfilingState.BUSY),
            call_costs=self._driver.call_costs(),
            cpu_seconds_total=self._cpu_s,
            cpu_budget_ratio=self._cadence.budget,
            intervals=self._cadence.intervals() if self._readers else (),
        )

    # ------------------------------------------------------------------ poller thread

    def _set_state(self, state: NvmlState, reason: str = "") -> None:
        with self._lock:
            if state is not NvmlState.UNAVAILABLE:
                self._since = None
            elif self._state is not NvmlState.UNAVAILABLE:
                self._since = self._clock()  # the first failure, not the latest retry
            if self._state is not NvmlState.STOPPED:
                self._state = state
            self._reason = reason

    def _run(self) -> None:
        try:
            if self._initialize():
                self._poll_loop()
        except Exception:  # noqa: BLE001 - a bug must not take the daemon down: say so and stop polling
            self._log.exception("NVML poller failed; GPU metrics stop")
            self._set_state(NvmlState.UNAVAILABLE, "internal error in the NVML poller (see the log)")
        finally:
            self._teardown()

    def _initialize(self) -> bool:
        backoff = Backoff(self._init_retry_s, self._max_backoff_s)
        logged: set[str] = set()
        while not self._stop.is_set():
            try:
                self._driver_version = self._driver.load(self.library_path)
                self._loaded = True
            except NvmlUnavailableError as exc:
                self._set_state(NvmlState.UNAVAILABLE, exc.reason)
                if exc.permanent:
                    self._log.info("NVML unavailable: %s; GPU metrics are off", exc.reason)
                    return False
                if exc.reason not in logged:
                    logged.add(exc.reason)
                    self._log.warning("NVML unavailable: %s; retrying (backing off up to %.0f s)",
                                      exc.reason, self._max_backoff_s)
                self._stop.wait(backoff.failed())
                continue
            if self._discover():
                return True
            self._driver.shutdown()
            self._loaded = False
            self._set_state(NvmlState.UNAVAILABLE, "cannot enumerate GPUs (nvmlDeviceGetCount failed)")
            self._stop.wait(backoff.failed())
        return False

    def _discover(self) -> bool:
        outcome, count = self._driver.try_call("nvmlDeviceGetCount")
        if outcome is not Outcome.OK:
            return False
        readers = [self._open_gpu(index) for index in range(int(count))]
        by_index = {reader.index: reader for reader in readers}
        self._xids = XidWatcher(self._driver, self._log, lambda index, xid: by_index[index].record_xid(xid))
        with_xid = self._xids.setup([(r.index, r.handle) for r in readers if not r.lost])
        for reader in readers:
            if reader.index in with_xid:
                reader.xid_errors_total = 0
        self._readers = readers
        gpm = sum(1 for r in readers if r.profiling is ProfilingState.ACTIVE)
        names = sorted({r.name for r in readers if r.name})
        budget = self._cadence.budget
        self._log.info("NVML: driver %s, %d GPU(s) (%s); GPM on %d, XID events on %d; polling every %.3g s, %s",
                       self._driver_version or "?", len(readers), ", ".join(names) or "-", gpm, len(with_xid),
                       self.interval_s, "every value every poll" if budget is None else
                       f"slow values within {budget * 100:.3g} % of a core")
        self._set_state(NvmlState.AVAILABLE)
        return True

    def _open_gpu(self, index: int) -> GpuReader:
        driver = self._driver
        uuid = name = pci_bus_id = ""
        gpm: GpmSampler | None = None
        try:
            outcome, handle = driver.try_call("nvmlDeviceGetHandleByIndex", index, gpu=index)
            if outcome is not Outcome.OK:
                handle = None
            if handle is not None:
                uuid = str(driver.try_call("nvmlDeviceGetUUID", handle, gpu=index)[1] or "")
                name = str(driver.try_call("nvmlDeviceGetName", handle, gpu=index)[1] or "")
                pci = driver.try_call("nvmlDeviceGetPciInfo", handle, gpu=index)[1]
                pci_bus_id = _text(getattr(pci, "busId", ""))
                gpm = GpmSampler(driver, handle, index, self._log, self._profiler_backoff_s, self._max_backoff_s)
                gpm.setup()
        except GpuLostError:
            driver.count_error("gpu_is_lost")
            self._log.error("GPU %d is lost at start (NVML_ERROR_GPU_IS_LOST); it is reported down", index)
            if gpm is not None:
                gpm.close()
            handle, gpm = None, None
        if handle is None:
            return GpuReader(driver, index, None, "", "", self._log, None)
        return GpuReader(driver, index, handle, uuid, name, self._log, gpm, pci_bus_id)

    def _poll_loop(self) -> None:
        next_at = self._clock()
        failures: set[str] = set()
        while not self._stop.is_set():
            try:
                self._poll_once()
            except Exception as exc:  # noqa: BLE001 - one bad poll must not end polling: count it, log once
                self._driver.count_error("internal_error")
                if type(exc).__name__ not in failures:
                    failures.add(type(exc).__name__)
                    self._log.exception("NVML poll failed (logged once per kind; counted as internal_error)")
            next_at += self.interval_s
            now = self._clock()
            if next_at < now:
                next_at = now  # a slow poll delays the next one; it never causes a burst
            self._stop.wait(next_at - now)

    def _poll_once(self) -> None:
        started = self._clock()
        cpu0 = self._cpu_s if self._cpu_s is not None else time.thread_time()  # since the last poll ended
        calls_before = self._driver.calls
        trainer = self._trainer
        if self._xids is not None:
            self._xids.drain()
        readers, cadence = self._readers, self._cadence
        readings = []
        for position, reader in enumerate(readers):
            slow = frozenset() if reader.lost else cadence.due(reader.index, started)
            readings.append(reader.read(trainer, started, slow))
            done = slow if reader.gpm_primed else slow - {"gpm"}  # GPM's first metrics need a second sample
            cadence.read(reader.index, done, started, phase=position / len(readers))
        finished = self._clock()
        self._cpu_s = time.thread_time()
        slow_cpu = {unit: [r.slow_cpu_s[unit] for r in readers if unit in r.slow_cpu_s] for unit in ("fields", "gpm")}
        cadence.measured(self._cpu_s - cpu0 - sum(map(sum, slow_cpu.values())), slow_cpu,
                         {"fields": sum(1 for r in readers if not r.lost),
                          "gpm": sum(1 for r in readers if r.profiling is ProfilingState.ACTIVE)})
        snapshot = GpuSnapshot(started, finished - started, self._driver.calls - calls_before, tuple(readings),
                               self._driver_version)
        with self._lock:
            self._latest = snapshot
            self._recent.append(snapshot)
            self._polls += 1
            if self._state is NvmlState.STARTING:
                self._state = NvmlState.AVAILABLE

    def _teardown(self) -> None:
        if not self._loaded:
            return
        for reader in self._readers:
            reader.close()
        if self._xids is not None:
            self._xids.close()
        self._driver.shutdown()
        self._loaded = False


def probe_nvml(library_path: str | None = None, timeout_s: float = 5.0) -> tuple[bool, str]:
    """Check NVML for ``dflash-sidecar check``: ``(ok, one-line message)``. Never hangs.

    Runs init, device count and names on a daemon thread and gives up after ``timeout_s``.
    """
    result: list[tuple[bool, str]] = []
    driver = NvmlDriver(_LOG)

    def probe() -> None:
        try:
            version = driver.load(library_path)
        except NvmlUnavailableError as exc:
            result.append((False, f"NVML unavailable: {exc.reason}"))
            return
        try:
            outcome, count = driver.try_call("nvmlDeviceGetCount")
            if outcome is not Outcome.OK:
                result.append((False, "NVML initialized but nvmlDeviceGetCount failed"))
                return
            names = [_device_name(driver, index) for index in range(int(count))]
            listing = "; ".join(f"{i}: {n}" for i, n in enumerate(names))
            result.append((True, f"NVML OK: driver {version or '?'}, {count} GPU(s){': ' + listing if names else ''}"))
        except GpuLostError as exc:
            result.append((False, f"NVML: a GPU is lost ({exc.function})"))
        finally:
            driver.shutdown()

    thread = threading.Thread(target=probe, name="nvml-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if result:
        return result[0]
    in_flight = driver.in_flight
    return False, f"NVML did not answer within {timeout_s:g} s ({in_flight[0] if in_flight else 'a call'} is hanging)"


def _text(value: Any) -> str:
    """An NVML string field as str (pynvml gives bytes or str depending on the structure)."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value or "")


def _device_name(driver: NvmlDriver, index: int) -> str:
    outcome, handle = driver.try_call("nvmlDeviceGetHandleByIndex", index, gpu=index)
    if outcome is not Outcome.OK:
        return "unavailable"
    name: Any = driver.try_call("nvmlDeviceGetName", handle, gpu=index)[1]
    return str(name or "unknown")
