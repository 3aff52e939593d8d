"""Pipeline insight: one window's aggregates in, "why are the GPUs idle?" out.

Pure computation (no I/O, no clock, no locks): ``compute_insight(window, settings, gpus)`` turns
a ``WindowReport`` (plus, optionally, per-GPU facts from NVML) into a frozen ``PipelineInsight``
(``sidecar.model.insight``):
throughput per role and worker, hidden-state queue health, worker balance, batch composition,
the time breakdown per role and the bottleneck verdict (``sidecar.aggregation.verdict``).

It reads series by their meaning (``sidecar.model.meanings``), which the mapping stage
(``sidecar.processing.mapping``) gave each name; unmapped series are not read. A value the
trainer does not publish is ``None`` (absent from every export), never a fake zero.

Both publishing forms give time shares: every-occurrence timings (``timing()``) as the window's
sum over its duration; snapshots (``publish()`` dicts: per-batch means once per interval) as each
phase's mean over the worker's cycle (its ``step`` mean when published, else the sum of its phase
means), the last snapshot standing for up to ``SNAPSHOT_MAX_AGE_WINDOWS`` windows.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache, partial
from typing import Any

from sidecar.aggregation.cluster import node_figures
from sidecar.aggregation.series import entropy_bits
from sidecar.aggregation.settings import InsightSettings
from sidecar.aggregation.verdict import OTHER_SHARE, UNATTRIBUTED_SHARE, RoleFacts, decide
from sidecar.model.insight import GpuFacts, PipelineInsight, RoleInsight, WorkerInsight
from sidecar.model.mapped import READ
from sidecar.model.meanings import (  # noqa: F401 - re-exported
    BUSY_PHASES,
    OVERLAP_OF,
    PHASES,
    REPORTED,
    WAIT_PHASES,
    collectives,
    said_exposed,
)
from sidecar.model.window import CATEGORY, COUNT, GAUGE, TIMING, SenderView, SeriesView, WindowReport

OTHER = OTHER_SHARE
"""The gap no timing covers: host time between the timed phases (Python overhead, logging). Told
only when it is measured: every occurrence, the part of the worker's alive time outside every
timing; snapshots, the part of its ``step`` outside every timing (absent without ``step``)."""

UNATTRIBUTED = UNATTRIBUTED_SHARE
"""Time in timings that map to no meaning (a phase under a name no preset or rule knows)."""

COMPUTE_PHASES = ("forward", "backward", "forward_backward")
"""The phases of a model's own work: a worker that times none leaves it untimed."""

FORWARD_PHASES = ("forward", "forward_backward")
"""A worker's gap between timings is host time only where it times its forward (alone or with the
backward), or its backward beside a timing of no phase (``time/model_ms``: a forward under a name
not read): one that times only its backward (NeMo's ``train_backward_timing``) leaves its forward
in the gap, with the optimizer and whatever else it does not time."""

STRAGGLER_MIN_STEP_SHARE = 0.1
"""A straggler's extra busy time per batch must be at least this share of its step (0-1)."""

STRAGGLER_PEER_WAIT_SHARE = 0.5
"""Where the role times its collectives (``comm_wait``), a straggler's fastest peer must wait in
them, per batch, at least this share of the straggler's extra busy time longer than the
straggler does: a slow rank makes the others wait for it. Ranks that all wait alike are not held
up by one of them (their "busy" phases may hold collective waits of their own: DDP's backward
all-reduces)."""

SNAPSHOT_MAX_AGE_WINDOWS = 3.5
"""A snapshot series without a new snapshot in a window keeps its last mean this many windows."""

IDLE_REASONS = {"data": ("data_wait",), "queue": ("queue_wait", "queue_put_wait"), "collectives": ("comm_wait",),
                "host": (OTHER,)}
"""GPU idle attribution: each reason and the role's time shares that explain idle GPU time."""


class _Worker:
    """The series of one (role, worker) in a window, by (kind, name)."""

    __slots__ = ("views", "stale", "unmapped", "substeps", "more", "moved")

    def __init__(self) -> None:
        self.views: dict[tuple[int, str], SeriesView] = {}
        self.unmapped: dict[str, SeriesView] = {}
        """Timings that map to no meaning, by the name they are kept under (with data this window)."""
        self.stale: dict[tuple[int, str], SeriesView] = {}
        """Series without data this window (for values published once, e.g. a capacity)."""
        self.substeps: list[SeriesView] = []
        """Timings read as the step beside a longer one: parts of it (``_substeps``)."""
        self.more: dict[str, list[SeriesView]] = {}
        """Phase -> its other parts beside the series read for it (``_more_parts``)."""
        self.moved = 0
        """How far its step moved this window (``WindowReport.steps_moved``; 0: not known)."""

    def snapshot(self, name: str) -> bool:
        view = self.views.get((TIMING, name)) or self.stale.get((TIMING, name))
        return view is not None and view.snapshot

    def snapshot_mean(self, name: str, max_age_s: float, parts: bool = True) -> float | None:
        """A snapshot timing's per-batch mean (ms): this window's (with its other parts' means,
        ``parts``), else the last if recent."""
        w = self.window(TIMING, name)
        if w:
            return float(w["mean"]) + (sum(_mean(v) for v in self.more.get(name, ())) if parts else 0.0)
        view = self.stale.get((TIMING, name))
        if (view is not None and view.snapshot and 0 < max_age_s
                and view.cumulative.get("last_age_s", math.inf) <= max_age_s):
            return float(view.cumulative["last_mean"])
        return None

    def share(self, phase: str, fresh: bool) -> float | None:
        """A phase's share of the step (0-1) from a gauge in ``ratio`` mapped to it: this window's
        mean, else (``fresh`` False: the worker's snapshots are not new) the last one."""
        w = self.window(GAUGE, phase)
        if w:
            return min(1.0, max(0.0, float(w["mean"])))
        if fresh:
            return None
        last = self.gauge_last(phase)
        return None if last is None else min(1.0, max(0.0, last))

    def window(self, kind: int, name: str) -> dict[str, Any] | None:
        view = self.views.get((kind, name))
        return view.window if view is not None else None

    def counter(self, name: str, key: str = "delta") -> float:
        w = self.window(COUNT, name)
        return float(w[key]) if w else 0.0

    def timing_sum_ms(self, name: str) -> float | None:
        """A timing's window sum (ms), its other parts' (``more``) with it."""
        w = self.window(TIMING, name)
        return float(w["sum"]) + sum(float(v.window["sum"]) for v in self.more.get(name, ()) if v.window) if w else None

    def gauge_last(self, name: str) -> float | None:
        view = self.views.get((GAUGE, name)) or self.stale.get((GAUGE, name))
        value = view.cumulative.get("last") if view is not None else None
        return None if value is None or math.isnan(value) else float(value)


