"""The bottleneck verdict: which part of the DFlash pipeline limits the run, and why.

Evidence first (docs/METRICS.md explains the rules for operators): where the daemon has busy
readings for the roles' GPUs (role -> busy share over the window), they decide before anything
else. Every pipeline role's GPUs busy >= ``compute_busy_ratio`` -> ``compute-bound``, whatever
the queue and host-side shares say. Otherwise the idlest role's largest idle cause decides when
it is not the queue: its own data-loader wait -> ``input-bound``, collectives ->
``communication-bound``, measured host gap -> ``host-bound`` (each over its single-role
threshold below, and larger than the role's queue wait). A role idle mostly on the queue, or on
nothing over a threshold, or no GPU reading at all, leaves the verdict to the queue rules, which
follow the hidden-state queue between the two roles, because whichever side of a bounded queue
waits is not the limit:

1. Drafters wait on an empty queue (ready deficit >= ``starved_ratio``): the supply side limits.
   Which part of it is read from the target workers' time breakdown: waiting for the host data
   loader -> ``input-bound``; packing/handing off hidden states -> ``queue-starved``; both sides
   waiting on each other (targets blocked on a full queue too) -> ``queue-starved`` (the queue is
   too small); targets busy in their forward pass -> ``target-bound``; no target timings to say
   more -> ``queue-starved``.
2. Otherwise targets wait for room in a full queue (put-wait share >= ``backpressure_ratio``, or,
   without that timing, the queue fill >= ``queue_full_ratio``): the drafters limit ->
   ``drafter-bound`` (``input-bound`` if the drafters themselves wait on the data loader).
3. Otherwise ``balanced``: neither side waits for the other.

(Until 0.3 the DFlash rules said ``host-bound`` where they now say ``input-bound``; the detail
says ``formerly host-bound`` for one release.)

Two causes then override, because they explain the limit rather than locate it: ``throttled``
when a GPU of the limiting role (or of an unknown role, or any GPU when balanced) reports a
throttling clock-event reason; else ``straggler`` when a worker of the limiting role (any role
when balanced) scores below ``straggler_score``. Windows shorter than ``MIN_WINDOW_S``, without
data from either role, or with nothing that tells whether a side waits (no ``queue_wait`` or
``queue_put_wait`` timing, no queue gauges) get ``unknown``; a window without a live trainer
process gets ``idle`` (a trainer that exited cleanly is not live from the first window after its
last message: ``sidecar.model.window.is_live``).

Any other trainer (no target or drafter role, e.g. a plain training loop) gets the single-role
rules on its main role (the one with the most workers that publishes phase timings). Evidence
first: where its GPUs have a busy reading (GPM SM activity, else NVML utilization), busy >=
``compute_busy_ratio`` is ``compute-bound`` whatever the host-side shares say, except where the
reading is NVML utilization alone and the role waits in collectives (``comm_wait`` share >=
``comm_wait_ratio``): NCCL's kernels spin for the whole all-reduce and NVML counts them busy, so
that is ``communication-bound``, its detail saying the trainer's timing decided
(``_busy_but_waiting``); with GPM the evidence names NVML utilization beside SM activity
(``gpu_utilization``). Otherwise (GPUs
idle, or no GPU reading) the largest wait over its threshold decides: ``input-bound``
(``data_wait`` share, with an empty queue's ``queue_wait``: a learner blocked on its actors, >=
``host_wait_ratio``), ``communication-bound`` (``comm_wait`` share >=
``comm_wait_ratio``), ``host-bound`` (``other`` >= ``host_overhead_ratio``, and only where
``other`` is measured host time: the gap inside the worker's step, or its alive time, that no
timing covers, from workers that time their own forward/backward); else ``balanced``. Time in
unmapped timings (``unattributed``) never decides: it is named in the evidence and lowers the
confidence by its share. ``throttled`` and ``straggler`` override as above, except that a
straggler does not override ``compute-bound`` (busy GPUs are not idle waiting for it). A loop
that sends no phase timing at all (the HF Trainer's, nanoGPT's, Accelerate's own logs) is judged
by the GPU reading of its role alone (a live sender's, or its mapped series'): busy ->
``compute-bound``; idle -> ``balanced`` at a low confidence, the idle share named
``<role>.unattributed`` (``_untimed``); no reading -> ``unknown``.

No false health: a window the rules call ``balanced`` while a role's GPUs are idle at least
``unexplained_idle_ratio`` of it beyond what the role's waits explain (the GPU idle
attribution's ``unexplained``) is ``unexplained-idle`` instead (``_no_false_health``). Evidence a
name reader read (no rule or preset mapped it) is named in the detail, and an ambiguous read
lowers the confidence (``_read``).

Every verdict has a confidence (0-1): 0.5 at its deciding threshold, rising to 1 as the deciding
number moves one threshold's worth past it (for ``balanced``: how far the largest signal stays
under its threshold). ``Hysteresis`` keeps the shown verdict from flapping between windows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from sidecar.aggregation.settings import InsightSettings
from sidecar.model.insight import RENAMED_FROM_HOST_BOUND, Verdict
from sidecar.model.mapped import READ
from sidecar.model.meanings import BUSY_PHASES, OVERLAP_OF

OTHER_SHARE = "other"
"""The time-share key of the gap no timing covers (``sidecar.aggregation.insight.OTHER``)."""
UNATTRIBUTED_SHARE = "unattributed"
"""The time-share key of time in unmapped timings (``sidecar.aggregation.insight.UNATTRIBUTED``)."""

MIN_WINDOW_S = 0.5
"""Windows shorter than this (the partial last window at shutdown) get ``unknown``."""

SPIN_GAP = 0.25
"""NVML utilization this far over GPM SM activity on a ``communication-bound`` role: its detail says
the collectives spin (the GPUs look busy while their SMs wait)."""

class _WorkerLike(Protocol):
    @property
    def worker(self) -> str: ...
    @property
    def score(self) -> float | None: ...
    @property
    def straggler(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class RoleFacts:
    """What the rules read about one role: its time shares and its workers."""

    role: str
    time_share: Mapping[str, float]
    workers: tuple[_WorkerLike, ...]
    unmapped: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Unmapped timing name -> share of wall time (``time_share["unattributed"]`` in parts)."""
    host_measured: bool = False
    """Whether ``time_share["other"]`` is measured host time (``sidecar.aggregation.insight``)."""
    read: Mapping[str, tuple[str, float]] = dataclasses.field(default_factory=dict)
    """Phase -> (the name it was read from, the read's certainty 0-1) for the phases whose meaning
    no rule or preset gave but the name reader (``sidecar.processing.reader``)."""


