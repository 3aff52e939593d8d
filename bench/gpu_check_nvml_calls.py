"""The NVML calls the sidecar makes, one kind at a time: outcome and cost per call on this driver.

Used by ``gpu_check_nvml.py``. Every call goes through the sidecar's own ``NvmlDriver`` (the one
door to pynvml) and is repeated ``reps`` times per GPU; the call lists come from
``sidecar.sources.nvml_gpu`` (including the versions a poll falls back to), so this table
covers what a poll may call. A sandboxed or older kernel driver may refuse some calls: each row
says ``ok``, ``unsupported (<nvml reason>)``, ``missing`` (not in this library) or
``error (<nvml reason>)``.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

from sidecar.sources.nvml_driver import (
    ARGUMENT_VERSION_MISMATCH,
    FUNCTION_NOT_FOUND,
    INVALID_ARGUMENT,
    NOT_SUPPORTED,
    SUCCESS,
    TIMEOUT,
    NvmlCallError,
    NvmlDriver,
    constant,
    error_reason,
)
from sidecar.sources.nvml_events import XID_EVENT
from sidecar.sources.nvml_gpm import METRICS, MIN_SAMPLE_GAP_S
from sidecar.sources.nvml_gpu import (
    CLOCK_EVENTS,
    FIELDS,
    LEGACY_FUNCTIONS,
    MEM_CLOCK,
    MEMORY,
    POWER,
    PROCESSES,
    SM_CLOCK,
    TEMPERATURE,
    UTILIZATION,
    Call,
)

GROUPS: tuple[tuple[str, tuple[Call, ...]], ...] = (
    ("utilization", UTILIZATION), ("memory", MEMORY), ("power", POWER), ("temperature", TEMPERATURE),
    ("sm clock", SM_CLOCK),
    ("mem clock", MEM_CLOCK), ("clock events", CLOCK_EVENTS),
    ("processes", PROCESSES + (Call("nvmlDeviceGetComputeRunningProcesses", (),
                                    "nvmlDeviceGetComputeRunningProcesses (pynvml: the _v3 symbol)"),)),
    ("legacy fields", tuple(Call(f) for f in LEGACY_FUNCTIONS.values())),
)
FIELD_NAMES = {constant(n, -1): n[len("NVML_FI_DEV_"):].lower() for n in (
    "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "NVML_FI_DEV_MEMORY_TEMP", "NVML_FI_DEV_POWER_INSTANT",
    "NVML_FI_DEV_POWER_CURRENT_LIMIT", "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES",
    "NVML_FI_DEV_ECC_SBE_VOL_TOTAL", "NVML_FI_DEV_ECC_DBE_VOL_TOTAL")}
PCIE_TX_BYTES = constant("NVML_PCIE_UTIL_TX_BYTES", 0)


def status_of(code: int) -> str:
    """``ok`` / ``missing`` / ``unsupported (reason)`` / ``error (reason)`` for an NVML return code."""
    if code == SUCCESS:
        return "ok"
    if code == FUNCTION_NOT_FOUND:
        return "missing"
    kind = "unsupported" if code in (NOT_SUPPORTED, ARGUMENT_VERSION_MISMATCH, INVALID_ARGUMENT) else "error"
    return f"{kind} ({error_reason(code)})"


def time_call(label: str, call: Callable[[], Any], reps: int, ok_codes: tuple[int, ...] = ()) -> dict[str, Any]:
    """Run ``call`` up to ``reps`` times: outcome, median and max in µs. Stops at the first failure
    (``ok_codes``: failures that are the normal answer, e.g. a timeout of an empty event wait)."""
    durations, status = [], "ok"
    for _ in range(reps):
        started = time.perf_counter_ns()
        try:
            call()
        except NvmlCallError as exc:
            if exc.code not in ok_codes:
                status = status_of(exc.code)
                durations.append(time.perf_counter_ns() - started)
                break
        durations.append(time.perf_counter_ns() - started)
    return {"call": label, "status": status, "n": len(durations),
            "median_us": statistics.median(durations) / 1e3, "max_us": max(durations) / 1e3}


def gpu_calls(driver: NvmlDriver, handle: Any, reps: int) -> list[dict[str, Any]]:
    """Every call kind of one GPU's poll (and the ones a poll may fall back to)."""
    rows: list[dict[str, Any]] = []
    for group, calls in GROUPS:
        for c in calls:
            label = c.label or c.function
            row = time_call(label, functools.partial(driver.call_raw, c.function, handle, *c.args, label=label), reps)
            rows.append({"group": group, **row})
    batch = time_call(f"nvmlDeviceGetFieldValues ({len(FIELDS)} fields)",
                      lambda: driver.call_raw("nvmlDeviceGetFieldValues", handle, list(FIELDS)), reps)
    rows.append({"group": "field values", **batch})
    if batch["status"] == "ok":
        try:
            items = driver.call_raw("nvmlDeviceGetFieldValues", handle, list(FIELDS))
        except NvmlCallError:
            items = []
        for item in items:
            field_id = int(item.fieldId)
            rows.append({"group": "field values", "call": f"  field {FIELD_NAMES.get(field_id, field_id)}",
                         "status": status_of(int(item.nvmlReturn)), "n": 0, "median_us": None, "max_us": None})
    rows.append({"group": "pcie (not polled)", **time_call(
        "nvmlDeviceGetPcieThroughput (not polled: samples 20 ms)",
        lambda: driver.call_raw("nvmlDeviceGetPcieThroughput", handle, PCIE_TX_BYTES), min(reps, 3))})
    rows += gpm_calls(driver, handle, reps)
    return rows