_ALIKE = frozenset({"comm_wait", "step", *OVERLAP_OF})
"""Timings a worker may send under several names that the insight pairs or sums (``_group``); none
of them is time of a rank's own (``_arrivals``)."""
_READ_TIMINGS = frozenset({*PHASES, "step", *OVERLAP_OF})
"""Timings whose reading from a name the verdict says (``_reads``)."""


def _group(series: Iterable[SeriesView],
           moved: Mapping[tuple[str, str], int] | None = None) -> dict[str, dict[str, _Worker]]:
    """Role -> worker -> its series this window (``moved``: how far each one's step moved)."""
    roles: dict[str, dict[str, _Worker]] = defaultdict(dict)
    stale: list[SeriesView] = []
    alike: dict[int, dict[str, list[SeriesView]]] = {}  # worker (by identity) -> its comm_wait and step series
    unmapped: list[SeriesView] = []
    for view in series:
        if not view.meaning:
            # a timing outside the step (eval, a user's phase = "none") sent as a per-step snapshot is
            # no part of the step's cycle; sent every occurrence it still took the worker's time: named
            if (view.kind == TIMING and view.window is not None and not view.counted_in
                    and not (view.outside and view.snapshot)):
                unmapped.append(view)
            continue
        if view.window is None:
            stale.append(view)
            continue
        workers = roles[view.role]
        w = workers.get(view.worker)
        if w is None:
            w = workers[view.worker] = _Worker()
        known = w.views.get((view.kind, view.meaning))
        if known is None or _preferred(view, known):
            w.views[view.kind, view.meaning] = view
        if view.kind == TIMING and view.meaning in _ALIKE:
            alike.setdefault(id(w), {}).setdefault(view.meaning, []).append(view)
    for view in stale:
        w = roles.get(view.role, {}).get(view.worker)
        if w is None and view.snapshot and view.cumulative.get("last_mean") is not None:
            w = roles[view.role].setdefault(view.worker, _Worker())
        if w is not None:
            w.stale[view.kind, view.meaning] = view
    for view in unmapped:  # only beside mapped series: a worker of unmapped names alone is not read
        w = roles.get(view.role, {}).get(view.worker)
        if w is not None:
            w.unmapped[view.raw or view.name] = view
    for workers in roles.values():
        for w in workers.values():
            named = alike.get(id(w), {})
            _substeps(w, named.get("step", []))
            _more_parts(w, named.get("comm_wait", []))
            _pair_overlaps(w, named)
    for (role, worker), steps in (moved or {}).items():
        if (w := roles.get(role, {}).get(worker)) is not None:
            w.moved = steps
    return dict(roles)


def _more_parts(w: _Worker, views: list[SeriesView]) -> None:
    """A communication wait timed under names of different collectives (``model.meanings.COLLECTIVES``,
    which run one after another, never one inside the other: an FSDP loop's ``AllGather`` and
    ``ReduceScatter``, a pipeline's sends and receives): the series read for it (``_preferred``) and each
    other one of a collective none taken already names, summed; readings fall back to the one where
    the sum does not fit in the step (``_snapshot_reading``). Any other phase under two names is
    read under one: the same wait logged twice under other words (``train/data_time`` and
    ``perf/data_time``, ``fwd`` and ``forward``) and a timer nested in another (``time/allreduce``
    inside ``time/grad_sync``) are as common as two parts, and the names cannot tell them apart."""
    chosen = w.views.get((TIMING, "comm_wait"))
    if chosen is None or len(views) < 2 or not (taken := _collectives(chosen)):
        return
    more = []
    for v in sorted(views, key=lambda v: v.raw or v.name):
        ops = _collectives(v)
        if v is not chosen and v.window and ops and not ops & taken:
            taken |= ops
            more.append(v)
    if more:
        w.more["comm_wait"] = more


def _pair_overlaps(w: _Worker, named: Mapping[str, list[SeriesView]]) -> None:
    """Of an overlap timed under several names, the one most like the wait read (``OVERLAP_OF``:
    the most words in common, then the fewest of its own), and for each other collective summed
    into the wait (``_more_parts``) the overlap most like it, summed too: torch DDP's average's
    overlap off its average's wait, never one's overlap off the other's; an FSDP loop's all-gather
    and reduce-scatter each less its own overlap."""
    for overlap, wait in OVERLAP_OF.items():
        chosen, candidates = w.views.get((TIMING, wait)), named.get(overlap, [])
        if chosen is None or len(candidates) < 2:
            continue
        taken = _most_alike(chosen, candidates)
        w.views[TIMING, overlap] = taken
        more = []
        for part in w.more.get(wait, ()):
            rest = [v for v in candidates if v is not taken and v not in more and _collectives(v) & _collectives(part)]
            if rest:
                more.append(_most_alike(part, rest))
        if more:
            w.more[overlap] = more