def confidence(value: float, threshold: float) -> float:
    """0.5 at ``threshold``, 1 once ``value`` is a threshold's worth past it (either side)."""
    if threshold <= 0:
        return 1.0
    return round(min(1.0, 0.5 + 0.5 * abs(value - threshold) / threshold), 3)


def _without_pipeline(roles: Mapping[str, RoleFacts], duration_s: float, throttled: Mapping[str, tuple[str, ...]],
                      gpu_roles: Mapping[str, str], s: InsightSettings, gpu_busy: Mapping[str, float],
                      live_roles: Collection[str], gpu_util: Mapping[str, float]) -> Verdict:
    """``decide`` for a window with neither the target nor the drafter role: the role with the
    most workers among those with phase timings, else the roles' GPUs alone."""
    timed = [f for f in roles.values() if f.time_share]
    if not timed:
        untimed = _untimed(roles, live_roles, gpu_busy, s)
        if untimed is None:
            return Verdict("unknown", (("window_s", duration_s),),
                           "no series mapped to a phase timing" if not roles else
                           f"no phase timings from role(s) {', '.join(sorted(roles))}")
        return _override(*untimed, roles, throttled, gpu_roles, s)
    main = max(timed, key=lambda f: (len(f.workers), f.role))
    util = gpu_util.get(main.role)
    single, role = _single_role(main, gpu_busy.get(main.role), s, util)
    single = _beside_utilization(single, gpu_busy.get(main.role), util)
    return _override(single, role, roles, throttled, gpu_roles, s)


