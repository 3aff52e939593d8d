"""The window: what the ingest thread hands every exporter once per window, immutable.

``WindowReport`` holds the aggregates (one ``SeriesView`` per series); ``IngestReport`` adds the
accounting (senders, totals per role/worker, drops by reason, receiver counters) and, once the
daemon has computed them, the window's pipeline insight and GPU view. Record kinds are
``trainer_shim.wire.RecordKind`` values as plain ints (SCALAR for GPU scalars).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sidecar.model.ends import EndsView
from sidecar.model.gpu import GpuView
from sidecar.model.insight import PipelineInsight
from sidecar.model.ledger import RunLedgerView
from sidecar.model.liveness import LIVE_S
from sidecar.model.timeline import RunTimeline
from trainer_shim.wire import RecordKind

TIMING, COUNT, GAUGE, CATEGORY, SCALAR, PROFILE, ALLOCATOR = (
    int(RecordKind.TIMING), int(RecordKind.COUNT), int(RecordKind.GAUGE), int(RecordKind.CATEGORY),
    int(RecordKind.SCALAR), int(RecordKind.PROFILE), int(RecordKind.ALLOCATOR),
)
KIND_NAMES = {TIMING: "timing", COUNT: "counter", GAUGE: "gauge", CATEGORY: "category", SCALAR: "scalar"}
"""A series' kind as a word (logs, ``explain``)."""



def is_live(last_seen_age_s: float, closed: bool, window_s: float) -> bool:
    """Whether a sender whose last message is ``last_seen_age_s`` old at the end of a window of
    ``window_s`` seconds is live in it: heard within ``LIVE_S``, or, once it closed (its last
    message says so), only while that message lies inside the window."""
    return last_seen_age_s < window_s if closed else last_seen_age_s <= LIVE_S


@dataclass(frozen=True, slots=True)
class SeriesView:
    """One series at the end of a window. ``kind`` is a ``RecordKind`` value (SCALAR for GPU
    scalars); ``name`` is the sanitized token; ``window`` is None when the series had no data in
    this window; ``cumulative`` holds what survives windows (timing count/sum_s, counter total,
    gauge last, category totals). ``role``/``worker`` are the mapped ones (a role in the key
    overrides the channel's); ``meaning`` is what the mapping stage made of the name (``""``:
    unmapped), ``rule`` what decided it, ``raw`` the name it is kept under (as sent, less a
    role/worker prefix); ``snapshot`` is True for a series fed by profile dicts (``publish()``:
    per-batch means once per interval), False for every-occurrence records. ``certainty``,
    ``sibling``, ``outside`` and ``stem``: what a meaning read from the name left open, and a
    timing's words (``sidecar.model.mapped.Mapped``)."""

    kind: int
    name: str
    role: str
    worker: str
    window: dict[str, Any] | None
    cumulative: dict[str, Any]
    meaning: str = ""
    snapshot: bool = False
    raw: str = ""
    rule: str = ""
    certainty: float = 1.0
    sibling: str = ""
    outside: bool = False
    stem: str = ""
    counted_in: str = ""
    """Set by the window's settling of a phase and its parts (``sidecar.aggregation.parts``): the
    series whose time holds this one's (a phase's parts, or the phase its part is inside), so the
    insight never counts it again."""


@dataclass(frozen=True, slots=True)
class WindowReport:
    """Everything aggregated in one window. ``steps``: per (role, worker), the step of its live
    run (the highest latest step among that label's live senders; a dead sender's step is gone).
    ``step_range``: (lowest, highest) of those steps, None if no live sender published one.
    ``allocator``: (role, worker, device) -> (allocated, reserved, max_reserved) bytes."""

    end_unix_s: float
    duration_s: float
    series: tuple[SeriesView, ...]
    steps: dict[tuple[str, str], int] = field(default_factory=dict)
    allocator: dict[tuple[str, str, int], tuple[int, int, int]] = field(default_factory=dict)
    sender_steps: dict[int, int] = field(default_factory=dict)
    """Sender id -> the latest step it published (the run ledger tells each sender's first step)."""
    sender_first_steps: dict[int, int] = field(default_factory=dict)
    """Sender id -> the first step it published that the daemon had (the run ledger counts a
    sender's first stepping window from it)."""
    sender_step_counts: dict[int, int] = field(default_factory=dict)
    """Sender id -> its steps so far, counted as its step value changed, for a sender whose step
    counts samples or tokens rather than steps (``sidecar.aggregation.step_axis``): the run ledger
    reads these in place of its step numbers."""
    steps_moved: dict[tuple[str, str], int] = field(default_factory=dict)
    """(role, worker) -> how far its step moved since the window before (the most of its live
    senders', counted in steps where the axis counts items; a sender the window before did not know
    is not counted): the pace of a worker that times no step (``sidecar.aggregation.insight``)."""

    def window_series(self, kind: int | None = None, name: str | None = None) -> Iterable[SeriesView]:
        """Series with data in this window, optionally of one kind and name."""
        for view in self.series:
            if view.window is not None and (kind is None or view.kind == kind) and (name is None or view.name == name):
                yield view

    @property
    def trainer_step(self) -> int | None:
        """The highest step of the live senders (the W&B x-axis), or None."""
        return max(self.steps.values()) if self.steps else None

    @property
    def step_range(self) -> tuple[int, int] | None:
        return (min(self.steps.values()), max(self.steps.values())) if self.steps else None