def _most_alike(wait: SeriesView, candidates: list[SeriesView]) -> SeriesView:
    """The candidate whose words are most like ``wait``'s: the most in common, then the fewest
    others, then the first by name."""
    words = set(_words(wait))
    return min(candidates, key=lambda v: (-len(words & set(_words(v))), len(set(_words(v)) - words), v.raw or v.name))


def _said_exposed(w: _Worker, wait: str) -> bool:
    """Whether the name of the wait read says it is what lies outside any overlap already
    (``model.meanings.said_exposed``: ``comm_exposed_us``, ``comm_time_without_overlap``)."""
    view = w.views.get((TIMING, wait)) or w.stale.get((TIMING, wait))
    return view is not None and said_exposed(_words(view))


def _words(v: SeriesView) -> list[str]:
    """A timing's words, lower case, in order (its ``stem``, else its name split at ``_``)."""
    return (v.stem or v.name).lower().split("_")


def _collectives(v: SeriesView) -> frozenset[str]:
    """The collectives (``model.meanings.COLLECTIVES``) a timing's words name."""
    return _collectives_of(v.stem or v.name)


@lru_cache(maxsize=4096)
def _collectives_of(stem: str) -> frozenset[str]:
    """``_collectives`` of a stem, kept: the insight asks it of every communication wait every
    window (``bench_roll.py --steps``: 1,000 waits, 3.6 -> 8.0 ms a window uncached)."""
    return collectives(stem.lower().split("_"))


NOT_A_PART = frozenset({"avg", "average", "mean", "ema", "smoothed", "running", "micro", "microstep"})
"""Words of a name read as the step that make it no part of the step beside a longer one: a mean of
the step lags it (``time/step_avg``), a micro-batch is one of several (``time/micro_step``)."""
SUBSTEP_RATIO = 0.9
"""Below this share of the step's mean, a shorter timing read as the step is a part of it, not the
step logged twice (``_substeps``)."""


def _mean(v: SeriesView) -> float:
    """A series' window mean (ms), 0 without data."""
    return float(v.window["mean"]) if v.window else 0.0


def _substeps(w: _Worker, candidates: list[SeriesView]) -> None:
    """Where a worker times no forward or backward and sends several timings read as the step for
    sure (a GAN's ``Time/D_step`` and ``Time/G_step`` beside ``Time/iter``, an actor's and a
    critic's updates beside the loop's), the longest is the step and each one under
    ``SUBSTEP_RATIO`` of it is a part of it (its compute, of no phase: named, as an unmapped timing
    is); else the insight reads one of them (``_preferred``)."""
    steps = [v for v in candidates if v.certainty >= 1.0 and v.window and READ in v.rule
             and not set(_words(v)) & NOT_A_PART]
    if len(steps) < 2 or any((TIMING, p) in w.views for p in COMPUTE_PHASES):
        return
    longest = max(steps, key=lambda v: (_mean(v), v.raw or v.name))
    if w.views.get((TIMING, "step")) not in steps:
        return  # a user's rule or a preset names the step: it stays
    w.views[TIMING, "step"] = longest
    w.substeps = [v for v in steps if _mean(v) < SUBSTEP_RATIO * _mean(longest)]
    for v in w.substeps:
        w.unmapped[v.raw or v.name] = v


def _preferred(view: SeriesView, known: SeriesView) -> bool:
    """Of two series of one worker with one meaning (a phase logged under two names, a timer nested
    in another, an asynchronous collective's launch and its wait, a forward of two models), the one
    the insight reads: a user's rule or a preset over a name read, a certain reading over an
    uncertain one, then the one that took the longer this window (a nested timer's outer one, a
    collective's wait beside its launch: torchrec's ``wait_sparse_data_dist`` beside
    ``sparse_data_dist``; the same wait logged twice is read either way): a snapshot's per-batch
    mean, every occurrence's sum (25 bucket all-reduces a step beside one barrier), then the first
    name in order (deterministic)."""
    def rank(v: SeriesView) -> tuple[bool, float, float, str]:
        took = float(v.window.get("sum", 0.0)) if v.window and not v.snapshot else _mean(v)
        return READ in v.rule, -v.certainty, -took, v.raw or v.name

    return rank(view) < rank(known)


def _reads(roles: Mapping[str, Mapping[str, _Worker]]) -> dict[str, dict[str, tuple[str, float]]]:
    """Role -> phase -> (name, certainty) of the timings the insight reads whose phase was read from
    the name (``READ``) or is uncertain (a preset's bare ``time``), the least certain per phase."""
    out: dict[str, dict[str, tuple[str, float]]] = defaultdict(dict)
    used = (v for workers in roles.values() for w in workers.values()
            for v in (*w.views.values(), *(m for more in w.more.values() for m in more))
            if v.meaning not in OVERLAP_OF or not _said_exposed(w, OVERLAP_OF[v.meaning]))  # an overlap not taken off
    for v in used:
        if v.kind == TIMING and v.meaning in _READ_TIMINGS and (READ in v.rule or v.certainty < 1.0):
            known = out[v.role].get(v.meaning)
            if known is None or v.certainty < known[1]:
                out[v.role][v.meaning] = (v.raw or v.name, v.certainty)
    return dict(out)


def alive_seconds(senders: Sequence[SenderView], duration_s: float) -> dict[str, dict[str, tuple[float, bool]]]:
    """Role -> worker -> (seconds of the window, of ``duration_s`` ending now, its senders were
    alive; whether one started inside it): alive from the first message the daemon had from it
    (or the window's start) to its last (or the window's end). Records arrive when they are
    flushed, every 0.1 s, so a running sender's last message is at most a flush old; one that
    exited stops there. A label with several senders (a restart) counts the longest."""
    out: dict[str, dict[str, tuple[float, bool]]] = defaultdict(dict)
    for s in senders:
        first = s.first_seen_age_s if s.first_seen_age_s is not None else math.inf
        start = max(0.0, duration_s - first)
        end = min(duration_s, duration_s - max(0.0, s.last_seen_age_s))
        seconds = max(0.0, end - start)
        worker = out[s.role]
        before = worker.get(s.worker, (0.0, False))
        worker[s.worker] = (max(before[0], seconds), before[1] or first < duration_s)
    return dict(out)