def decide(roles: Mapping[str, RoleFacts], duration_s: float, ready_deficit: float | None,
           queue_fill: float | None, throttled: Mapping[str, tuple[str, ...]], gpu_roles: Mapping[str, str],
           s: InsightSettings, gpu_busy: Mapping[str, float] | None = None, live_senders: int | None = None,
           live_roles: Collection[str] = (), gpu_util: Mapping[str, float] | None = None,
           gpu_idle: Mapping[str, Mapping[str, float]] | None = None) -> Verdict:
    """Apply the rules above to one window. ``gpu_busy``: role -> busy share of its GPUs over
    the window; ``live_senders``: how many trainer processes are live (None: not told);
    ``live_roles``: the roles of the live senders (one that sent no mapped series has GPUs too);
    ``gpu_util``: role -> NVML utilization of its GPUs where their busy share is GPM SM activity
    (``GpuFacts.utilization``), absent where the busy share is NVML utilization itself;
    ``gpu_idle``: role -> its GPUs' idle share split by cause (``insight.idle_attribution``), for
    the no-false-health rule (``_no_false_health``)."""
    v = _decide(roles, duration_s, ready_deficit, queue_fill, throttled, gpu_roles, s, gpu_busy, live_senders,
                live_roles, gpu_util)
    return _no_false_health(v, roles, gpu_idle or {}, s) if v.name == "balanced" else v


def _no_false_health(v: Verdict, roles: Mapping[str, RoleFacts], gpu_idle: Mapping[str, Mapping[str, float]],
                     s: InsightSettings) -> Verdict:
    """``balanced`` needs evidence of a healthy step: a role whose GPUs are idle at least
    ``unexplained_idle_ratio`` of the window beyond what its waits explain makes the window
    ``unexplained-idle`` instead, its evidence the idle and unexplained shares. The roles read are
    those with phase timings (an untimed evaluator's idle GPUs do not make a timed trainer's
    window unhealthy), all roles where none has any; idle is no kernel running (NVML utilization
    beside GPM SM activity: ``insight.compute_insight``)."""
    timed = {r: idle for r, idle in gpu_idle.items() if r in roles and roles[r].time_share}
    worst = max((timed or gpu_idle).items(), key=lambda kv: kv[1].get("unexplained", 0.0), default=None)
    if worst is None or worst[1].get("unexplained", 0.0) < s.unexplained_idle_ratio:
        return v
    role, idle = worst
    gap = idle["unexplained"]
    detail = f"GPUs {idle['idle']:.0%} idle, {gap:.0%} that no timing explains: "
    compute = sum(f.time_share.get(p, 0.0) for p in BUSY_PHASES) if (f := roles.get(role)) is not None else 0.0
    if compute >= gap:
        detail += ("the idle is inside the timed compute phases, kernel gaps, launch overhead or small kernels, "
                   "which a profiler trace tells apart")
    else:  # no parentheses: the console line's evidence ends at the first ")"
        detail += _advice(f.time_share if f is not None else {})
    if v.detail:
        detail += f"; {v.detail}"  # what the balanced reading said (an unmapped timing, a read)
    return Verdict("unexplained-idle", ((f"{role}.gpu_idle", idle["idle"]), (f"{role}.unexplained", gap)) + v.evidence,
                   detail, confidence(gap, s.unexplained_idle_ratio))


UNTIMED_ADVICE = (("the data wait", ("data_wait", "queue_wait")), ("the collectives", ("comm_wait",)),
                  ("forward/backward", ("forward", "backward", "forward_backward")))
"""What the no-false-health detail asks a trainer to time, each with the phases that time it."""


