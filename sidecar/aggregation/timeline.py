"""The run timeline: the run ledger's windows kept over time, per run, bounded (``model.timeline``).

Pure (no I/O, no clock; the ingest thread owns it). ``window_points`` reads one window, after the
run ledger folded it, into one point per run the window touched; ``RunTimelineBook`` keeps one
run's points as JSON-able state (``state()`` / ``RunTimelineBook(run, state)``), which
``sidecar.core.timeline_state`` saves beside the ledger.

**The bound** (docs/METRICS.md, "Run timeline"): the last ``RECENT_POINTS`` windows are kept as
they were; older ones are merged into buckets of ``bucket_s`` seconds (first ``FIRST_BUCKET_S``,
aligned on multiples of it in Unix time), and whenever more than ``MAX_BUCKETS`` buckets are
kept the width doubles and neighbours merge. A run of any length keeps at most ``RECENT_POINTS +
MAX_BUCKETS`` points, each with at most ``MAX_ROLES`` roles and ``MAX_GPU_SERIES`` GPU series,
and at most ``MAX_EVENTS`` markers (the oldest forgotten first, counted). A merged point keeps
the seconds of each verdict exactly and each series' mean over the seconds that had it, so the
verdict seconds over the timeline equal the ledger's whatever was merged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sidecar.aggregation.ledger.facts import SenderFact, WindowFacts, sender_key, started_of
from sidecar.aggregation.ledger.fold import RunLedger
from sidecar.aggregation.ledger.record import RoleRecord
from sidecar.aggregation.verdict import MIN_WINDOW_S
from sidecar.model.meanings import BUSY_PHASES, WAIT_PHASES
from sidecar.model.timeline import TIMELINE_VERSION, RunTimeline, TimelineEvent
from sidecar.model.window import IngestReport, SenderView

RECENT_POINTS = 360
"""Windows kept as they were (an hour at the default 10 s window)."""
MAX_BUCKETS = 1024
"""Merged buckets kept before the recent windows; past it their width doubles."""
FIRST_BUCKET_S = 60.0
"""The first width of a merged bucket, seconds."""
MAX_ROLES = 8
"""Roles a point keeps series for (the first by name)."""
MAX_GPU_SERIES = 16
"""GPU series a point keeps: one per GPU up to this many GPUs, else one per GPU group (its mean busy
share and total power), else one for the whole box."""
MAX_EVENTS = 512
"""Markers kept per run; beyond, the oldest are forgotten (counted)."""
MAX_SEEN = 256
"""Sender processes remembered per run (to mark each one's start once and count its drops)."""
STEP_PHASES: tuple[str, ...] = (*BUSY_PHASES, *WAIT_PHASES, "host", "unattributed")
"""The phases a role's step time is kept by: its mapped phases (``model.meanings``), ``host``
(the gap no timing covers, where the insight measured it as host time) and ``unattributed``
(timings that map to no meaning, and an unmeasured gap)."""
DIGITS = 4
"""Significant digits a series mean is kept with."""


def _round(x: float) -> float:
    return float(f"{x:.{DIGITS}g}")


def gpu_means(report: IngestReport) -> dict[str, float]:
    """``busy|<gpu>`` and ``power|<gpu>`` of the window (``MAX_GPU_SERIES``); empty without readings."""
    view = report.gpu
    snap = view.snapshot if view is not None else None
    if view is None or snap is None:
        return {}
    busy_of = view.facts.busy if view.facts is not None else {}
    up = [g for g in snap.gpus if g.up]
    out: dict[str, float] = {}
    if len(up) <= MAX_GPU_SERIES:
        for g in up:
            busy = busy_of.get(str(g.index), g.utilization_ratio)
            if busy is not None and math.isfinite(busy):
                out[f"busy|gpu{g.index}"] = _round(busy)
            if g.power_watts is not None and math.isfinite(g.power_watts):
                out[f"power|gpu{g.index}"] = _round(g.power_watts)
        return out
    groups = view.groups if 0 < len(view.groups) <= MAX_GPU_SERIES else ()
    for group in groups:
        if group.utilization_mean_ratio is not None:
            out[f"busy|{group.name}"] = _round(group.utilization_mean_ratio)
        if group.power_total_watts is not None:
            out[f"power|{group.name}"] = _round(group.power_total_watts)
    if not groups:
        shares = [b for g in up if (b := busy_of.get(str(g.index), g.utilization_ratio)) is not None]
        watts = [g.power_watts for g in up if g.power_watts is not None]
        if shares:
            out["busy|all"] = _round(sum(shares) / len(shares))
        if watts:
            out["power|all"] = _round(sum(watts))
    return out


def role_means(report: IngestReport, role: str) -> dict[str, float]:
    """``rate|<role>`` and ``step|<role>|<phase>`` of the window: its step rate and each phase's
    seconds per step per worker (its time share times the seconds per step; ``STEP_PHASES``)."""
    insight = report.insight
    ri = insight.roles.get(role) if insight is not None else None
    if ri is None:
        return {}
    out = {f"rate|{role}": _round(ri.batches_per_s)}
    if ri.batches_per_s <= 0 or ri.workers <= 0:
        return out
    per_step = ri.workers / ri.batches_per_s
    steps: dict[str, float] = {}
    for phase, share in ri.time_share.items():
        if phase == "other":  # the gap no timing covers: host time only where the insight measured it so
            phase = "host" if ri.host_measured else "unattributed"
        phase = phase if phase in STEP_PHASES else "unattributed"
        steps[phase] = steps.get(phase, 0.0) + max(0.0, share) * per_step
    out.update({f"step|{role}|{c}": _round(s) for c, s in steps.items() if s > 0})
    return out


def drops_of(s: SenderView) -> int:
    """Records of one sender dropped or lost so far: dropped in the shim, lost in transit, rejected."""
    return s.lost_in_transit + sum(s.sender_dropped.values()) + sum(s.rejected.values())


def runs_of_senders(runs: Mapping[str, Mapping[str, RoleRecord]],
                    facts: Iterable[SenderFact]) -> dict[str, list[SenderFact]]:
    """Run -> the window's senders in it, as the run ledger placed them (its runs' and roles'
    ``senders``: a process's channels share its key, one per role)."""
    wanted: dict[tuple[str, str], list[SenderFact]] = {}
    for s in facts:
        wanted.setdefault((s.key, s.role), []).append(s)
    out: dict[str, list[SenderFact]] = {}
    for run, members in runs.items():
        for role, r in members.items():
            for key in r.senders:
                if (key, role) in wanted:
                    out.setdefault(run, []).extend(wanted.pop((key, role)))
    return out


def window_point(report: IngestReport, roles: Iterable[str], verdict_s: Mapping[str, float], seconds: float,
                 drops: int) -> dict[str, Any]:
    """One run's point of one window (``model.timeline``): ``verdict_s`` the verdict seconds the
    ledger folded into the run this window, ``seconds`` the run's part of the window."""
    w = report.window
    means: dict[str, float] = {}
    insight = report.insight
    if insight is not None and insight.verdict.name not in ("unknown", "idle") and verdict_s:
        means["conf"] = _round(insight.verdict.confidence)
    if insight is not None and insight.queue_fill is not None:
        means["queue"] = _round(insight.queue_fill)
    if w.duration_s >= MIN_WINDOW_S:  # the flush at shutdown: too short for its rates to mean anything
        for role in sorted(roles)[:MAX_ROLES]:
            means.update(role_means(report, role))
    means.update(gpu_means(report))
    means = {k: v for k, v in means.items() if math.isfinite(v)}  # the state files hold numbers only
    point: dict[str, Any] = {"t0": round(w.end_unix_s - w.duration_s, 3), "t1": round(w.end_unix_s, 3),
                             "s": round(seconds, 3), "n": 1,
                             "v": {k: round(v, 3) for k, v in verdict_s.items() if v > 0}, "m": means}
    if drops:
        point["c"] = {"drops": drops}
    return point


def merge(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """One point of two (``a`` before ``b``): verdict seconds and counts added, each series' mean
    weighted by the seconds that had it. Neither is changed."""
    s = round(a["s"] + b["s"], 3)
    verdicts = dict(a.get("v", {}))
    for k, v in b.get("v", {}).items():
        verdicts[k] = round(verdicts.get(k, 0.0) + v, 3)
    counts = dict(a.get("c", {}))
    for k, v in b.get("c", {}).items():
        counts[k] = counts.get(k, 0) + v
    means: dict[str, float] = {}
    weights: dict[str, float] = {}
    ma, mb, wa, wb = a.get("m", {}), b.get("m", {}), a.get("w", {}), b.get("w", {})
    for key in dict.fromkeys([*ma, *mb]):
        xa, xb = wa.get(key, a["s"]) if key in ma else 0.0, wb.get(key, b["s"]) if key in mb else 0.0
        total = xa + xb
        means[key] = _round((ma.get(key, 0.0) * xa + mb.get(key, 0.0) * xb) / total) if total > 0 else \
            _round((ma.get(key, mb.get(key, 0.0))))
        if total < s - 1e-6:
            weights[key] = _round(total)
    out: dict[str, Any] = {"t0": min(a["t0"], b["t0"]), "t1": max(a["t1"], b["t1"]), "s": s, "n": a["n"] + b["n"],
                           "v": verdicts, "m": means}
    if weights:
        out["w"] = weights
    if counts:
        out["c"] = counts
    return out


class RunTimelineBook:
    """One run's timeline as JSON-able state (``state()``), a point at a time (``add``)."""

    def __init__(self, run: str, state: Mapping[str, Any] | None = None) -> None:
        """``state``: what ``state()`` returned before (read back by ``sidecar.core.timeline_state``,
        which checked its version and shape)."""
        s = dict(state or {})
        self.run = run
        self.recent: list[dict[str, Any]] = list(s.get("recent", []))
        self.older: list[dict[str, Any]] = list(s.get("older", []))
        self.bucket_s: float = float(s.get("bucket_s", FIRST_BUCKET_S))
        self.events: list[list[Any]] = list(s.get("events", []))
        self.events_dropped: int = int(s.get("events_dropped", 0))
        self.windows: int = int(s.get("windows", 0))
        self.window_s: float = float(s.get("window_s", 0.0))
        self.seen: dict[str, int] = dict(s.get("seen", {}))
        """``<sender key>|<role>|<worker>`` (a channel of a process) -> its drops so far (``drops_of``)."""

    def state(self) -> dict[str, Any]:
        return {"version": TIMELINE_VERSION, "run": self.run, "recent": self.recent, "older": self.older,
                "bucket_s": self.bucket_s, "events": self.events, "events_dropped": self.events_dropped,
                "windows": self.windows, "window_s": self.window_s, "seen": self.seen}

    def add(self, point: dict[str, Any]) -> None:
        """Fold one window's point in (the oldest recent window merged into the buckets past
        ``RECENT_POINTS``; the buckets' width doubled past ``MAX_BUCKETS``)."""
        self.windows += 1
        if point["t1"] - point["t0"] >= MIN_WINDOW_S or not self.window_s:  # not the shutdown flush's
            self.window_s = float(point["t1"] - point["t0"])
        self.recent.append(point)
        while len(self.recent) > RECENT_POINTS:
            self._to_bucket(self.recent.pop(0))
        while len(self.older) > MAX_BUCKETS:
            self.bucket_s *= 2
            merged: list[dict[str, Any]] = []
            for p in self.older:
                if merged and self._slot(merged[-1]) == self._slot(p):
                    merged[-1] = merge(merged[-1], p)
                else:
                    merged.append(p)
            self.older = merged

    def _slot(self, point: Mapping[str, Any]) -> int:
        return math.floor(point["t0"] / self.bucket_s)

    def _to_bucket(self, point: dict[str, Any]) -> None:
        if self.older and self._slot(self.older[-1]) == self._slot(point):
            self.older[-1] = merge(self.older[-1], point)
        else:
            self.older.append(point)

    def mark(self, unix_s: float, kind: str, role: str = "", detail: str = "") -> None:
        """Add a marker (``model.timeline.EVENT_KINDS``); past ``MAX_EVENTS`` the oldest is forgotten."""
        self.events.append([unix_s, kind, role, detail])
        if len(self.events) > MAX_EVENTS:
            del self.events[0]
            self.events_dropped += 1

    def senders(self, senders: Iterable[SenderView], end_unix_s: float) -> int:
        """Note the run's ``senders`` in a window ending at ``end_unix_s``: a process new to a role
        is marked as a start; returns their drops since the last window (``drops_of``)."""
        known = {k.rsplit("|", 1)[0] for k in self.seen}
        total = 0
        for s in senders:
            process = f"{sender_key(s, end_unix_s)}|{s.role}"
            if process not in known:
                known.add(process)
                self.mark(started_of(s, end_unix_s) or end_unix_s, "start", s.role)
            key = f"{process}|{s.worker}"
            now = drops_of(s)
            total += max(0, now - self.seen.get(key, 0))
            self.seen.pop(key, None)
            self.seen[key] = now  # most recent last
        while len(self.seen) > MAX_SEEN:
            del self.seen[next(iter(self.seen))]
        return total

    def view(self) -> RunTimeline:
        """The timeline as readers read it (points shared, never changed once made)."""
        return RunTimeline(self.run, (*self.older, *self.recent),
                           tuple(TimelineEvent(float(t), str(k), str(r), str(d)) for t, k, r, d in self.events),
                           self.window_s, self.bucket_s if self.older else 0.0, self.windows, self.events_dropped)


LedgerMark = tuple[dict[str, dict[str, float]], dict[str, float]]
"""What the timeline reads of the ledger before a window: run -> verdict -> seconds, and run ->
where its roles were accounted up to (Unix seconds)."""


def ledger_mark(ledger: RunLedger) -> LedgerMark:
    """The ledger's verdict seconds and accounted-up-to times, taken before it folds a window."""
    verdicts = {run: {name: e.seconds for name, e in by.items()} for run, by in ledger.verdicts.items()}
    until = {run: max(r.until for r in members.values())
             for run, members in ledger.runs.items() if members}
    return verdicts, until


def observe(ledger: RunLedger, before: LedgerMark, facts: WindowFacts, report: IngestReport,
            book_of: Callable[[str], RunTimelineBook]) -> set[str]:
    """Fold one window, which ``ledger`` has just folded (``before``: its ``ledger_mark`` from
    before), into the timelines of the runs it touched (``book_of``: a run's book); returns the
    runs whose book changed. A run is touched when its senders sent in the window or one is alive;
    its point's verdict seconds are what the ledger added to the run's."""
    verdicts_before, until_before = before
    end, begin = facts.end_unix_s, facts.end_unix_s - facts.duration_s
    changed: set[str] = set()
    for run, senders in runs_of_senders(ledger.runs, facts.senders).items():
        members = ledger.runs[run]
        until = max(r.until for r in members.values())
        if until <= until_before.get(run, -1.0) and not any(r.sending for r in members.values()):
            continue
        was = verdicts_before.get(run, {})
        delta = {name: e.seconds - was.get(name, 0.0) for name, e in ledger.verdicts.get(run, {}).items()}
        delta = {k: v for k, v in delta.items() if v > 1e-9}
        first = min(s.begin for s in senders)
        seconds = sum(delta.values()) or max(0.0, end - max(begin, first))
        book = book_of(run)
        keys = {(s.key, s.role) for s in senders}
        drops = book.senders((v for v in report.senders if (sender_key(v, end), v.role) in keys), end)
        book.add(window_point(report, {s.role for s in senders}, delta, seconds, drops))
        changed.add(run)
    for e in report.ends.new:
        having = [(m[e.role].until, run) for run, m in ledger.runs.items() if e.role in m]
        if having:
            run = max(having)[1]
            book_of(run).mark(e.unix_s, "end", e.role, e.how)
            changed.add(run)
    return changed