def compute_insight(window: WindowReport, settings: InsightSettings | None = None,
                    gpus: GpuFacts | None = None, senders: Sequence[SenderView] | None = None) -> PipelineInsight:
    """The insight for one window. Never raises on odd input: missing series give ``None``
    metrics and, without pipeline data, the verdict ``unknown``. ``senders``: the window's
    senders (``IngestReport.senders``), to weigh each worker by the part of the window it was
    alive and to say ``idle`` when none is live (``SenderView.live``: one that closed is not, from
    the first window after its last message); None (synthetic windows): every worker counts the
    whole window."""
    settings = settings or InsightSettings()
    duration = window.duration_s
    roles_data = _group(window.series, window.steps_moved)
    alive = _alive_by_series_label(roles_data, senders, duration)
    roles: dict[str, RoleInsight] = {}
    workers: list[WorkerInsight] = []
    for role, members in sorted(roles_data.items()):
        role_workers = _worker_insights(role, members, duration, settings.straggler_score)
        workers.extend(role_workers)
        roles[role] = _role_insight(role, members, role_workers, duration, alive.get(role, {}))
    target = roles_data.get(settings.target_role, {})
    drafter = roles_data.get(settings.drafter_role, {})
    t_rate = roles[settings.target_role].batches_per_s if settings.target_role in roles else None
    d_rate = roles[settings.drafter_role].batches_per_s if settings.drafter_role in roles else None
    drafter_role = roles.get(settings.drafter_role)
    ready_deficit = drafter_role.time_share.get("queue_wait") if drafter_role else None
    composition = drafter or target
    throttled = throttled_gpus(gpus, settings.throttle_reasons)
    read = _reads(roles_data)
    facts = {r: RoleFacts(r, ri.time_share, tuple(w for w in workers if w.role == r), ri.unmapped,
                          ri.host_measured, read.get(r, {})) for r, ri in roles.items()}
    queue_fill = _fill(list(target.values()) + list(drafter.values()), "queue_depth", "queue_capacity")
    if queue_fill is None:
        queue_fill = _gauge_mean(list(target.values()) + list(drafter.values()), "queue_fill")
    live_roles = [s.role for s in senders or () if s.live(duration)]
    busy = role_busy(gpus, roles or set(live_roles))
    beside = role_busy(replace(gpus, busy=gpus.utilization), roles or set(live_roles)) if gpus else {}
    live = None if senders is None else len(live_roles)
    gpu_idle = idle_attribution(busy, roles)
    # no false health reads idle as no kernel at all: NVML utilization beside GPM SM activity
    running = idle_attribution({r: max(b, beside.get(r, b)) for r, b in busy.items()}, roles) if beside else gpu_idle
    verdict = decide(facts, duration, ready_deficit, queue_fill, throttled, gpus.roles if gpus else {}, settings,
                     busy, live, live_roles, beside, running)
    return PipelineInsight(
        end_unix_s=window.end_unix_s,
        duration_s=duration,
        roles=roles,
        workers=tuple(workers),
        queue_fill=queue_fill,
        ready_deficit=ready_deficit,
        target_drafter_batch_ratio=t_rate / d_rate if t_rate is not None and d_rate else None,
        prefetch_fill=_fill(list(drafter.values()), "prefetch_depth", "prefetch_capacity"),
        batch_tokens_mean=_batch_tokens(composition),
        loss_token_ratio=_loss_ratio(composition),
        bucket_entropy_bits=_bucket_entropy(composition),
        throttled_gpus=throttled,
        verdict=verdict,
        gpu_idle=gpu_idle,
        node=node_figures(roles, senders, duration),
    )


def _alive_by_series_label(roles_data: Mapping[str, Mapping[str, _Worker]], senders: Sequence[SenderView] | None,
                           duration: float) -> dict[str, dict[str, tuple[float, bool]]]:
    """Role -> worker -> (alive seconds, started in the window) for the labels the series carry.
    A series whose role or worker came from its key (one monitor thread publishing every role)
    has no sender of its own: it counts the longest-alive sender of the window."""
    if senders is None:
        return {}
    by_label = alive_seconds(senders, duration)
    longest = max((v for ws in by_label.values() for v in ws.values()), default=(0.0, False))
    return {role: {w: by_label.get(role, {}).get(w, longest) for w in members} for role, members in roles_data.items()}


def role_busy(gpus: GpuFacts | None, roles: Collection[str]) -> dict[str, float]:
    """GPU group (role) -> mean busy share of its GPUs. GPUs of no known group count for the one
    role when ``roles`` (those that publish mapped series, else those of the live senders) is
    exactly one (a single-role loop, on a box whose GPUs no group or process ties to it)."""
    if gpus is None or not gpus.busy:
        return {}
    by_role: dict[str, list[float]] = defaultdict(list)
    only = next(iter(roles)) if len(roles) == 1 else None
    for gpu, busy in gpus.busy.items():
        role = gpus.roles.get(gpu) or only
        if role is not None:
            by_role[role].append(busy)
    return {r: min(1.0, max(0.0, sum(v) / len(v))) for r, v in sorted(by_role.items())}


