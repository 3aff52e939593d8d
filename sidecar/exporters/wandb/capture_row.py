"""A kept profiler capture's figures as one W&B row (docs/METRICS.md, "Captures"; the keys'
patterns in ``keys``), logged once per new capture by ``sidecar.core.capture_watch``."""

from __future__ import annotations

from sidecar.model.trace import CaptureView

FIGURES: tuple[tuple[str, str], ...] = (
    ("host_ops_ratio", "host_busy_s"),
    ("data_wait_ratio", "data_wait_s"),
)
"""(key, breakdown field): shares of the captured steps' wall time, every capture."""
GPU_FIGURES: tuple[tuple[str, str], ...] = (
    ("gpu_busy_ratio", "gpu_busy_s"),
    ("gpu_idle_host_wait_ratio", "idle_host_wait_s"),
    ("gpu_idle_kernel_wait_ratio", "idle_kernel_wait_s"),
    ("gpu_idle_other_ratio", "idle_other_s"),
    ("communication_ratio", "communication_s"),
    ("memcpy_ratio", "memcpy_s"),
)
"""The same, for a capture with device activity only."""


def capture_row(view: CaptureView) -> dict[str, float]:
    """``capture/<role>/<worker>/<figure>``: the step time and the shares (none without steps)."""
    b = view.breakdown
    if not b.steps:
        return {}
    prefix = f"capture/{view.role}/{view.worker}/"
    row = {prefix + "step_s": b.total("wall_s") / len(b.steps)}
    for key, attribute in FIGURES + (GPU_FIGURES if b.has_gpu else ()):
        row[prefix + key] = b.share(attribute) or 0.0
    return row
