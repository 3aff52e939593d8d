"""Prometheus metric families for the NVML source, built fresh at every scrape.

``gpu_metric_families`` is a pure function of a ``GpuView`` (the latest snapshot, the source
status and the group aggregates): it never calls NVML and never waits, so the daemon's scrape-time collector can call it
directly. A GPU that is down (lost, or an NVML call on it hanging for more than a poll
interval) keeps only ``dflash_gpu_up 0`` and its XID series; a value a GPU
does not report has no sample at all (never a fake 0). Names use base units and the
``dflash_`` prefix; labels are ``host`` and ``gpu`` / ``group`` plus ``reason``, ``type``,
``pid``, ``role``, ``worker`` where a family needs them. The full list is in ``docs/NVML.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sidecar.model.gpu import (
    GPU_METRICS,
    XID_METRICS,
    GpuMetric,
    GpuReading,
    GpuSnapshot,
    GpuView,
    GroupAggregate,
    NvmlState,
    NvmlStatus,
    ProfilingState,
)


def gpu_metric_families(view: GpuView, host: str, now_monotonic_s: float) -> list[Metric]:
    """All NVML families for one scrape. Empty when the source is disabled."""
    snapshot, status = view.snapshot, view.status
    if status.state is NvmlState.DISABLED:
        return []
    families = _health_families(snapshot, status, host, now_monotonic_s)
    if snapshot is None:
        return [family for family in families if family.samples]
    readings = snapshot.gpus
    up = answering(readings, status)
    up_indices = {r.index for r in up}
    families.append(_gauge("dflash_gpu_up", "1 if the GPU answers NVML; 0 once it is lost or while an NVML call on it "
                           "has hung longer than a poll interval (its values are then left out).", ["host", "gpu"],
                           (([host, str(r.index)], 1.0 if r.index in up_indices else 0.0) for r in readings)))
    families.extend(_table_families(GPU_METRICS, up, host))
    families.extend(_table_families(XID_METRICS, readings, host))
    families.extend(_xid_code_families(readings, host))
    families.extend(_clock_event_families(up, host))
    families.extend(_violation_families(up, host))
    families.extend(_ecc_families(up, host))
    families.extend(_process_families(up, host))
    families.extend(_profiling_families(up, host))
    families.extend(_group_families(view.groups, host))
    return [family for family in families if family.samples]


def answering(readings: Sequence[GpuReading], status: NvmlStatus) -> list[GpuReading]:
    """The readings of GPUs that are up and have no NVML call hanging (``status.hung_gpus``)."""
    hung = status.hung_gpus
    return [r for r in readings if r.up and r.index not in hung]


_Family = TypeVar("_Family", GaugeMetricFamily, CounterMetricFamily)


def _filled(family: _Family, samples: Iterable[tuple[list[str], float]]) -> _Family:
    for label_values, value in samples:
        family.add_metric(label_values, value)
    return family


def _gauge(name: str, help_text: str, labels: list[str], samples: Iterable[tuple[list[str], float]]
           ) -> GaugeMetricFamily:
    return _filled(GaugeMetricFamily(name, help_text, labels=labels), samples)


def _counter(name: str, help_text: str, labels: list[str], samples: Iterable[tuple[list[str], float]]
             ) -> CounterMetricFamily:
    return _filled(CounterMetricFamily(name, help_text, labels=labels), samples)


def _health_families(snapshot: GpuSnapshot | None, status: NvmlStatus, host: str, now: float) -> list[Metric]:
    labels = ["host"]
    families: list[Metric] = [
        _gauge("dflash_nvml_up", "1 while the NVML source polls normally (0: unavailable, stalled or stopped).",
               labels, [([host], 1.0 if status.state is NvmlState.AVAILABLE else 0.0)]),
        _gauge("dflash_nvml_stalled", "1 while an NVML call has been hanging longer than the stall threshold.",
               labels, [([host], 1.0 if status.state is NvmlState.STALLED else 0.0)]),
        _counter("dflash_nvml_polls", "NVML polls completed.", labels, [([host], float(status.polls_total))]),
        _counter("dflash_nvml_errors", "NVML errors by reason (gpu_is_lost, stalled_call, unknown, ...).",
                 ["host", "reason"], (([host, reason], float(n)) for reason, n in status.errors)),
    ]
    families += _cost_families(status, host)
    if snapshot is not None:
        families += [
            _gauge("dflash_nvml_data_age_seconds", "Age of the newest GPU data, in seconds.", labels,
                   [([host], max(0.0, now - snapshot.taken_monotonic_s))]),
            _gauge("dflash_nvml_poll_duration_seconds", "Duration of the last NVML poll, in seconds.", labels,
                   [([host], snapshot.poll_duration_s)]),
            _gauge("dflash_nvml_poll_calls", "NVML calls made by the last poll.", labels,
                   [([host], float(snapshot.nvml_calls))]),
        ]
    return families


def _cost_families(status: NvmlStatus, host: str) -> list[Metric]:
    """What polling costs: per NVML call kind, and the poller's CPU against its budget and cadences."""
    labels = ["host", "call"]
    costs = status.call_costs
    families: list[Metric] = [
        _counter("dflash_nvml_calls", "NVML calls made, per call kind.", labels,
                 (([host, c.call], float(c.calls)) for c in costs)),
        _counter("dflash_nvml_call_seconds", "Wall time spent inside NVML calls, per call kind, in seconds.", labels,
                 (([host, c.call], c.wall_s) for c in costs)),
        _counter("dflash_nvml_call_cpu_seconds", "CPU time of the polling thread inside NVML calls, per call kind, "
                 "in seconds (a driver that answers from a VM's hypervisor spends milliseconds here).", labels,
                 (([host, c.call], c.cpu_s) for c in costs)),
        _gauge("dflash_nvml_interval_seconds", "Seconds between two reads of a group of NVML values now: the poll "
               "interval for the values read every poll, longer for the slow ones (stretched to keep the CPU "
               "budget).", ["host", "values"], (([host, name], seconds) for name, seconds in status.intervals)),
    ]
    if status.cpu_seconds_total is not None:
        families.append(_counter("dflash_nvml_cpu_seconds", "CPU time of the NVML polling thread, in seconds.",
                                 ["host"], [([host], status.cpu_seconds_total)]))
    if status.cpu_budget_ratio is not None:
        families.append(_gauge("dflash_nvml_cpu_budget_ratio", "Share of one core the NVML poller may use "
                               "(nvml_cpu_budget).", ["host"], [([host], status.cpu_budget_ratio)]))
    return families