def idle_attribution(busy: Mapping[str, float], roles: Mapping[str, RoleInsight]) -> dict[str, dict[str, float]]:
    """Per GPU group: its idle share (1 - busy) split by what the group's role did meanwhile.
    The role's waiting shares (``IDLE_REASONS``) are taken as GPU idle time; when they add up to
    more than the idle share they are scaled down to it, and what they leave unexplained is
    ``unexplained`` (e.g. gaps between kernels inside compute phases, time in unmapped timings,
    or a gap that is not measured host time). Parts sum to ``idle``."""
    out: dict[str, dict[str, float]] = {}
    for group, b in busy.items():
        idle = 1.0 - b
        role = roles.get(group)
        share = dict(role.time_share) if role is not None else {}
        if role is not None and not role.host_measured:
            share.pop(OTHER, None)
        parts = {reason: sum(share.get(p, 0.0) for p in phases) for reason, phases in IDLE_REASONS.items()}
        explained = sum(parts.values())
        if explained > idle:
            parts = {k: v * idle / explained for k, v in parts.items()} if explained > 0 else parts
            explained = idle
        parts["unexplained"] = max(0.0, idle - explained)
        out[group] = {"idle": idle, **parts}
    return out


def _gauge_mean(members: list[_Worker], name: str) -> float | None:
    """Mean over workers of a gauge's window mean (clamped to 0-1): a published fill ratio."""
    values = [min(1.0, max(0.0, float(win["mean"]))) for w in members if (win := w.window(GAUGE, name))]
    return sum(values) / len(values) if values else None


def _worker_insights(role: str, members: dict[str, _Worker], duration: float,
                     straggler_score: float) -> list[WorkerInsight]:
    """Per-worker rates and relative scores (``_scores``); a worker scoring under
    ``straggler_score`` is flagged unless what it is slower at is negligible."""
    rates = {name: w.counter("batches", "rate") for name, w in members.items()}
    busy = {name: _busy_ms(w) for name, w in members.items()}
    scores, negligible = _scores(members, rates, busy)
    out = []
    for name in sorted(members, key=_worker_key):
        score = scores.get(name)
        flagged = score is not None and score < straggler_score and name not in negligible
        out.append(WorkerInsight(role, name, rates[name], members[name].counter("tokens", "rate"),
                                 busy[name], score, flagged))
    return out


def _scores(members: dict[str, _Worker], rates: dict[str, float],
            busy: dict[str, float | None]) -> tuple[dict[str, float | None], set[str]]:
    """Each worker's score (0-1, the role's best / its own) and those whose lag is negligible.

    Where every worker times its step and its collectives, the score compares the time each spends
    outside its collectives (``_arrivals``): ranks in step wait in a collective for the last one to
    arrive, so the rank the others wait for is the one slow at anything of its own (its compute, a
    read of its shard, its host work). Else it compares median busy time per batch, else batch
    rates (own / best): a worker that is slow at its own work, not one that waits for input. A
    worker whose extra busy time is under ``STRAGGLER_MIN_STEP_SHARE`` of its step is not flagged:
    a few milliseconds of noise on a step of a few milliseconds of work limit nothing; nor one whose
    fastest peer does not wait for it in collectives (``STRAGGLER_PEER_WAIT_SHARE``)."""
    scores: dict[str, float | None] = dict.fromkeys(members)
    if len(members) < 2:
        return scores, set()
    if (arrivals := _arrivals(members)) is not None:
        return arrivals
    comm = {name: _exposed(w, {"comm_wait": float(win["p50"])}, partial(_p50, w))["comm_wait"]
            for name, w in members.items() if (win := w.window(TIMING, "comm_wait"))}
    negligible: set[str] = set()
    if all(b is not None and b > 0 for b in busy.values()):
        best = min(b for b in busy.values() if b is not None)
        scores = {n: best / b for n, b in busy.items() if b is not None}
        negligible = {n for n, b in busy.items() if b is not None and rates[n] > 0
                      and (b - best) * rates[n] / 1000.0 < STRAGGLER_MIN_STEP_SHARE}
        if len(comm) == len(members):
            fastest = min(busy, key=lambda n: busy[n] or 0.0)
            negligible |= {n for n, b in busy.items() if b is not None and comm[fastest] - comm[n]
                           < STRAGGLER_PEER_WAIT_SHARE * (b - best)}
    elif max(rates.values()) > 0:
        best_rate = max(rates.values())
        scores = {n: r / best_rate for n, r in rates.items()}
    return scores, negligible


def _arrivals(members: dict[str, _Worker]) -> tuple[dict[str, float | None], set[str]] | None:
    """Scores from the time each worker spends outside its collectives a step (step less its
    communication wait, per-batch means, the wait's other collectives with it): None unless every
    worker times both. A worker is negligible where its extra time over the quickest is under
    ``STRAGGLER_MIN_STEP_SHARE`` of its step, where the quickest does not wait for it in the
    collectives (``STRAGGLER_PEER_WAIT_SHARE``: ranks out of step, each at its own pace), or where
    its timings (its phases and those of no phase) hold less than that share of its extra time: a
    lag in what no timing covers may be the rank's own GPU work the collective's timer waited for
    too (a synchronize ending it), while its host ran ahead (rank 0 logging as its GPU computes)."""
    own: dict[str, float] = {}
    steps: dict[str, float] = {}
    comms: dict[str, float] = {}
    timed: dict[str, float] = {}
    for name, w in members.items():
        step, comm = w.window(TIMING, "step"), w.snapshot_mean("comm_wait", 0.0)
        if comm is not None:
            comm = _exposed(w, {"comm_wait": comm}, partial(w.snapshot_mean, max_age_s=0.0))["comm_wait"]
        if not step or comm is None or (own_ms := float(step["mean"]) - comm) <= 0:
            return None
        own[name], steps[name], comms[name] = own_ms, float(step["mean"]), comm
        timed[name] = sum(float(v.window["mean"]) for (kind, meaning), v in w.views.items()
                          if kind == TIMING and meaning not in _ALIKE and v.window) \
            + sum(float(v.window["mean"]) for v in w.unmapped.values() if v.window)
    q = min(own, key=lambda n: own[n])
    return ({n: own[q] / t for n, t in own.items()},
            {n for n, t in own.items() if t - own[q] < STRAGGLER_MIN_STEP_SHARE * steps[n]
             or comms[q] - comms[n] < STRAGGLER_PEER_WAIT_SHARE * (t - own[q])
             or timed[n] - timed[q] < STRAGGLER_PEER_WAIT_SHARE * (t - own[q])})