def _advice(shares: Mapping[str, float]) -> str:
    """The no-false-health advice: time what is not timed yet (a trainer timing its data wait and
    its forward/backward is asked for its collectives, not for what it sends already)."""
    missing = [what for what, phases in UNTIMED_ADVICE if not any(shares.get(p) for p in phases)]
    if not missing:
        return "every phase is timed: the idle is between them; dflash-sidecar explain says what is unread"
    return f"time {_and(missing)}; dflash-sidecar explain says what is missing"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _decide(roles: Mapping[str, RoleFacts], duration_s: float, ready_deficit: float | None,
            queue_fill: float | None, throttled: Mapping[str, tuple[str, ...]], gpu_roles: Mapping[str, str],
            s: InsightSettings, gpu_busy: Mapping[str, float] | None, live_senders: int | None,
            live_roles: Collection[str], gpu_util: Mapping[str, float] | None) -> Verdict:
    """``decide`` before the no-false-health rule."""
    target, drafter = roles.get(s.target_role), roles.get(s.drafter_role)
    if duration_s < MIN_WINDOW_S:
        return Verdict("unknown", (("window_s", duration_s),), "window too short")
    if live_senders == 0:
        return Verdict("idle", (), "no live trainer")
    if target is None and drafter is None:
        return _without_pipeline(roles, duration_s, throttled, gpu_roles, s, gpu_busy or {}, live_roles,
                                 gpu_util or {})
    t_share = target.time_share if target else {}
    d_share = drafter.time_share if drafter else {}
    put_wait = t_share.get("queue_put_wait")
    limit: str | None
    queue = (("ready_deficit", ready_deficit), ("queue_fill", queue_fill))
    first = _pipeline_gpu_first(roles, gpu_busy or {}, queue, s)
    if first is not None:
        base, limit = first
        return _override(base, limit, roles, throttled, gpu_roles, s)
    if ready_deficit is not None and ready_deficit >= s.starved_ratio:
        limit = s.target_role
        base = _supply_verdict(ready_deficit, t_share, put_wait, queue_fill, s)
    elif (put_wait is not None and put_wait >= s.backpressure_ratio) or (
            put_wait is None and queue_fill is not None and queue_fill >= s.queue_full_ratio):
        limit = s.drafter_role
        data_wait = d_share.get("data_wait", 0.0)
        evidence = _pairs((f"{s.target_role}.queue_put_wait", put_wait), ("queue_fill", queue_fill),
                          ("ready_deficit", ready_deficit))
        if data_wait >= s.host_wait_ratio:
            base = Verdict("input-bound", _pairs((f"{s.drafter_role}.data_wait", data_wait)) + evidence[:2],
                           RENAMED_FROM_HOST_BOUND)
        else:
            base = Verdict("drafter-bound", evidence)
    elif ready_deficit is None and put_wait is None and queue_fill is None:
        limit = None
        base = Verdict("unknown", (), "no queue_wait/queue_put_wait timings or queue gauges")
    else:
        limit = None
        closest = max((ready_deficit or 0.0) / s.starved_ratio, (put_wait or 0.0) / s.backpressure_ratio)
        base = Verdict("balanced", _pairs(("ready_deficit", ready_deficit),
                                          (f"{s.target_role}.queue_put_wait", put_wait),
                                          ("queue_fill", queue_fill)), confidence=confidence(min(closest, 1.0), 1.0))
    if limit is not None and base.evidence and base.confidence == 1.0:
        threshold = s.starved_ratio if limit == s.target_role else s.backpressure_ratio
        base = replace(base, confidence=confidence(base.evidence[0][1], threshold) if base.evidence[0][0] in (
            "ready_deficit", f"{s.target_role}.queue_put_wait") else base.confidence)
    for f in (target, drafter):  # the queue rules' evidence read from a name is said, as the others'
        if f is not None:
            base = _read(base, f)
    return _override(base, limit, roles, throttled, gpu_roles, s)


def _pipeline_gpu_first(roles: Mapping[str, RoleFacts], busy: Mapping[str, float],
                        queue: tuple[tuple[str, float | None], ...],
                        s: InsightSettings) -> tuple[Verdict, str | None] | None:
    """The DFlash rules' evidence first (module docstring): (verdict, limiting role) when the GPU
    readings decide, None when the queue rules must (no reading, or the idlest role's GPUs wait
    mostly on the queue, or nothing it waits on is over its threshold)."""
    pipeline = [r for r in (s.target_role, s.drafter_role) if r in roles]
    readings = {r: busy[r] for r in pipeline if r in busy}
    if not readings:
        return None
    gpu = tuple((f"{r}.gpu_busy", b) for r, b in readings.items())
    if len(readings) == len(pipeline) and all(b >= s.compute_busy_ratio for b in readings.values()):
        return Verdict("compute-bound", gpu + _pairs(*queue),
                       confidence=confidence(min(readings.values()), s.compute_busy_ratio)), None
    idle = [r for r, b in readings.items() if b < s.compute_busy_ratio]
    if not idle:
        return None
    role = min(idle, key=lambda r: readings[r])
    f = roles[role]
    share = f.time_share
    causes = [("input-bound", "data_wait", share.get("data_wait", 0.0), s.host_wait_ratio),
              ("communication-bound", "comm_wait", share.get("comm_wait", 0.0), s.comm_wait_ratio),
              ("host-bound", OTHER_SHARE, share.get(OTHER_SHARE, 0.0) if f.host_measured else 0.0,
               s.host_overhead_ratio)]
    queue_wait = share.get("queue_wait", 0.0) + share.get("queue_put_wait", 0.0)
    name, key, value, threshold = max(causes, key=lambda c: c[2])
    if value < threshold or value <= queue_wait:
        return None
    detail = RENAMED_FROM_HOST_BOUND if name == "input-bound" else ""
    v = Verdict(name, ((f"{role}.{key}", value), (f"{role}.gpu_busy", readings[role])) + _pairs(*queue)[:1],
                detail, confidence(value, threshold))
    return _unattributed(v, f), role