def _table_families(table: tuple[GpuMetric, ...], readings: Sequence[GpuReading], host: str) -> list[Metric]:
    families: list[Metric] = []
    for metric in table:
        samples = [([host, str(r.index)], float(v))
                   for r in readings if (v := getattr(r, metric.attribute)) is not None]
        build = _counter if metric.counter else _gauge
        families.append(build(metric.name, metric.help, ["host", "gpu"], samples))
    return families


def _clock_event_families(readings: list[GpuReading], host: str) -> list[Metric]:
    samples = []
    for reading in readings:
        for reason, active in reading.clock_events() or ():
            samples.append(([host, str(reading.index), reason], 1.0 if active else 0.0))
    return [_gauge("dflash_gpu_clock_event_active",
                   "1 while the clock-event (throttle) reason is holding the GPU clocks, else 0.",
                   ["host", "gpu", "reason"], samples)]


def _xid_code_families(readings: Sequence[GpuReading], host: str) -> list[Metric]:
    samples = [([host, str(r.index), str(code)], float(n)) for r in readings for code, n in r.xid_counts]
    return [_counter("dflash_gpu_xid_events", "XID error events seen since the sidecar started, per XID code "
                     "(xid=-1: codes beyond the first 64 distinct ones).", ["host", "gpu", "xid"], samples)]