def _p50(w: _Worker, meaning: str) -> float | None:
    win = w.window(TIMING, meaning)
    return float(win["p50"]) if win else None


def _worker_key(name: str) -> tuple[int, int | str]:
    return (0, int(name)) if name.isdigit() else (1, name)


def _busy_ms(w: _Worker) -> float | None:
    p50s = [float(win["p50"]) for phase in BUSY_PHASES if (win := w.window(TIMING, phase))]
    return sum(p50s) if p50s else None


def _role_insight(role: str, members: dict[str, _Worker], workers: list[WorkerInsight],
                  duration: float, alive: Mapping[str, tuple[float, bool]]) -> RoleInsight:
    rates = [w.batches_per_s for w in workers]
    cv = None
    if len(rates) >= 2:
        mean = sum(rates) / len(rates)
        if mean > 0:
            cv = math.sqrt(sum((r - mean) ** 2 for r in rates) / len(rates)) / mean
    shares, unmapped, measured = _time_share(members, duration, alive)
    return RoleInsight(role, len(members), sum(rates), sum(w.tokens_per_s for w in workers), cv, shares,
                       unmapped, measured, _reported(members))


def _reported(members: Mapping[str, _Worker]) -> dict[str, float]:
    """The role's own throughput and efficiency figures (``REPORTED``): each worker's latest
    value, summed or averaged over the workers that report it."""
    out: dict[str, float] = {}
    for fig in REPORTED:
        values = [v for w in members.values() if (v := w.gauge_last(fig.meaning)) is not None]
        if values:
            out[fig.meaning] = sum(values) / (1 if fig.combine == "sum" else len(values))
    return out


@dataclass(slots=True)
class _Reading:
    """One worker's part of a role's time shares, already weighted (``_time_share``)."""

    weight: float
    """The part of the window the worker stands for (0-1): its alive share, 1 from snapshots."""
    phases: dict[str, float]
    """Phase -> weighted share of the worker's wall time."""
    unmapped: dict[str, float]
    """Unmapped timing -> weighted share of the worker's wall time."""
    other: float | None
    """Weighted share no timing covers; None where it cannot be told (snapshots without ``step``)."""
    measured: bool
    """Whether the worker times its own compute (``COMPUTE_PHASES``, or parts of its step: ``_substeps``)."""


def _step_beside_unmapped(w: _Worker) -> bool:
    """Whether the worker sends a step snapshot and unmapped timings beside it and no phase at all
    (a trainer whose own timers name nothing the reader knows): their share of its step is read."""
    return (bool(w.unmapped) and w.snapshot("step")
            and not any((TIMING, p) in w.views or (TIMING, p) in w.stale for p in PHASES))


def _snapshot_reading(w: _Worker, max_age: float, alive_s: float) -> _Reading | None:
    """A worker read from its snapshots (weight 1): each phase's and each unmapped timing's
    per-batch mean over the cycle (the ``step`` mean, unmapped timings fitting in what the phases
    leave of it; else the sum of them all, or the step its pace says: ``_pace_ms`` over its
    ``alive_s`` seconds of the window); ``other`` only with a ``step`` mean. None: nothing to read."""
    # A worker with a fresh snapshot this window is read from it alone (a phase missing
    # from it is not carried over); without one, its last snapshot stands while recent.
    fresh = any(w.window(TIMING, p) or w.window(GAUGE, p) for p in PHASES)
    age = 0.0 if fresh else max_age
    overlaps = partial(w.snapshot_mean, max_age_s=max_age)  # one sent less often than its wait: its last stands
    means = _exposed(w, {p: m for p in PHASES if (m := w.snapshot_mean(p, age)) is not None}, overlaps)
    step = w.snapshot_mean("step", age, parts=False) if w.snapshot("step") else None
    if step and w.more and sum(means.values()) > PER_STEP_SLACK * step:
        means = _exposed(w, {p: m for p in PHASES if (m := w.snapshot_mean(p, age, parts=False)) is not None},
                         partial(w.snapshot_mean, max_age_s=max_age, parts=False))
    means, step = _with_shares(w, means, step, fresh)
    means = _per_step(w, means, step)
    # an unmapped timing sent every occurrence beside the snapshots (a user's own timer
    # in a framework callback's step) counts its mean once per cycle
    extra = {n: float(v.window["mean"]) for n, v in w.unmapped.items() if v.window}
    if not means and not (step and extra):
        return None  # nothing to read (a step with unmapped timings beside it: their share of it)
    covered = sum(means.values())
    spare = sum(extra.values())
    # without a step, the cycle is all the worker times: its unmapped timings too (read without
    # them, two phases of a five-part step were the whole of it, and one of them a bottleneck),
    # or, where it times no compute, the time a step its own steps per second say where that is
    # longer (a loop timing only its data wait read it as the whole of its step: input-bound at 15 %
    # of it, or at 5 %; one that times its micro-batches' compute under accumulation is paced by those)
    if step:
        cycle = max(step, covered)
    elif set(means) & set(COMPUTE_PHASES):
        cycle = covered + spare
    else:
        cycle = max(covered + spare, _pace_ms(w, alive_s))
    if cycle <= 0:
        return None
    room = max(0.0, cycle - covered)
    fit = min(1.0, room / spare) if spare > 0 else 1.0
    return _Reading(1.0, {phase: m / cycle for phase, m in means.items()},
                    {n: m * fit / cycle for n, m in extra.items()},
                    max(0.0, 1.0 - (covered + spare * fit) / cycle) if step else None,
                    _times_forward(w, {p for p, m in means.items() if m}, bool(extra)))