def _untimed(roles: Mapping[str, RoleFacts], live_roles: Collection[str], busy: Mapping[str, float],
             s: InsightSettings) -> tuple[Verdict, str] | None:
    """A loop that sends no phase timing (the HF Trainer's, nanoGPT's or Accelerate's own logs):
    (verdict, role) from the GPU reading of its role alone, None without one. Busy ->
    ``compute-bound``; idle -> ``balanced`` at a low confidence (0.5, as undecided, times the
    busy share: the idle share is time no timing explains, ``<role>.unattributed``), its detail
    naming the timings that would tell why: never a wait verdict without a wait measured."""
    read = [r for r in set(roles).union(live_roles) if r in busy]
    if not read:
        return None
    role = max(read, key=lambda r: (len(roles[r].workers) if r in roles else 0, r))
    b = busy[role]
    if b >= s.compute_busy_ratio:
        return Verdict("compute-bound", (("gpu_busy", b),), "no phase timings: the GPU reading decides",
                       confidence(b, s.compute_busy_ratio)), role
    detail = (f"no phase timings: GPUs {b:.0%} busy, {1 - b:.0%} idle that no timing explains; time data_wait_ms "
              "and forward/backward (the shim's framework callbacks do), comm_wait_ms, to tell why")
    return Verdict("balanced", (("gpu_busy", b), (f"{role}.unattributed", 1 - b)), detail, round(0.5 * b, 3)), role


def _single_role(f: RoleFacts, busy: float | None, s: InsightSettings,
                 utilization: float | None = None) -> tuple[Verdict, str]:
    """The single-role rules (module docstring) on one role's time shares and GPU busy share
    (``utilization``: NVML's beside it where ``busy`` is GPM SM activity)."""
    share = f.time_share
    r = f.role
    gpu = _pairs(("gpu_busy", busy))
    gap = share.get(OTHER_SHARE) if f.host_measured else None
    signals = [("input-bound", *_input_wait(f), s.host_wait_ratio),
               ("communication-bound", f"{r}.comm_wait", share.get("comm_wait"), s.comm_wait_ratio),
               ("host-bound", f"{r}.other", gap, s.host_overhead_ratio)]
    known = [(n, k, v, t) for n, k, v, t in signals if v is not None]
    evidence = tuple((k, v) for _, k, v, _ in known)
    if busy is not None and busy >= s.compute_busy_ratio:
        waiting = _busy_but_waiting(f, busy, utilization, s)
        if waiting is not None:
            return _unattributed(waiting, f), r
        busy_share = sum(share.get(p, 0.0) for p in BUSY_PHASES)
        v = Verdict("compute-bound", gpu + ((f"{r}.busy", busy_share),) + evidence[:2],
                    confidence=confidence(busy, s.compute_busy_ratio))
        return _unattributed(v, f), r
    over = [x for x in known if x[2] >= x[3]]
    if over:
        name, key, value, threshold = max(over, key=lambda x: x[2] / x[3])
        rest = tuple((k, v) for k, v in evidence if k != key)
        v = Verdict(name, ((key, value),) + gpu + rest, confidence=confidence(value, threshold))
        return _unattributed(v, f), r
    closest = max((v / t for _, _, v, t in known), default=0.0)
    if busy is None:
        detail = "no GPU busy data from NVML to tell compute-bound"
    else:
        detail = f"GPUs {busy:.0%} busy, no wait over its threshold"
    if OTHER_SHARE in share and not f.host_measured:
        detail += "; the gap between timings is not host time: no forward timing"
    v = Verdict("balanced", evidence + gpu, detail, confidence=confidence(min(closest, 1.0), 1.0))
    return _unattributed(v, f), r


def _input_wait(f: RoleFacts) -> tuple[str, float | None]:
    """(evidence key, share) of a single role's wait for its input: the data loader's, and an empty
    queue's (``queue_wait``: a learner blocked on its actors' rollouts, a consumer on its producer;
    in a DFlash pipeline the drafters' ready deficit, which the queue rules read instead). The key
    names the larger; None where the role times neither."""
    data, queue = f.time_share.get("data_wait"), f.time_share.get("queue_wait")
    if queue is None:
        return f"{f.role}.data_wait", data
    key = "data_wait" if (data or 0.0) >= queue else "queue_wait"
    return f"{f.role}.{key}", (data or 0.0) + queue


