"""Console exporter: one concise log line per window (to stderr, i.e. journald under systemd)."""

from __future__ import annotations

import logging

from sidecar.exporters.base import Exporter
from sidecar.model.insight import PipelineInsight
from sidecar.model.ledger import RunLedgerView
from sidecar.model.window import IngestReport

log = logging.getLogger("sidecar")

MIN_RATE_WINDOW_S = 1.0
"""A window shorter than this (seconds) and than half the window before it (the last one of a
daemon stopped just after a boundary) shows counts, not rates: 20 records in 0.01 s read as
2,000 rec/s, and the roles' batch rates as thirty times the run's. A daemon run at a sub-second
``--interval`` keeps its rates."""
EXPLAIN_HINT = "why: run `dflash-sidecar explain` for what each verdict lacks and the mapping line that supplies it"


class ConsoleExporter(Exporter):
    """Logs ``window <s> | senders | records/s | dropped | step | verdict ... | rates | queue``
    each window (a partial window under ``MIN_RATE_WINDOW_S``: its records, no rate). While the verdict
    is ``unknown`` the line says why (the verdict's detail); the first such line of a stretch of
    ``unknown`` windows also names ``dflash-sidecar explain``."""

    name = "console"

    def __init__(self, logger: logging.Logger = log) -> None:
        self.log = logger
        self._dropped_before = 0
        self._hinted = False
        self._last_s: float | None = None
        """The previous window's length (s): a window as long as half of it is no partial one."""

    def line(self, report: IngestReport) -> str:
        """The line for ``report`` (also used by tests and ``top``)."""
        dropped = sum(sum(t.dropped.values()) for t in report.totals.values()) + sum(report.messages_dropped.values())
        new_drops, self._dropped_before = dropped - self._dropped_before, dropped
        window = report.window
        last, self._last_s = self._last_s, window.duration_s
        rated = window.duration_s >= MIN_RATE_WINDOW_S or (last is not None and window.duration_s >= 0.5 * last)
        accepted = report.records_accepted_in_window
        volume = (f"{accepted / window.duration_s:,.0f} rec/s" if rated
                  else f"{accepted:,} records (too short for rates)")
        parts = [f"window {window.duration_s:.1f}s", f"{len(report.live_senders)} senders", volume,
                 f"{new_drops} dropped"]
        steps = window.step_range
        if steps is not None:
            parts.append(f"step {steps[0]}" if steps[0] == steps[1] else f"steps {steps[0]}-{steps[1]}")
        insight = report.insight
        if insight is not None:
            parts.append(format_insight(insight, rates=rated))
            if insight.verdict.name != "unknown":
                self._hinted = False
            elif not self._hinted and insight.verdict.detail != "window too short":
                self._hinted = True
                parts.append(EXPLAIN_HINT)
        if report.run_ledger is not None:
            parts.extend(format_ledger(report.run_ledger))
        return " | ".join(parts)

    def consume(self, report: IngestReport) -> None:
        self.log.info("%s", self.line(report))


def format_insight(insight: PipelineInsight, rates: bool = True) -> str:
    """``verdict drafter-bound (target.queue_put_wait=0.64 queue_fill=0.97) | drafter 82.0 b/s ...``:
    the verdict with its evidence, then the headline numbers (without the roles' batch rates with
    ``rates`` false: a window too short to rate)."""
    v = insight.verdict
    parts = [f"verdict {v.text()}" + (f" confidence {v.confidence:.2f}" if v.name not in ("unknown", "idle") else "")]
    rated = [f"{r.role} {r.batches_per_s:.1f} b/s" for r in insight.roles.values() if rates and r.batches_per_s > 0]
    if rated:
        parts.append(", ".join(rated))
    queue = [f"{label} {value:.2f}" for label, value in (("queue fill", insight.queue_fill),
                                                          ("ready deficit", insight.ready_deficit))
             if value is not None]
    if queue:
        parts.append(", ".join(queue))
    idle = [f"{group} {split['idle']:.2f} ("
            + ", ".join(f"{k} {x:.2f}" for k, x in split.items() if k != "idle" and x > 0) + ")"
            for group, split in insight.gpu_idle.items()]
    if idle:
        parts.append("gpu idle " + "; ".join(idle))
    return " | ".join(parts)


def format_ledger(view: RunLedgerView) -> list[str]:
    """``goodput trainer 62% of 3,610 s (data 21%)`` for each role of the most recent run: its
    goodput and its largest badput cause since the run began."""
    runs = view.runs
    out = []
    for r in view.run(runs[-1]) if runs else ():
        wall, good = r.wall_s, r.goodput_ratio
        if wall <= 0 or good is None:
            continue
        cause, worst = max(((c, v) for c, v in r.seconds.items() if c != "productive"), key=lambda cv: cv[1])
        worst_part = f" ({cause} {worst / wall:.0%})" if worst else ""
        out.append(f"goodput {r.role} {good:.0%} of {wall:,.0f} s{worst_part}")
    return out
