"""Flat rows for W&B: one ``dict[str, float]`` per window (the W&B exporter adds ``sidecar/``).

Keys: ``trainer/<role>/<worker>/<name>/<stat>`` for the trainer's series (timings in ms, as the
trainer sent them; counter rates per second), ``self/...`` for the daemon's own accounting,
``pipeline/...`` for the insight (``insight_row``), ``ledger/...`` for the run ledger
(``ledger_row``), ``ends/...`` for the senders' ends (``ends_row``), ``gpu/...``, ``group/...``, ``nvml/...`` for
the GPUs (``gpu_rows``). Only series with data in the window appear, so a row never repeats
stale values. ``window_row`` is the whole row of one window. ``keys.KEY_SCHEME`` lists every
key (docs/METRICS.md's table is generated from it).
"""

from __future__ import annotations

import math
import time

from sidecar.exporters.wandb.ends_row import ends_row
from sidecar.exporters.wandb.gpu_rows import gpu_wandb_row
from sidecar.exporters.wandb.insight_row import insight_row
from sidecar.exporters.wandb.ledger_row import ledger_row
from sidecar.model.window import CATEGORY, COUNT, GAUGE, SCALAR, TIMING, IngestReport

TIMING_STATS = ("mean", "p50", "p95", "max")
"""A timing's window statistics, each logged as ``<stat>_ms``."""
GAUGE_STATS = ("mean", "min", "max")
"""A gauge's (or scalar's) window statistics beside its last value."""
ALLOCATOR_VALUES = ("allocated_bytes", "reserved_bytes", "max_reserved_bytes")
"""The CUDA caching allocator's counters, per device, in sample order."""


def window_row(report: IngestReport, host: str) -> dict[str, float]:
    """Every value of one window, keys under ``<host>/`` (in a run shared by several nodes each
    node's sidecar writes its own keys)."""
    row: dict[str, float] = {}
    for part in (trainer_row(report), accounting_row(report),
                 insight_row(report.insight) if report.insight is not None else {},
                 gpu_wandb_row(report.gpu, time.monotonic()) if report.gpu is not None else {},
                 ledger_row(report.run_ledger) if report.run_ledger is not None else {},
                 ends_row(report.ends)):
        row.update((f"{host}/{key}", value) for key, value in part.items())
    return row


def trainer_row(report: IngestReport) -> dict[str, float]:
    """The trainer series of one window."""
    row: dict[str, float] = {}
    for view in report.window.window_series():
        window = view.window
        assert window is not None
        prefix = f"trainer/{view.role}/{view.worker}/{view.name}"
        if view.kind == TIMING:
            for stat in TIMING_STATS:
                row[f"{prefix}/{stat}_ms"] = window[stat]
            row[f"{prefix}/count"] = window["count"]
        elif view.kind == COUNT:
            row[f"{prefix}/rate"] = window["rate"]
            row[f"{prefix}/total"] = window["total"]
        elif view.kind in (GAUGE, SCALAR):
            row[prefix] = window["last"]
            for stat in GAUGE_STATS:
                row[f"{prefix}/{stat}"] = window[stat]
        elif view.kind == CATEGORY:
            row[f"{prefix}/entropy_bits"] = window["entropy_bits"]
    for (role, worker, device), values in report.window.allocator.items():
        prefix = f"trainer/{role}/{worker}/cuda{device}"
        for key, value in zip(ALLOCATOR_VALUES, values, strict=True):
            row[f"{prefix}/{key}"] = value
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and math.isfinite(v)}


def accounting_row(report: IngestReport) -> dict[str, float]:
    """The daemon's ingest accounting (cumulative counts and this window's rate)."""
    row: dict[str, float] = {
        "self/records_per_s": report.records_accepted_in_window / report.window.duration_s
        if report.window.duration_s > 0 else 0.0,
        "self/senders": float(len(report.live_senders)),
        "self/series": float(report.series),
    }
    dropped: dict[str, int] = {}
    for totals in report.totals.values():
        for reason, n in totals.dropped.items():
            dropped[reason] = dropped.get(reason, 0) + n
    row["self/records_accepted"] = float(sum(t.accepted for t in report.totals.values()))
    for reason, n in sorted(dropped.items()):
        row[f"self/records_dropped/{reason}"] = float(n)
    for reason, n in sorted(report.messages_dropped.items()):
        row[f"self/messages_dropped/{reason}"] = float(n)
    return row
