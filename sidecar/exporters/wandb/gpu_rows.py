"""Flat ``{key: float}`` rows of the NVML data for W&B (the W&B exporter adds ``sidecar/``).

Same values and units as the Prometheus families (``sidecar.model.gpu.GPU_METRICS`` is the one
table of per-GPU values); keys look like ``gpu/0/utilization``, ``gpu/0/clock_event/sw_power_cap``,
``group/target/power_watts``, ``nvml/data_age_seconds``. A value that is not available is left
out of the row, never written as 0 or NaN.
"""

from __future__ import annotations

from sidecar.model.gpu import GPU_METRICS, XID_METRICS, GpuView, NvmlState, ProfilingState

GROUP_VALUES = (
    ("utilization_mean_ratio", "utilization"),
    ("power_total_watts", "power_watts"),
    ("temperature_max_celsius", "temperature_max_celsius"),
    ("memory_free_min_bytes", "memory_free_min_bytes"),
    ("gpus_up", "gpus_up"),
)
"""(``GroupAggregate`` attribute, key under ``group/<name>/``) of each GPU group value."""


def gpu_wandb_row(view: GpuView, now_monotonic_s: float) -> dict[str, float]:
    """One W&B row of GPU values. Empty when the source is disabled."""
    snapshot, status = view.snapshot, view.status
    if status.state is NvmlState.DISABLED:
        return {}
    row: dict[str, float] = {"nvml/up": 1.0 if status.state is NvmlState.AVAILABLE else 0.0}
    if snapshot is None:
        return row
    row["nvml/data_age_seconds"] = max(0.0, now_monotonic_s - snapshot.taken_monotonic_s)
    row["nvml/poll_duration_seconds"] = snapshot.poll_duration_s
    for reading in snapshot.gpus:
        prefix = f"gpu/{reading.index}/"
        row[prefix + "up"] = 1.0 if reading.up else 0.0
        for metric in XID_METRICS + (GPU_METRICS if reading.up else ()):
            value = getattr(reading, metric.attribute)
            if value is not None:
                row[prefix + metric.wandb_key] = float(value)
        if not reading.up:
            continue
        for reason, active in reading.clock_events() or ():
            row[f"{prefix}clock_event/{reason}"] = 1.0 if active else 0.0
        for kind, count in (("corrected", reading.ecc_corrected_total), ("uncorrected", reading.ecc_uncorrected_total)):
            if count is not None:
                row[f"{prefix}ecc_{kind}_errors"] = float(count)
        row[prefix + "profiling_available"] = 1.0 if reading.profiling is ProfilingState.ACTIVE else 0.0
        row[prefix + "profiling_busy"] = 1.0 if reading.profiling is ProfilingState.BUSY else 0.0
        for process in reading.processes:
            if process.memory_bytes is not None:
                row[f"{prefix}process/{process.role}/{process.worker}/memory_bytes"] = float(process.memory_bytes)
    for aggregate in view.groups:
        for attribute, key in GROUP_VALUES:
            value = getattr(aggregate, attribute)
            if value is not None:
                row[f"group/{aggregate.name}/{key}"] = float(value)
    return row