EVIDENCE_OF: dict[str, tuple[str, ...]] = {
    **{p: ("busy",) for p in BUSY_PHASES}, "step": (OTHER_SHARE, "busy"), **{o: (w,) for o, w in OVERLAP_OF.items()}}
"""A phase -> the evidence keys (after ``<role>.``) besides its own that it decides: the busy
phases make ``busy``, ``step`` the gap ``other`` (and the busy share's denominator), an overlap
the wait it is taken off."""


def _read(v: Verdict, f: RoleFacts) -> Verdict:
    """Say which of the verdict's evidence was read from a name (no rule or preset mapped it), and
    lower its confidence by the read's certainty (a name that means different things in
    different codebases)."""
    keys = {k for k, _ in v.evidence}
    used = [(p, *f.read[p]) for p in f.read
            if f"{f.role}.{p}" in keys or any(f"{f.role}.{e}" in keys for e in EVIDENCE_OF.get(p, ()))]
    if not used:
        return v
    note = "; ".join(f"{p} {READ}: {name}" + (", ambiguous" if c < 1.0 else "") for p, name, c in used)
    certainty = min(c for _, _, c in used)
    return replace(v, detail=f"{v.detail}; {note}" if v.detail else note,
                   confidence=round(v.confidence * certainty, 3))


def _busy_but_waiting(f: RoleFacts, busy: float, utilization: float | None, s: InsightSettings) -> Verdict | None:
    """``communication-bound`` for a role whose GPUs read busy only because collectives spin on
    them, else None. NVML utilization counts any kernel running, and NCCL's kernels run for the
    whole of an all-reduce while the rank waits for its peers: without GPM SM activity
    (``utilization`` None: ``busy`` is NVML utilization) a ``comm_wait`` share at or over
    ``comm_wait_ratio`` decides, and the detail says so. With SM activity (``busy`` is SM activity,
    ``utilization`` NVML's beside it) a busy reading is real compute: None."""
    comm = f.time_share.get("comm_wait", 0.0)
    if utilization is not None or comm < s.comm_wait_ratio:
        return None
    detail = (f"GPUs {busy:.0%} busy by NVML utilization, which counts collectives' spinning kernels; "
              f"no GPM SM activity: the trainer's comm_wait decides")
    return Verdict("communication-bound", ((f"{f.role}.comm_wait", comm), ("gpu_busy", busy)), detail,
                   confidence(comm, s.comm_wait_ratio))


def _beside_utilization(v: Verdict, busy: float | None, utilization: float | None) -> Verdict:
    """The verdict with NVML utilization read beside GPM SM activity (``gpu_busy``) in its evidence;
    where utilization is high and SM activity low on a ``communication-bound`` role, the detail
    names the spin (the GPUs look busy and wait)."""
    if utilization is None:
        return v
    v = replace(v, evidence=v.evidence + (("gpu_utilization", utilization),))
    if v.name != "communication-bound" or busy is None or utilization - busy < SPIN_GAP:
        return v
    note = f"GPUs {utilization:.0%} busy by NVML utilization, {busy:.0%} by GPM SM activity: collectives spin"
    return replace(v, detail=f"{v.detail}; {note}" if v.detail else note)


def _unattributed(v: Verdict, f: RoleFacts) -> Verdict:
    """Name the time in unmapped timings in the verdict's evidence and lower its confidence by
    that share: it never decides, but the verdict may be wrong by as much. Reads from names are
    said too (``_read``)."""
    v = _read(v, f)
    share = f.time_share.get(UNATTRIBUTED_SHARE, 0.0)
    if share <= 0.01 or not f.unmapped:
        return v
    name, part = next(iter(f.unmapped.items()))
    note = (f"{part:.0%} of the step in {name}" + (f" and {len(f.unmapped) - 1} more" if len(f.unmapped) > 1 else "")
            + ", unmapped: add a rule, see dflash-sidecar explain")
    return replace(v, evidence=v.evidence + ((f"{f.role}.unattributed", share),),
                   detail=f"{v.detail}; {note}" if v.detail else note,
                   confidence=round(v.confidence * max(0.0, 1.0 - share), 3))