def _exposed(w: _Worker, times: dict[str, float], overlap_ms: Callable[[str], float | None]) -> dict[str, float]:
    """``times`` (phase -> ms) of ``w`` with each wait less the part of it the worker spent
    computing (``OVERLAP_OF``; ``overlap_ms``: an overlap meaning's ms, in the same form, or None):
    torch DDP's all-reduce timed from its first launch, under the backward, to its end, waited only
    its tail. A wait whose name says it is exposed already keeps its time (``_said_exposed``)."""
    out = times
    for overlap, wait in OVERLAP_OF.items():
        if wait in times and not _said_exposed(w, wait) and (ms := overlap_ms(overlap)) is not None:
            out = {**out, wait: max(0.0, times[wait] - ms)}
    return out


def _pace_ms(w: _Worker, alive_s: float) -> float:
    """Milliseconds a step from the steps per second the worker reports itself this window
    (``steps_per_s``: ``throughput/batches_per_sec``, HF's ``train_steps_per_second``), else from
    its steps in its ``alive_s`` seconds: how far its step axis moved, or its records of a timing
    where more (a micro-batch's wait published per micro-batch, the axis moved per optimizer step),
    ``PACE_MOVES`` or more; 0 if neither. An axis that moves faster than the steps (several
    ``wandb.log`` calls a step without ``step=``, a count of samples not known as such) gives a
    shorter pace than the timings' sum, which then stands; one that moves once a record logged
    every N steps (``wandb.log`` every N steps without ``step=``) reads each share N times short."""
    rate = w.window(GAUGE, "steps_per_s")
    if rate and float(rate["mean"]) > 0:
        return 1000.0 / float(rate["mean"])
    records = max((float(v.window.get("count", 0.0)) for (kind, _), v in w.views.items()
                   if kind == TIMING and v.window), default=0.0)
    steps = max(float(w.moved), records)
    return 1000.0 * alive_s / steps if steps >= PACE_MOVES and alive_s > 0 else 0.0


PACE_MOVES = 2
"""Steps a window must hold to pace it: one move may be an epoch logged as the step."""


def _per_step(w: _Worker, means: dict[str, float], step: float | None) -> dict[str, float]:
    """``means`` with each phase logged ``k`` >= 2 times as often as the step this window (gradient
    accumulation: a micro-batch's load and forward-backward logged per micro-batch, the optimizer
    and the whole step per optimizer step) counted ``k`` times, where the step holds them all
    (their sum within ``PER_STEP_SLACK`` of it); else as they are (a step logged less often than
    its phases holds them once: its phases' means already fill it)."""
    step_window = w.window(TIMING, "step")
    if not step or not step_window or not step_window.get("count"):
        return means
    steps = float(step_window["count"])
    times = {p: k for p in means if (pw := w.window(TIMING, p)) and (k := float(pw.get("count", 0)) / steps) >= 2}
    if not times:
        return means
    scaled = {p: m * times.get(p, 1.0) for p, m in means.items()}
    return scaled if sum(scaled.values()) <= PER_STEP_SLACK * step else means


PER_STEP_SLACK = 1.1
"""How far above the step its phases, counted as often as they are logged in it, may stand (a
timer's own overhead, jitter between the records) and still be read so (``_per_step``)."""


def _occurrence_reading(w: _Worker, alive_s: float, started: bool, duration: float) -> _Reading | None:
    """A worker read from every occurrence of its timings over its ``alive_s`` seconds of the
    window (weight: that part of it); ``other`` is what no timing covers. None: nothing to read."""
    if alive_s <= 0:
        return None
    sums = {p: s for p in PHASES if (s := w.timing_sum_ms(p)) is not None}
    sums.update((p, 0.0) for p in PHASES if p not in sums and (TIMING, p) in w.stale)
    sums = _exposed(w, sums, w.timing_sum_ms)
    if not sums:
        return None
    wall_ms = alive_s * 1000.0
    weight = alive_s / duration
    covered = sum(sums.values()) / wall_ms
    scale = 1.0 / covered if covered > 1.0 else 1.0
    extra = {n: float(v.window["sum"]) / wall_ms for n, v in w.unmapped.items() if v.window}
    room = max(0.0, 1.0 - covered * scale)
    spare = sum(extra.values())
    fit = min(1.0, room / spare) if spare > 0 else 1.0
    return _Reading(weight, {phase: weight * sm / wall_ms * scale for phase, sm in sums.items()},
                    {n: weight * share * fit for n, share in extra.items()}, weight * max(0.0, room - spare * fit),
                    not started and _times_forward(w, {p for p, sm in sums.items() if sm}, bool(extra)))


def _times_forward(w: _Worker, timed: set[str], unmapped: bool) -> bool:
    """Whether the worker times its forward (``FORWARD_PHASES``): by name, as parts of its step
    (``_substeps``), or as a timing of no phase beside its backward."""
    return bool(timed & set(FORWARD_PHASES) or w.substeps or ("backward" in timed and unmapped))


SHARE_DIGITS = 12
"""Decimal places a time share keeps: past them, floating-point error of the unit it was sent in."""


