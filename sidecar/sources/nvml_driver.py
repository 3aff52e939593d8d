"""The one door to NVML: the only module of the project that imports or calls ``pynvml``.

Every call goes through ``NvmlDriver``, which counts calls, measures each call kind's cost (wall
time and the calling thread's CPU time), records the call in flight (so other threads can see a
wedged driver without touching NVML), maps every NVML error to an
``Outcome`` ("not available" in one of a few flavours), logs a missing function or a new
kind of error once, and raises ``GpuLostError`` when a GPU has fallen off the bus.

``pynvml`` comes from the ``nvidia-ml-py`` distribution (not the deprecated ``pynvml`` one).
It loads ``libnvidia-ml.so.1`` by name; ``load(library_path)`` first opens an explicit file
with ``ctypes`` so that the dynamic loader's by-name lookup finds it already loaded (this
matches the library's SONAME, which is ``libnvidia-ml.so.1`` for every NVIDIA driver).
"""

from __future__ import annotations

import ctypes
import enum
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from sidecar.model.gpu import NvmlCallCost

try:
    import pynvml
except ImportError:  # the daemon still runs without GPU metrics
    pynvml = None

_VALUE_ATTRIBUTES = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}

# pynvml's structures override __getattribute__/__setattr__ in Python, only to turn bytes into
# str, which costs about half a microsecond per access: a poll of 8 GPUs made ~800 of them to
# read the field values and GPM metrics (a fifth of its CPU). The fields read and written
# through these are numbers, so ctypes' own accessors give the same values without the detour.
_get_field = ctypes.Structure.__getattribute__
_set_field = ctypes.Structure.__setattr__

# Error codes (nvml.h nvmlReturn_t; part of the ABI, so numbers are safe fallbacks).
SUCCESS = 0
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
IN_USE = 19
INSUFFICIENT_RESOURCES = 23
ARGUMENT_VERSION_MISMATCH = 25

# Codes that mean "this GPU or driver cannot give this value", not "this read failed". An old
# driver answers a field id it does not know with INVALID_ARGUMENT.
_UNSUPPORTED_CODES = frozenset({NOT_SUPPORTED, ARGUMENT_VERSION_MISMATCH, INVALID_ARGUMENT})


def constant(name: str, fallback: int) -> int:
    """An NVML constant from pynvml, or ``fallback`` when this pynvml predates it."""
    return int(getattr(pynvml, name, fallback)) if pynvml is not None else fallback


@functools.lru_cache(maxsize=64)
def error_reason(code: int) -> str:
    """Stable snake_case name of an NVML error code, e.g. ``gpu_is_lost``; ``error_<n>`` if unknown."""
    if pynvml is not None:
        for attribute in dir(pynvml):
            if attribute.startswith("NVML_ERROR_") and getattr(pynvml, attribute) == code:
                return attribute[len("NVML_ERROR_"):].lower()
    return f"error_{code}"


class Outcome(enum.Enum):
    """Result class of one NVML call."""

    OK = "ok"
    UNSUPPORTED = "unsupported"
    """Not supported on this GPU/driver (a steady state, not counted as an error)."""
    MISSING = "missing"
    """This NVML library lacks the function (old driver); logged once."""
    ERROR = "error"
    """The call failed this time; counted by reason."""


class GpuLostError(Exception):
    """A call returned ``NVML_ERROR_GPU_IS_LOST``."""

    def __init__(self, function: str) -> None:
        super().__init__(f"{function}: GPU is lost")
        self.function = function


class NvmlCallError(Exception):
    """An NVML call failed with ``code`` (raised by ``NvmlDriver.call_raw`` only)."""

    def __init__(self, function: str, code: int) -> None:
        super().__init__(f"{function} failed: {error_reason(code)} ({code})")
        self.function = function
        self.code = code