def gpm_calls(driver: NvmlDriver, handle: Any, reps: int) -> list[dict[str, Any]]:
    """GPM: support query, one sample, the metrics between two samples (``MIN_SAMPLE_GAP_S`` apart)."""
    rows = [{"group": "gpm", **time_call("nvmlGpmQueryDeviceSupport",
                                         lambda: driver.call_raw("nvmlGpmQueryDeviceSupport", handle), reps)}]
    if rows[0]["status"] != "ok":
        return rows
    if not driver.call_raw("nvmlGpmQueryDeviceSupport", handle).isSupportedDevice:
        rows[0]["status"] = "ok (GPM not supported by this GPU)"
        return rows
    samples: list[Any] = []
    try:
        for _ in range(2):
            samples.append(driver.call_raw("nvmlGpmSampleAlloc"))
        driver.call_raw("nvmlGpmSampleGet", handle, samples[0])
        time.sleep(MIN_SAMPLE_GAP_S * 1.5)
        sample = functools.partial(driver.call_raw, "nvmlGpmSampleGet", handle, samples[1])
        rows.append({"group": "gpm", **time_call("nvmlGpmSampleGet", sample, reps)})

        def metrics() -> None:
            _, code, _ = driver.gpm_metrics(samples[0], samples[1], list(METRICS), 0)
            if code != SUCCESS:
                raise NvmlCallError("nvmlGpmMetricsGet", code)

        rows.append({"group": "gpm", **time_call(f"nvmlGpmMetricsGet ({len(METRICS)} metrics)", metrics, reps)})
    except NvmlCallError as exc:  # allocation or the first sample failed: that is the finding
        rows.append({"group": "gpm", "call": exc.function, "status": status_of(exc.code), "n": 1,
                     "median_us": None, "max_us": None})
    finally:
        for sample in samples:
            driver.try_call("nvmlGpmSampleFree", sample)
    return rows


def system_calls(driver: NvmlDriver, handles: list[Any], reps: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Calls made once per poll for all GPUs (the XID event drain) and the versions; rows and versions."""
    versions = {}
    for key, function in (("driver", "nvmlSystemGetDriverVersion"), ("nvml", "nvmlSystemGetNVMLVersion"),
                          ("cuda_driver", "nvmlSystemGetCudaDriverVersion")):
        try:
            versions[key] = driver.call_raw(function)
        except NvmlCallError as exc:
            versions[key] = status_of(exc.code)
    if isinstance(versions.get("cuda_driver"), int):
        versions["cuda_driver"] = f"{versions['cuda_driver'] // 1000}.{versions['cuda_driver'] % 1000 // 10}"
    rows = [{"group": "system", **time_call("nvmlDeviceGetCount", lambda: driver.call_raw("nvmlDeviceGetCount"), reps)}]
    try:
        event_set = driver.call_raw("nvmlEventSetCreate")
    except NvmlCallError as exc:
        rows.append({"group": "system", "call": "nvmlEventSetCreate", "status": status_of(exc.code), "n": 1,
                     "median_us": None, "max_us": None})
        return rows, versions
    try:
        registered = 0
        for handle in handles:
            try:
                if driver.call_raw("nvmlDeviceGetSupportedEventTypes", handle) & XID_EVENT:
                    driver.call_raw("nvmlDeviceRegisterEvents", handle, XID_EVENT, event_set)
                    registered += 1
            except NvmlCallError as exc:
                rows.append({"group": "system", "call": "nvmlDeviceRegisterEvents (XID)", "status": status_of(exc.code),
                             "n": 1, "median_us": None, "max_us": None})
        rows.append({"group": "system", **time_call(
            f"nvmlEventSetWait_v2 (0 ms, XID events on {registered} GPU(s))",
            lambda: driver.call_raw("nvmlEventSetWait", event_set, 0, label="nvmlEventSetWait_v2"), reps,
            ok_codes=(TIMEOUT,))})
    finally:
        driver.try_call("nvmlEventSetFree", event_set)
    return rows, versions


def per_poll_estimate(rows: list[dict[str, Any]], processes: bool, gpm: bool) -> float:
    """µs per GPU per poll from the medians: the first ``ok`` call of each group a poll makes."""
    total, seen = 0.0, set()
    polled = {"utilization", "memory", "power", "temperature", "sm clock", "mem clock", "clock events", "field values"}
    polled |= {"processes"} if processes else set()
    for row in rows:
        group = row["group"]
        wanted = group in polled or (gpm and group == "gpm" and row["call"] != "nvmlGpmQueryDeviceSupport")
        if wanted and row["status"] == "ok" and row["median_us"] is not None and (group == "gpm" or group not in seen):
            total += row["median_us"]
            seen.add(group)
    return total


def print_table(per_gpu: dict[int, list[dict[str, Any]]], system: list[dict[str, Any]]) -> None:
    """call -> outcome and median/max µs, one column per GPU."""
    gpus = sorted(per_gpu)
    print(f"\nNVML calls, one kind at a time: outcome, median/max µs per call ({', '.join(f'GPU {g}' for g in gpus)})")
    for row in system:
        cost = "" if row["median_us"] is None else f"{row['median_us']:.1f}/{row['max_us']:.1f}"
        print(f"  {row['call']:60} {row['status']:28} {cost}")
    for position, row in enumerate(per_gpu[gpus[0]]):
        cells = []
        for g in gpus:
            other = per_gpu[g][position] if position < len(per_gpu[g]) else row
            cost = "" if other["median_us"] is None else f" {other['median_us']:.1f}/{other['max_us']:.1f}"
            cells.append(f"{other['status']}{cost}")
        print(f"  {row['call']:60} " + "  |  ".join(f"{c:28}" for c in cells))
