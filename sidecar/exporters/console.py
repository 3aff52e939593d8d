"""Console exporter: one concise log line per window (to stderr, i.e. journald under systemd)."""

from __future__ import annotations

import logging

from sidecar.exporters.base import Exporter
from sidecar.model.insight import PipelineInsight
from sidecar.model.window import IngestReport

log = logging.getLogger("sidecar")


class ConsoleExporter(Exporter):
    """Logs ``window <s> | senders | records/s | dropped | step | verdict ... | rates | queue``
    each window."""

    name = "console"

    def __init__(self, logger: logging.Logger = log) -> None:
        self.log = logger
        self._dropped_before = 0

    def line(self, report: IngestReport) -> str:
        """The line for ``report`` (also used by tests and ``top``)."""
        dropped = sum(sum(t.dropped.values()) for t in report.totals.values()) + sum(report.messages_dropped.values())
        new_drops, self._dropped_before = dropped - self._dropped_before, dropped
        window = report.window
        rate = report.records_accepted_in_window / window.duration_s if window.duration_s > 0 else 0.0
        parts = [f"window {window.duration_s:.1f}s", f"{len(report.live_senders)} senders",
                 f"{rate:,.0f} rec/s", f"{new_drops} dropped"]
        steps = window.step_range
        if steps is not None:
            parts.append(f"step {steps[0]}" if steps[0] == steps[1] else f"steps {steps[0]}-{steps[1]}")
        if report.insight is not None:
            parts.append(format_insight(report.insight))
        return " | ".join(parts)

    def consume(self, window: IngestReport) -> None:
        self.log.info("%s", self.line(window))


def format_insight(insight: PipelineInsight) -> str:
    """``verdict drafter-bound (target.queue_put_wait=0.64 queue_fill=0.97) | drafter 82.0 b/s ...``:
    the verdict with its evidence, then the headline numbers."""
    parts = [f"verdict {insight.verdict.text()}"]
    rates = [f"{r.role} {r.batches_per_s:.1f} b/s" for r in insight.roles.values() if r.batches_per_s > 0]
    if rates:
        parts.append(", ".join(rates))
    queue = [f"{label} {value:.2f}" for label, value in (("queue fill", insight.queue_fill),
                                                          ("ready deficit", insight.ready_deficit))
             if value is not None]
    if queue:
        parts.append(", ".join(queue))
    return " | ".join(parts)
