"""Synthetic window reports for the pipeline-insight tests: series built directly, no sockets."""

from __future__ import annotations

from sidecar.aggregation.series import entropy_bits
from sidecar.model.window import CATEGORY, COUNT, GAUGE, TIMING, IngestReport, SenderView, SeriesView, WindowReport


def timing(role: str, worker: str, name: str, ms_per_batch: float, batches: int) -> SeriesView:
    total = ms_per_batch * batches
    window = {"count": float(batches), "sum": total, "mean": ms_per_batch, "p50": ms_per_batch,
              "p95": ms_per_batch, "max": ms_per_batch, "exact": 1.0}
    return SeriesView(TIMING, name, role, worker, window, {"count": batches, "sum_s": total / 1000}, name)


def counter(role: str, worker: str, name: str, delta: float, duration_s: float = 1.0) -> SeriesView:
    return SeriesView(COUNT, name, role, worker, {"delta": delta, "rate": delta / duration_s, "total": delta},
                      {"total": delta}, name)


def gauge(role: str, worker: str, name: str, mean: float, count: int = 10, stale: bool = False) -> SeriesView:
    window = None if stale else {"last": mean, "mean": mean, "min": mean, "max": mean, "count": float(count)}
    return SeriesView(GAUGE, name, role, worker, window, {"last": mean}, name)


def category(role: str, worker: str, name: str, counts: dict[str, int]) -> SeriesView:
    n = sum(counts.values())
    window = {"count": float(n), "entropy_bits": entropy_bits(counts.values()),
              "distribution": {k: c / n for k, c in counts.items()}}
    return SeriesView(CATEGORY, name, role, worker, window, {"totals": dict(counts)}, name)


END_UNIX_S = 1_700_000_000.0
"""Where ``report``'s window ends (unix seconds)."""


def sender(role: str, worker: str, last_seen_age_s: float = 0.0, first_seen_age_s: float | None = None,
           sender_id: int = 1, end_unix_s: float = END_UNIX_S) -> SenderView:
    """A sender as the window's accounting shows it: heard ``last_seen_age_s`` before the end of a
    window ending at ``end_unix_s`` (so received then on the unix clock), first heard
    ``first_seen_age_s`` before it (None: long ago)."""
    return SenderView(sender_id, role, worker, 1000 + sender_id, {}, last_seen_age_s, end_unix_s - last_seen_age_s,
                      0, 0, 0, 0, 0, 0, {}, {}, first_seen_age_s)


def report(series: list[SeriesView], duration_s: float = 1.0, senders: tuple[SenderView, ...] | None = None
           ) -> IngestReport:
    """A window of ``series``; ``senders`` default: one live sender per (role, worker) of the series
    that was alive the whole window."""
    window = WindowReport(END_UNIX_S, duration_s, tuple(series))
    if senders is None:
        labels = sorted({(v.role, v.worker) for v in series})
        senders = tuple(sender(r, w, sender_id=i + 1) for i, (r, w) in enumerate(labels))
    return IngestReport(window, senders, {}, {}, {}, 0, 0, 0, len(series), 0)


def worker(role: str, name: str, phases: dict[str, float], batches: int, tokens_per_batch: int = 4096,
           duration_s: float = 1.0) -> list[SeriesView]:
    """One worker: ``phases`` in ms per batch, ``batches`` in the window."""
    out = [timing(role, name, phase, ms, batches) for phase, ms in phases.items()]
    out.append(counter(role, name, "batches", batches, duration_s))
    out.append(counter(role, name, "tokens", batches * tokens_per_batch, duration_s))
    return out


def pipeline(target: dict[str, float], drafter: dict[str, float], *, targets: int = 3, drafters: int = 2,
             queue_fill: float | None = None, drafter_override: dict[str, dict[str, float]] | None = None,
             duration_s: float = 1.0, roles: tuple[str, str] = ("target", "drafter")) -> IngestReport:
    """A DFlash window: every worker of a role runs ``phases`` (ms per batch) back to back for
    the whole window (so shares are ms per batch / cycle); ``drafter_override`` gives some
    drafters (by worker name) other phases."""
    series: list[SeriesView] = []
    for role, phases, n in ((roles[0], target, targets), (roles[1], drafter, drafters)):
        for i in range(n):
            own = (drafter_override or {}).get(str(i), phases) if role == roles[1] else phases
            cycle = sum(own.values()) or 1.0
            batches = max(1, round(duration_s * 1000 / cycle))
            scale = duration_s * 1000 / (cycle * batches)
            series += worker(role, str(i), {p: ms * scale for p, ms in own.items()}, batches, duration_s=duration_s)
            if role == roles[0] and queue_fill is not None:
                series.append(gauge(role, str(i), "queue_depth", 8 * queue_fill))
                series.append(gauge(role, str(i), "queue_capacity", 8, stale=True))
    return report(series, duration_s)
