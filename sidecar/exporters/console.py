"""Console exporter: one concise log line per window (to stderr, i.e. journald under systemd)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sidecar.model.window import IngestReport

log = logging.getLogger("sidecar")

LineHook = Callable[[IngestReport], str | None]


class ConsoleExporter:
    """Logs ``window <s> | senders | records/s | dropped | step | <hook parts>`` each window."""

    def __init__(self, logger: logging.Logger = log) -> None:
        self.log = logger
        self.hooks: list[LineHook] = []
        self._dropped_before = 0

    def line(self, report: IngestReport) -> str:
        """The line for ``report`` (also used by tests and ``top``)."""
        dropped = sum(sum(t.dropped.values()) for t in report.totals.values()) + sum(report.messages_dropped.values())
        new_drops, self._dropped_before = dropped - self._dropped_before, dropped
        window = report.window
        rate = report.records_accepted_in_window / window.duration_s if window.duration_s > 0 else 0.0
        parts = [f"window {window.duration_s:.1f}s", f"{len(report.senders)} senders",
                 f"{rate:,.0f} rec/s", f"{new_drops} dropped"]
        if window.trainer_step is not None:
            parts.append(f"step {window.trainer_step}")
        for hook in self.hooks:
            text = hook(report)
            if text:
                parts.append(text)
        return " | ".join(parts)

    def export(self, report: IngestReport) -> None:
        self.log.info("%s", self.line(report))
