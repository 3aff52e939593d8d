"""The newest profiler capture's figures (docs/METRICS.md, "Captures"): read from the scrape
state, which reads the state folder's ``traces/`` when it changed. No capture kept: no family."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily, Metric

from sidecar.model.trace import CaptureView

LABELS = ["host", "role", "worker"]
SHARES = (
    ("dflash_capture_host_ops_ratio", "host_busy_s", "Share of the captured steps' wall time inside host operators."),
    ("dflash_capture_data_wait_ratio", "data_wait_s", "Share of the captured steps' wall time inside the "
                                                      "DataLoader's next()."),
)
GPU_SHARES = (
    ("dflash_capture_gpu_busy_ratio", "gpu_busy_s", "Share of the captured steps' wall time with device activity."),
    ("dflash_capture_communication_ratio", "communication_s", "Share of the captured steps' wall time in "
                                                              "communication kernels (nccl)."),
    ("dflash_capture_memcpy_ratio", "memcpy_s", "Share of the captured steps' wall time in memory copies and sets."),
)
IDLE = (("host_wait", "idle_host_wait_s"), ("kernel_wait", "idle_kernel_wait_s"), ("other", "idle_other_s"))


def capture_families(view: CaptureView | None, host: str) -> Iterable[Metric]:
    """The figures of ``view`` (none without a capture; the GPU ones only when it had device activity)."""
    if view is None or not view.breakdown.steps:
        return []
    b, labels = view.breakdown, [host, view.role, view.worker]
    when = GaugeMetricFamily("dflash_capture_last_timestamp_seconds",
                             "Unix time the newest kept profiler capture (dflash-sidecar trace) ended.", labels=LABELS)
    when.add_metric(labels, view.ended_unix_s)
    step = GaugeMetricFamily("dflash_capture_step_seconds", "Mean wall time of the captured steps.", labels=LABELS)
    step.add_metric(labels, b.total("wall_s") / len(b.steps))
    out: list[Metric] = [when, step]
    for name, attribute, help_text in SHARES + (GPU_SHARES if b.has_gpu else ()):
        family = GaugeMetricFamily(name, help_text, labels=LABELS)
        family.add_metric(labels, b.share(attribute) or 0.0)
        out.append(family)
    if b.has_gpu:
        idle = GaugeMetricFamily("dflash_capture_gpu_idle_ratio", "Share of the captured steps' wall time the GPU "
                                 "was idle, by cause (HTA's: host_wait, kernel_wait, other).",
                                 labels=[*LABELS, "cause"])
        for cause, attribute in IDLE:
            idle.add_metric([*labels, cause], b.share(attribute) or 0.0)
        out.append(idle)
    return out
