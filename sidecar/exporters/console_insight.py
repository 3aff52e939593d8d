"""The pipeline insight's part of the console line: the verdict with its evidence, then the
headline numbers (``ConsoleExporter.hooks`` entry)."""

from __future__ import annotations

from sidecar.aggregation.insight import EXTRAS_KEY, PipelineInsight
from sidecar.model.window import IngestReport


def insight_part(report: IngestReport) -> str | None:
    """``verdict drafter-bound (target.queue_put_wait=0.64 queue_fill=0.97) | drafter 82.0 b/s ...``,
    or None when the daemon attached no insight to ``report``."""
    insight = report.extras.get(EXTRAS_KEY)
    if not isinstance(insight, PipelineInsight):
        return None
    return format_insight(insight)


def format_insight(insight: PipelineInsight) -> str:
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