def _time_share(members: dict[str, _Worker], duration: float,
                alive: Mapping[str, tuple[float, bool]]) -> tuple[dict[str, float], dict[str, float], bool]:
    """(phase -> share of wall time, unmapped timing -> share, whether ``other`` is host time),
    averaged over the role's workers, each weighted by the part of the window it was alive
    (``alive``: worker -> (seconds, started in the window); a worker missing from it counts the
    whole window; one alive for none of it is not read). Every occurrence: each phase (and each unmapped timing) is the
    window's sum of that timing over the worker's alive time; ``other`` is what no timing covers;
    shares are scaled down when their sum exceeds 1 (a step that began in the previous window,
    or unmapped timings nested in mapped ones); a phase published before but not in this window
    counts 0. Snapshots: each timing's per-batch mean over the cycle (the ``step`` mean, else the
    sum of the means, unmapped timings' included); ``other`` is the part of ``step`` no timing covers (absent without
    ``step``: it cannot be told). ``other`` is host time only where every worker read times its
    compute (``COMPUTE_PHASES``), else the gap may be the model's own untimed work; and, every
    occurrence, not in the window its sender started in (what it sent before the daemon's
    subscription reached it is lost by design, so that window's gap is not measured)."""
    if duration <= 0 or not members:
        return {}, {}, False
    totals: dict[str, float] = defaultdict(float)
    unmapped: dict[str, float] = defaultdict(float)
    weight_sum = 0.0
    other_told = measured = True
    max_age = SNAPSHOT_MAX_AGE_WINDOWS * duration
    for name, w in members.items():
        alive_s, started = alive.get(name, (duration, False))
        if any(w.snapshot(p) or w.share(p, True) is not None for p in PHASES) or _step_beside_unmapped(w):
            reading = _snapshot_reading(w, max_age, min(duration, alive_s))
        else:
            reading = _occurrence_reading(w, min(duration, alive_s), started, duration)
        if reading is None:
            continue
        weight_sum += reading.weight
        for phase, value in reading.phases.items():
            totals[phase] += value
        for n, value in reading.unmapped.items():
            unmapped[n] += value
        if reading.other is None:
            other_told = False
        else:
            totals[OTHER] += reading.other
        measured = measured and reading.measured
    if weight_sum <= 0:
        return {}, {}, False
    out = {phase: value / weight_sum for phase, value in totals.items() if phase != OTHER}
    by_name = {n: v / weight_sum for n, v in sorted(unmapped.items(), key=lambda kv: -kv[1])}
    if by_name:
        out[UNATTRIBUTED] = sum(by_name.values())
    if other_told:
        out[OTHER] = totals[OTHER] / weight_sum
    # a share read back from a percent (25.0 % of a 40 ms step: 0.24999999999999992) is the same
    # share as one timed in ms: rounded, so that no threshold tells the two forms apart
    out = {phase: round(value, SHARE_DIGITS) for phase, value in out.items()}
    return out, by_name, measured and OTHER in out


def _with_shares(w: _Worker, means: dict[str, float], step: float | None,
                 fresh: bool) -> tuple[dict[str, float], float | None]:
    """A phase the worker reports as its share of the step (a gauge in ``ratio``: torchtitan's
    ``data_loading(%)``) and not as a timing counts as that share of its ``step`` mean; without
    a ``step``, the shares are of a unit cycle (ms are then shares, and ``other`` is the rest)."""
    shares = {p: s for p in PHASES if p not in means and (s := w.share(p, fresh)) is not None}
    if not shares:
        return means, step
    cycle = step if step else (1.0 if not means else None)
    if cycle is None:
        return means, step  # timings without a step: a share of what is unknown
    return {**means, **{p: s * cycle for p, s in shares.items()}}, cycle


def _fill(members: list[_Worker], depth: str, capacity: str) -> float | None:
    """Mean over workers of (window mean of gauge ``depth``) / (last ``capacity``), 0-1."""
    ratios = []
    for w in members:
        win = w.window(GAUGE, depth)
        cap = w.gauge_last(capacity)
        if win and cap and cap > 0:
            ratios.append(min(1.0, max(0.0, float(win["mean"]) / cap)))
    return sum(ratios) / len(ratios) if ratios else None


def _batch_tokens(members: dict[str, _Worker]) -> float | None:
    """Mean total tokens per batch: the ``batch_tokens`` gauge (count-weighted), else the
    ``tokens``/``batches`` counters."""
    mean = _count_weighted_mean(members, "batch_tokens")
    if mean is not None:
        return mean
    batches = sum(w.counter("batches") for w in members.values())
    return sum(w.counter("tokens") for w in members.values()) / batches if batches else None


def _loss_ratio(members: dict[str, _Worker]) -> float | None:
    """Share of tokens that carry loss: ``loss_tokens``/``tokens`` counters, else the
    ``loss_token_fraction`` gauge (count-weighted mean)."""
    tokens = sum(w.counter("tokens") for w in members.values())
    loss = sum(w.counter("loss_tokens") for w in members.values())
    if tokens > 0 and any(w.window(COUNT, "loss_tokens") for w in members.values()):
        return min(1.0, loss / tokens)
    return _count_weighted_mean(members, "loss_token_fraction")


def _count_weighted_mean(members: dict[str, _Worker], name: str) -> float | None:
    """The window mean of gauge ``name`` over the workers, weighted by their sample counts;
    None where no worker reported it this window."""
    n = total = 0.0
    for w in members.values():
        win = w.window(GAUGE, name)
        if win:
            n += win["count"]
            total += win["mean"] * win["count"]
    return total / n if n else None


def _bucket_entropy(members: dict[str, _Worker]) -> float | None:
    """Shannon entropy (bits) of the ``bucket`` category merged over the role's workers."""
    counts: dict[str, float] = defaultdict(float)
    for w in members.values():
        win = w.window(CATEGORY, "bucket")
        if win:
            for key, share in win["distribution"].items():
                counts[key] += share * win["count"]
    return entropy_bits(counts.values()) if counts else None


def throttled_gpus(gpus: GpuFacts | None, reasons: Collection[str]) -> dict[str, tuple[str, ...]]:
    """GPU -> the active clock-event reasons that count as throttling (sorted); only GPUs with one."""
    if gpus is None:
        return {}
    out = {}
    for gpu, active in gpus.clock_events.items():
        hit = sorted(set(active).intersection(reasons))
        if hit:
            out[str(gpu)] = tuple(hit)
    return dict(sorted(out.items(), key=lambda kv: _worker_key(kv[0])))