def _supply_verdict(deficit: float, t_share: Mapping[str, float], put_wait: float | None,
                    queue_fill: float | None, s: InsightSettings) -> Verdict:
    """Drafters starve: find the part of the supply side that limits."""
    data_wait = t_share.get("data_wait", 0.0)
    pack = t_share.get("pack", 0.0)
    forward = t_share.get("forward")
    head = (("ready_deficit", deficit),)
    if put_wait is not None and put_wait >= s.backpressure_ratio:
        return Verdict("queue-starved", head + ((f"{s.target_role}.queue_put_wait", put_wait),),
                       "both sides wait: queue too small")
    if data_wait >= s.host_wait_ratio and data_wait >= pack:
        return Verdict("input-bound", head + ((f"{s.target_role}.data_wait", data_wait),), RENAMED_FROM_HOST_BOUND)
    if pack >= s.handoff_ratio:
        return Verdict("queue-starved", head + ((f"{s.target_role}.pack", pack),))
    if forward is not None:
        return Verdict("target-bound", head + _pairs((f"{s.target_role}.forward", forward), ("queue_fill", queue_fill)))
    return Verdict("queue-starved", head + _pairs(("queue_fill", queue_fill)), "no target timings")


def _override(base: Verdict, limit: str | None, roles: Mapping[str, RoleFacts],
              throttled: Mapping[str, tuple[str, ...]], gpu_roles: Mapping[str, str], s: InsightSettings) -> Verdict:
    hot = {g: r for g, r in throttled.items() if limit is None or gpu_roles.get(g) in (None, limit)}
    if hot:
        detail = " ".join(f"gpu{g}:{'+'.join(r)}" for g, r in hot.items())
        return Verdict("throttled", (("throttled_gpus", float(len(hot))),) + base.evidence[:2],
                       f"{detail}, otherwise {base.name}", 1.0)
    if base.name == "compute-bound":
        return base  # the GPUs are busy: a slow worker is not what leaves them idle
    if limit is None:
        candidates = list(roles.values())
    else:
        candidates = [roles[limit]] if limit in roles else []
    stragglers = [(f.role, w) for f in candidates for w in f.workers if w.straggler and w.score is not None]
    if stragglers:
        role, worst = min(stragglers, key=lambda rw: rw[1].score or 0.0)
        assert worst.score is not None
        return Verdict("straggler", ((f"{role}.{worst.worker}.score", worst.score),) + base.evidence[:2],
                       f"worker {role}/{worst.worker}, {len(stragglers)} flagged",
                       confidence(worst.score, s.straggler_score))
    return base


def _pairs(*items: tuple[str, float | None]) -> tuple[tuple[str, float], ...]:
    return tuple((k, v) for k, v in items if v is not None)


class Hysteresis:
    """Keeps the shown verdict from flapping on noise: a new verdict replaces the shown one only
    when it is decided in ``windows`` consecutive windows, or at once when its confidence is at
    least ``strong`` (a clear change is not delayed). Until then the shown verdict stays, its
    detail naming the candidate. The first verdict, and any after ``unknown`` or ``idle``, is
    taken at once, and so is ``idle`` itself, whatever its confidence (no live trainer remains:
    there is nothing left to hold a verdict for); a too-short window (the flush at shutdown)
    changes nothing. Not thread-safe: the ingest thread owns it."""

    def __init__(self, windows: int = 2, strong: float = 0.9) -> None:
        self.windows = windows
        self.strong = strong
        self.shown: Verdict | None = None
        self._candidate: str | None = None
        self._seen = 0

    def update(self, v: Verdict) -> Verdict:
        """The verdict to show for a window whose own verdict is ``v``."""
        if v.name == "unknown" and v.detail == "window too short":
            return v
        shown = self.shown
        if (shown is None or shown.name in ("unknown", "idle") or v.name in (shown.name, "idle")
                or v.confidence >= self.strong):
            return self._take(v)
        if v.name == self._candidate:
            self._seen += 1
        else:
            self._candidate, self._seen = v.name, 1
        if self._seen >= self.windows:
            return self._take(v)
        return replace(shown, detail=(shown.detail + "; " if shown.detail else "")
                       + f"held: {v.name} for {self._seen} window(s)",
                       confidence=min(shown.confidence, 1 - v.confidence + 0.5))

    def _take(self, v: Verdict) -> Verdict:
        self.shown, self._candidate, self._seen = v, None, 0
        return v