@dataclass(slots=True)
class LabelTotals:
    """Cumulative counts per (role, worker) that outlive individual senders (for Prometheus)."""

    accepted: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    last_seen_unix_s: float = 0.0
    last_seen: float = 0.0
    """Monotonic time of its last message (for expiry)."""

    def add_dropped(self, reason: str, n: int) -> None:
        if n > 0:
            self.dropped[reason] = self.dropped.get(reason, 0) + n


@dataclass(frozen=True, slots=True)
class SenderView:
    """A sender as exporters see it (copied at the window boundary)."""

    sender: int
    role: str
    worker: str
    pid: int | None
    hello: dict[str, Any] | None
    last_seen_age_s: float
    last_seen_unix_s: float
    """The unix time read when its last message came: where the run ledger places it."""
    records_total: int
    received: int
    accepted: int
    before_join: int
    lost_in_transit: int
    messages_lost: int
    rejected: dict[str, int]
    sender_dropped: dict[str, int]
    first_seen_age_s: float | None = None
    """Seconds since the daemon had this sender's first message (None: not told)."""
    closed: bool = False
    """Its last message said it was closing (a clean exit): it sends nothing more."""

    def live(self, window_s: float) -> bool:
        """Whether it is live in a window of ``window_s`` seconds ending now (``is_live``)."""
        return is_live(self.last_seen_age_s, self.closed, window_s)


@dataclass(frozen=True, slots=True)
class IngestReport:
    """One window's report (a listener's ``report``): the window itself (``window``: the
    aggregates) plus the accounting, all immutable copies. The ingest thread builds it without
    ``insight`` and ``gpu``; the daemon adds them (``dataclasses.replace``) before any exporter
    sees the report. ``insight`` stays None if computing it failed;
    ``gpu`` is None without GPU metrics."""

    window: WindowReport
    senders: tuple[SenderView, ...]
    totals: dict[tuple[str, str], LabelTotals]
    messages_dropped: dict[str, int]
    profile_entries_rejected: dict[tuple[str, str, str], int]
    """(role, worker, reason) -> profile entries skipped."""
    frames: int
    bytes: int
    disconnects: int
    series: int
    records_accepted_in_window: int
    insight: PipelineInsight | None = None
    gpu: GpuView | None = None
    run_ledger: RunLedgerView | None = None
    """The run ledger's totals after this window (None if it failed or is off)."""
    timelines: Mapping[str, RunTimeline] = field(default_factory=dict)
    """The timelines of the runs this window touched, after it (``model.timeline``; empty if off or failed)."""
    ends: EndsView = field(default_factory=EndsView)
    """How senders' processes ended: counts, the last per role, the ones told in this window."""

    @property
    def live_senders(self) -> tuple[SenderView, ...]:
        """The senders live in this window (``is_live``: heard from within ``LIVE_S`` of its end,
        a closed one only in the window it closed in); ``senders`` also holds the others until
        they are forgotten."""
        duration = self.window.duration_s
        return tuple(s for s in self.senders if s.live(duration))


@dataclass(frozen=True, slots=True)
class IngestHealth:
    """The ingest thread's own health, read at scrape time."""

    internal_errors: int
    """Bugs survived (each counted, the frame dropped)."""
    data_age_s: float | None
    """Seconds since the newest trainer data was accepted; None before any."""


@dataclass(frozen=True, slots=True)
class DaemonTelemetry:
    """The daemon's own figures at one moment (``sidecar.core.scrape_state``)."""

    cpu_seconds: float
    """User + system CPU time of the process (seconds)."""
    rss_bytes: int
    threads: int
    open_fds: int
    ingest: IngestHealth | None
    """None until ingest runs."""