class NvmlUnavailableError(Exception):
    """NVML cannot be used. ``permanent``: retrying will not help (no library)."""

    def __init__(self, reason: str, permanent: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.permanent = permanent


class NvmlDriver:
    """Thin, counting, error-mapping wrapper around ``pynvml``; used from one thread only.

    ``in_flight`` (``(function, started monotonic s, gpu index or None)``) and ``calls`` are
    plain attributes other threads may read without a lock (a tuple or int assignment is atomic);
    ``error_counts()`` and ``call_costs()`` copy under a short lock that is never held across an
    NVML call.
    """

    def __init__(self, log: logging.Logger, clock: Callable[[], float] = time.monotonic,
                 stall_after_s: float = 2.0) -> None:
        self.log = log
        self.clock = clock
        self.stall_after_s = stall_after_s
        self.calls = 0
        self.in_flight: tuple[str, float, int | None] | None = None
        self._errors: dict[str, int] = {}
        self._costs: dict[str, list[float]] = {}
        """Per call label: [calls, wall seconds, thread CPU seconds]."""
        self._errors_lock = threading.Lock()
        self._logged: set[tuple[object, ...]] = set()

    # ------------------------------------------------------------------ lifecycle

    def load(self, library_path: str | None) -> str:
        """Load and initialize NVML; returns the driver version ("" if unknown).

        Raises ``NvmlUnavailableError`` (``permanent`` when there is no library at all).
        """
        if pynvml is None:
            raise NvmlUnavailableError("the nvidia-ml-py package (module pynvml) is not installed", True)
        if library_path:
            try:
                ctypes.CDLL(library_path, mode=ctypes.RTLD_GLOBAL)
            except OSError as exc:
                raise NvmlUnavailableError(f"cannot load NVML library {library_path}: {exc}", True) from exc
        try:
            self.call_raw("nvmlInit")
        except NvmlCallError as exc:
            if exc.code == LIBRARY_NOT_FOUND:
                raise NvmlUnavailableError("NVML library libnvidia-ml.so.1 not found (no NVIDIA driver)", True) from exc
            raise NvmlUnavailableError(f"nvmlInit failed: {error_reason(exc.code)}", False) from exc
        outcome, version = self.try_call("nvmlSystemGetDriverVersion")
        return str(version) if outcome is Outcome.OK else ""

    def shutdown(self) -> None:
        """``nvmlShutdown``; errors are logged, never raised."""
        try:
            self.call_raw("nvmlShutdown")
        except NvmlCallError as exc:
            self.log.debug("nvmlShutdown: %s", exc)

    # ------------------------------------------------------------------ calls

    def call_raw(self, function: str, *args: Any, label: str | None = None, gpu: int | None = None) -> Any:
        """Call ``pynvml.<function>(*args)``; raises ``NvmlCallError`` with the NVML code.

        ``label`` names the C function in logs and errors when it differs from the pynvml one
        (``nvmlDeviceGetMemoryInfo(handle, nvmlMemory_v2)`` calls ``nvmlDeviceGetMemoryInfo_v2``).
        ``gpu``: the GPU the call is about (None for system calls), shown in ``in_flight``.
        """
        name = label or function
        target = getattr(pynvml, function, None)
        if target is None:
            raise NvmlCallError(name, FUNCTION_NOT_FOUND)
        started = self.clock()
        self.in_flight = (name, started, gpu)
        self.calls += 1
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        try:
            return target(*args)
        except pynvml.NVMLError as exc:
            raise NvmlCallError(name, int(exc.value)) from None
        finally:
            self._add_cost(name, time.perf_counter() - wall0, time.thread_time() - cpu0)
            self.in_flight = None
            took = self.clock() - started
            if took > self.stall_after_s:
                self.count_error("stalled_call")
                self.log.warning("NVML call %s took %.1f s (driver stalled); polling goes on", name, took)

    def try_call(self, function: str, *args: Any, gpu: int | None = None, label: str | None = None
                 ) -> tuple[Outcome, Any]:
        """Call ``function`` and classify the result; the value is None unless ``Outcome.OK``.

        Raises ``GpuLostError`` on ``NVML_ERROR_GPU_IS_LOST``.
        """
        try:
            return Outcome.OK, self.call_raw(function, *args, label=label, gpu=gpu)
        except NvmlCallError as exc:
            return self.classify(exc, gpu), None

    def classify(self, exc: NvmlCallError, gpu: int | None) -> Outcome:
        """Map a failed call to an ``Outcome``, counting and logging once as needed."""
        if exc.code == GPU_IS_LOST:
            raise GpuLostError(exc.function)
        if exc.code == FUNCTION_NOT_FOUND:
            self.log_once(("missing", exc.function), logging.INFO,
                          "NVML: %s is not in this driver's library; using a fallback or leaving it out", exc.function)
            return Outcome.MISSING
        if exc.code in _UNSUPPORTED_CODES:
            self.log_once(("unsupported", exc.function, gpu), logging.DEBUG,
                          "NVML: %s not supported on GPU %s", exc.function, gpu)
            return Outcome.UNSUPPORTED
        reason = error_reason(exc.code)
        self.count_error(reason)
        self.log_once(("error", exc.function, reason, gpu), logging.WARNING,
                      "NVML: %s failed on GPU %s: %s (logged once; counted in errors)", exc.function, gpu, reason)
        return Outcome.ERROR

    def count_error(self, reason: str) -> None:
        """Add one to the error counter for ``reason``."""
        with self._errors_lock:
            self._errors[reason] = self._errors.get(reason, 0) + 1

    def _add_cost(self, name: str, wall_s: float, cpu_s: float) -> None:
        with self._errors_lock:
            cost = self._costs.get(name)
            if cost is None:
                self._costs[name] = [1, wall_s, cpu_s]
            else:
                cost[0] += 1
                cost[1] += wall_s
                cost[2] += cpu_s

    def call_costs(self) -> tuple[NvmlCallCost, ...]:
        """Every call kind made so far with its cumulative count, wall time and CPU time, by name."""
        with self._errors_lock:
            return tuple(NvmlCallCost(name, int(c[0]), c[1], c[2]) for name, c in sorted(self._costs.items()))

    def error_counts(self) -> dict[str, int]:
        """A copy of the error counters."""
        with self._errors_lock:
            return dict(self._errors)

    def log_once(self, key: tuple[object, ...], level: int, message: str, *args: object) -> None:
        """Log ``message`` the first time ``key`` is seen."""
        if key not in self._logged:
            self._logged.add(key)
            self.log.log(level, message, *args)

    # ------------------------------------------------------------------ structured helpers

    @staticmethod
    def handle_key(handle: Any) -> int:
        """A hashable identity of a device handle (its address), to match event data to GPUs."""
        return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)

    def field_values(self, handle: Any, field_ids: Sequence[int], gpu: int
                     ) -> tuple[Outcome, list[tuple[int, float | None, int]]]:
        """``nvmlDeviceGetFieldValues``: per field ``(nvml return code, value, timestamp µs)``."""
        outcome, values = self.try_call("nvmlDeviceGetFieldValues", handle, list(field_ids), gpu=gpu)
        if outcome is not Outcome.OK:
            return outcome, []
        results: list[tuple[int, float | None, int]] = []
        for item in values:
            code = int(_get_field(item, "nvmlReturn"))
            value = None
            if code == SUCCESS:
                value = getattr(_get_field(item, "value"), _VALUE_ATTRIBUTES.get(int(_get_field(item, "valueType")),
                                                                                  "ullVal"))
            results.append((code, value, int(_get_field(item, "timestamp"))))
        return Outcome.OK, results

    def gpm_metrics(self, sample1: Any, sample2: Any, metric_ids: Sequence[int], gpu: int
                    ) -> tuple[Outcome, int, dict[int, float | None]]:
        """``nvmlGpmMetricsGet`` from two samples (older first).

        Returns ``(outcome, nvml code, {metric id: value or None})``; the code lets the caller
        tell "another profiler holds the counters" from other failures.
        """
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = constant("NVML_GPM_METRICS_GET_VERSION", 1)
        request.numMetrics = len(metric_ids)
        request.sample1 = sample1
        request.sample2 = sample2
        slots = [_get_field(request, "metrics")[i] for i in range(len(metric_ids))]
        for slot, metric_id in zip(slots, metric_ids):
            _set_field(slot, "metricId", metric_id)
        try:
            self.call_raw("nvmlGpmMetricsGet", request, gpu=gpu)
        except NvmlCallError as exc:
            return self.classify_gpm(exc, gpu), exc.code, {}
        return Outcome.OK, SUCCESS, {
            _get_field(slot, "metricId"): (float(_get_field(slot, "value")) if _get_field(slot, "nvmlReturn") == SUCCESS
                                           else None)
            for slot in slots
        }

    def gpm_sample(self, handle: Any, sample: Any, gpu: int) -> tuple[Outcome, int]:
        """``nvmlGpmSampleGet`` into ``sample``; returns ``(outcome, nvml code)``."""
        try:
            self.call_raw("nvmlGpmSampleGet", handle, sample, gpu=gpu)
        except NvmlCallError as exc:
            return self.classify_gpm(exc, gpu), exc.code
        return Outcome.OK, SUCCESS

    def classify_gpm(self, exc: NvmlCallError, gpu: int) -> Outcome:
        """Like ``classify``, but a profiler holding the counters is a state, not an error."""
        if exc.code in (IN_USE, INSUFFICIENT_RESOURCES):
            return Outcome.ERROR
        return self.classify(exc, gpu)