def _violation_families(readings: list[GpuReading], host: str) -> list[Metric]:
    labels = ["host", "gpu", "reason"]
    totals = [([host, str(r.index), reason], seconds)
              for r in readings for reason, seconds in r.violation_seconds_total]
    ratios = [([host, str(r.index), reason], share) for r in readings for reason, share in r.violation_ratio]
    return [
        _counter("dflash_gpu_throttle_seconds",
                 "Seconds the GPU clocks were held below the application clocks, per reason, since the driver "
                 "was loaded (NVML violation counters: fields NVML_FI_DEV_PERF_POLICY_*).", labels, totals),
        _gauge("dflash_gpu_throttle_ratio",
               "Share (0-1) of the last NVML poll interval the reason held the clocks down "
               "(NVML violation counters).", labels, ratios),
    ]


def _ecc_families(readings: list[GpuReading], host: str) -> list[Metric]:
    samples = []
    for reading in readings:
        for kind, value in (("corrected", reading.ecc_corrected_total), ("uncorrected", reading.ecc_uncorrected_total)):
            if value is not None:
                samples.append(([host, str(reading.index), kind], float(value)))
    return [_counter("dflash_gpu_ecc_errors", "ECC errors since the driver was loaded, by type (volatile counts).",
                     ["host", "gpu", "type"], samples)]


def _process_families(readings: list[GpuReading], host: str) -> list[Metric]:
    samples = [([host, str(r.index), str(p.pid), p.role, p.worker], float(p.memory_bytes))
               for r in readings for p in r.processes if p.memory_bytes is not None]
    labels = ["host", "gpu"]
    return [
        _gauge("dflash_gpu_process_memory_bytes", "GPU memory used by a trainer process, in bytes.",
               ["host", "gpu", "pid", "role", "worker"], samples),
        _gauge("dflash_gpu_foreign_processes", "Compute processes on the GPU that are not trainer processes "
               "known from the shims' hellos (listed while any trainer is known).", labels,
               [([host, str(r.index)], float(r.foreign_processes)) for r in readings
                if r.foreign_processes is not None]),
        _gauge("dflash_gpu_foreign_process_memory_bytes", "GPU memory used by those foreign processes, in bytes.",
               labels, [([host, str(r.index)], float(r.foreign_memory_bytes)) for r in readings
                        if r.foreign_memory_bytes is not None]),
    ]


def _profiling_families(readings: list[GpuReading], host: str) -> list[Metric]:
    labels = ["host", "gpu"]
    return [
        _gauge("dflash_gpu_profiling_available", "1 while GPM profiling metrics are collected on the GPU.", labels,
               (([host, str(r.index)], 1.0 if r.profiling is ProfilingState.ACTIVE else 0.0) for r in readings)),
        _gauge("dflash_gpu_profiling_busy",
               "1 while another profiler holds the GPU's profiling counters (the sidecar backs off).", labels,
               (([host, str(r.index)], 1.0 if r.profiling is ProfilingState.BUSY else 0.0) for r in readings)),
    ]


def _group_families(aggregates: tuple[GroupAggregate, ...], host: str) -> list[Metric]:
    labels = ["host", "group"]

    def per_group(attribute: str) -> list[tuple[list[str], float]]:
        return [([host, a.name], float(v)) for a in aggregates if (v := getattr(a, attribute)) is not None]

    return [
        _gauge("dflash_gpu_group_info", "1 for each GPU of a group (join on gpu to label GPU series by group).",
               ["host", "gpu", "group"], (([host, str(i), a.name], 1.0) for a in aggregates for i in a.gpus)),
        _gauge("dflash_group_gpus_up", "GPUs of the group that are up.", labels,
               (([host, a.name], float(a.gpus_up)) for a in aggregates)),
        _gauge("dflash_group_gpu_utilization_ratio", "Mean GPU utilization over the group's GPUs.", labels,
               per_group("utilization_mean_ratio")),
        _gauge("dflash_group_power_watts", "Total power draw of the group's GPUs, in watts.", labels,
               per_group("power_total_watts")),
        _gauge("dflash_group_temperature_max_celsius", "Hottest GPU die of the group, in degrees Celsius.", labels,
               per_group("temperature_max_celsius")),
        _gauge("dflash_group_memory_free_min_bytes", "Least free device memory among the group's GPUs, in bytes.",
               labels, per_group("memory_free_min_bytes")),
    ]
