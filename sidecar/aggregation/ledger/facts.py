"""What one window gives the run ledger: its senders, and per role its time shares, timings,
tokens and GPUs (``window_facts``, the one function that reads a window for the ledger).

Pure (no I/O, no clock): an ``IngestReport`` in, ``WindowFacts`` out; ``RunLedger.add``
(``sidecar.aggregation.ledger.fold``) folds them into the run's record. The run a sender belongs
to is told here too (``run_of``; a host's runs are cut at gaps by the fold).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from sidecar.model.insight import Verdict
from sidecar.model.ledger import CAUSES
from sidecar.model.liveness import LIVE_S, SENDING_S
from sidecar.model.meanings import PHASES
from sidecar.model.window import COUNT, GAUGE, TIMING, IngestReport, SenderView, WindowReport

COMPILE_FACTOR = 5.0
"""A step in a sender's first ``COMPILE_WINDOWS`` windows with steps at least this many times its
window's median step marks compilation: its excess over the median is ``compile``."""
COMPILE_WINDOWS = 2
HOST_RUN = "host:"
"""The prefix of a run known by its host alone (its senders told no W&B run and no run label)."""

IDLE_CAUSES = {"data": "data", "queue": "queue", "collectives": "communication", "host": "host",
               "unexplained": "unattributed", "unattributed": "unattributed"}
"""The insight's GPU idle reasons -> ledger causes (any other reason is ``unattributed``)."""
SHARE_CAUSES = {"data_wait": "data", "queue_wait": "queue", "queue_put_wait": "queue", "comm_wait": "communication",
                "other": "host", "forward": "productive", "backward": "productive", "optimizer": "productive",
                "pack": "productive", "forward_backward": "productive"}
"""The role's phase time shares -> ledger causes, used without GPU readings."""


@dataclass(frozen=True, slots=True)
class SenderFact:
    """One sender in one window: ``key`` names its process (pid and start); ``begin`` the later of
    its start and the window's begin, ``end`` its last message (unix seconds, read once at its
    receipt: the same float in every window, so only a message sent since places it later);
    ``sending`` whether it is still sending at the window's end (``model.liveness.SENDING_S``; not once it
    closed); ``step`` its latest step (None before one)."""

    key: str
    run: str
    role: str
    started_unix_s: float
    begin: float
    end: float
    step: int | None
    sending: bool = True
    flops_per_token: float | None = None
    """The model FLOPs per token its hello states (None: not stated)."""
    closed: bool = False
    """Its last message said it was closing: it ended cleanly at ``end``."""
    first_step: int | None = None
    """The first step number the daemon had from it (its first stepping window counts from it)."""
    cycles: int | None = None
    """Steps its label completed this window by count (``step_cycles``; None: nothing counts them)."""


@dataclass(frozen=True, slots=True)
class RoleFact:
    """One role in one window: ``shares`` of its alive time by cause (summing to 1);
    ``checkpoint_s``/``compile_s`` its workers' mean seconds in those; ``tokens`` processed;
    ``energy_j`` its GPUs' energy since the previous window (None without readings)."""

    shares: Mapping[str, float]
    checkpoint_s: float = 0.0
    compile_s: float = 0.0
    first_step_excess_s: float = 0.0
    """Mean per worker of the compile excess of its ``step`` timing this window (``COMPILE_FACTOR``;
    counted only in a sender's first ``COMPILE_WINDOWS`` windows with steps)."""
    tokens: float = 0.0
    step_s: float = 0.0
    """Mean per worker of the seconds its ``step`` timings (every occurrence) cover this window."""
    lone_step_s: float = 0.0
    """Mean per worker of the one ``step`` timing of workers with exactly one this window (no
    median to compare it with yet: the next window's tells whether it compiled)."""
    median_step_s: float = 0.0
    """Mean per worker of the median ``step`` timing of workers with two or more this window."""
    gpus: int = 0
    gpu_name: str = ""
    reported: Mapping[str, float] = field(default_factory=dict)
    """The trainer's own throughput and efficiency figures (``RoleInsight.reported``)."""


@dataclass(frozen=True, slots=True)
class WindowFacts:
    """What the ledger needs from one window. ``energy``: GPU uuid -> its energy counter (joules);
    ``gpu_roles``: GPU uuid -> role (absent: no known role)."""

    end_unix_s: float
    duration_s: float
    senders: tuple[SenderFact, ...]
    roles: Mapping[str, RoleFact]
    energy: Mapping[str, float] = field(default_factory=dict)
    gpu_roles: Mapping[str, str] = field(default_factory=dict)
    ends: tuple[tuple[str, ...], ...] = ()
    """(role, how, cause, detail) of each sender end told in the window (``model.ends``; cause
    and detail may be left out)."""
    verdict: Verdict | None = None
    """The pipeline insight's verdict of the window (None without an insight)."""


def run_of(hello: Mapping[str, object] | None) -> str:
    """The run a sender belongs to: the W&B run id its hello announces, else its run label
    (``trainer_shim.run_label``: the launcher's job id), else ``host:<its host>`` (which
    ``RunLedger`` cuts into runs at gaps longer than ``run_gap_s``)."""
    hello = hello or {}
    for key in ("wandb_run_id", "run_label"):
        run = hello.get(key)
        if isinstance(run, str) and run.strip():
            return run.strip()
    host = hello.get("host")
    return f"{HOST_RUN}{host}" if isinstance(host, str) and host else f"{HOST_RUN}unknown"


def _flops_of(hello: Mapping[str, object] | None) -> float | None:
    """The hello's ``flops_per_token`` if it is a number a model can have (1 to 1e18), else None."""
    value = (hello or {}).get("flops_per_token")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 1.0 <= value <= 1e18:
        return float(value)
    return None


def window_facts(report: IngestReport) -> WindowFacts:
    """The ledger's inputs from one window (the only place the ledger reads a window)."""
    w = report.window
    begin = w.end_unix_s - w.duration_s
    cycles = step_cycles(w)
    numbers = step_numbers(w)
    senders = []
    for s in report.senders:
        last = s.last_seen_unix_s  # where its receipt put it: a silent sender is placed alike in every window
        if last < begin and s.last_seen_age_s > LIVE_S:  # a live sender silent this window still counts
            continue
        started = started_of(s, w.end_unix_s)
        step, first_step = w.sender_steps.get(s.sender), w.sender_first_steps.get(s.sender)
        counted = w.sender_step_counts.get(s.sender)
        if counted is not None:  # its step counts samples or tokens: its steps are its step changes
            step, first_step = counted, 1
        if step is None:  # no publish(step): a step field of its own (a framework's iter, global_step)
            step, first_step = numbers.get((s.role, s.worker), (None, None))
        senders.append(SenderFact(sender_key(s, w.end_unix_s), run_of(s.hello), s.role, started,
                                  max(begin, started), last, step,
                                  s.last_seen_age_s <= SENDING_S and not s.closed, _flops_of(s.hello),
                                  closed=s.closed, first_step=first_step, cycles=cycles.get((s.role, s.worker))))
    insight = report.insight
    gpu_of_role, names, energy, uuid_roles = _gpus(report, {s.role for s in senders})
    roles: dict[str, RoleFact] = {}
    for role in {s.role for s in senders}:
        mine = gpu_of_role.get(role, ())
        throttled = (sum(1 for g in mine if g in insight.throttled_gpus) / len(mine)
                     if insight is not None and mine else 0.0)
        checkpoint, compile_s, first, step_s, lone, median = _timed(report, role)
        ri = insight.roles.get(role) if insight is not None else None
        roles[role] = RoleFact(_shares(report, role, throttled), checkpoint, compile_s, first,
                               (ri.tokens_per_s * w.duration_s) if ri is not None else 0.0, step_s,
                               lone, median, len(mine), names.get(role, ""),
                               dict(ri.reported) if ri is not None else {})
    return WindowFacts(w.end_unix_s, w.duration_s, tuple(senders), roles, energy, uuid_roles,
                       tuple((e.role, e.how, e.cause, e.detail) for e in report.ends.new),
                       insight.verdict if insight is not None else None)


def started_of(s: SenderView, end_unix_s: float) -> float:
    """When the sender's process started (its hello's ``started_unix_s``; 0: not told, or not
    before ``end_unix_s``, the window's end)."""
    started = (s.hello or {}).get("started_unix_s")
    return float(started) if isinstance(started, (int, float)) and 0 < started <= end_unix_s else 0.0


def sender_key(s: SenderView, end_unix_s: float) -> str:
    """The name the ledger (and the run timeline) keeps a sender process under: its pid and start."""
    return f"{s.pid}@{started_of(s, end_unix_s):.3f}" if s.pid is not None else f"sender:{s.sender}"


def step_cycles(window: WindowReport) -> dict[tuple[str, str], int]:
    """(role, worker) -> steps it completed this window, told without step numbers, the first of:
    its every-occurrence ``step`` timings (one per step), the rise of its ``batches`` counter
    (``batches``, ``steps``, ``iterations``, ...), the recurrence of its phase timings (the count
    of the phase timed least often, from each phase's second occurrence on: each phase recurs
    once a step, and a phase seen once may belong to a step still running). Labels with none are
    absent."""
    step: dict[tuple[str, str], int] = {}
    batches: dict[tuple[str, str], int] = {}
    phases: dict[tuple[str, str], int] = {}
    for v in window.series:
        if v.window is None or v.snapshot:
            continue
        label = (v.role, v.worker)
        if v.kind == TIMING and v.meaning == "step":
            step[label] = step.get(label, 0) + int(v.window.get("count", 0))
        elif v.kind == COUNT and v.meaning == "batches":
            batches[label] = batches.get(label, 0) + max(0, round(float(v.window.get("delta", 0.0))))
        elif v.kind == TIMING and v.meaning in PHASES:
            n = int(v.window.get("count", 0))
            # a phase recurs once a step: its first occurrence ever opens the first step, it ends none
            n -= 1 if v.cumulative.get("count") == n else 0
            phases[label] = min(phases.get(label, 1 << 62), n)
    return {**phases, **batches, **step}


def step_numbers(window: WindowReport) -> dict[tuple[str, str], tuple[int, int]]:
    """(role, worker) -> (its latest step number, the lowest it sent this window) from a gauge or
    dict key that means ``step_number`` (``iter``, ``global_step``, ...) sent this window (the
    series outlives a restarted process: its last number is not the successor's)."""
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for v in window.series:
        if v.kind != GAUGE or v.meaning != "step_number" or not v.window:
            continue
        last, low = v.window.get("last"), v.window.get("min")
        if isinstance(last, (int, float)) and isinstance(low, (int, float)) and math.isfinite(last) and last >= 0:
            out[v.role, v.worker] = (int(last), int(max(0.0, min(low, last))))
    return out


def _gpus(report: IngestReport, roles: set[str]) -> tuple[dict[str, tuple[str, ...]], dict[str, str],
                                                          dict[str, float], dict[str, str]]:
    """Role -> its GPU indices (as text), role -> GPU name, uuid -> energy counter, uuid -> role.
    GPUs of no group belong to the one role when exactly one role is alive."""
    view = report.gpu
    snap = view.snapshot if view is not None else None
    if view is None or snap is None:
        return {}, {}, {}, {}
    group_of = {str(i): g.name for g in view.groups for i in g.gpus}
    only = next(iter(roles)) if len(roles) == 1 else None
    by_role: dict[str, list[str]] = {}
    names: dict[str, str] = {}
    energy: dict[str, float] = {}
    uuid_roles: dict[str, str] = {}
    for r in snap.gpus:
        if not r.up:
            continue
        role = group_of.get(str(r.index)) or only
        if r.energy_joules is not None:
            energy[r.uuid] = r.energy_joules
        if role is not None:
            by_role.setdefault(role, []).append(str(r.index))
            names.setdefault(role, r.name)
            uuid_roles[r.uuid] = role
    return {k: tuple(v) for k, v in by_role.items()}, names, energy, uuid_roles


def _shares(report: IngestReport, role: str, throttled: float) -> dict[str, float]:
    """Shares of the role's alive time by cause, summing to 1."""
    insight = report.insight
    out = dict.fromkeys(CAUSES, 0.0)
    idle = insight.gpu_idle.get(role) if insight is not None else None
    if idle is not None:
        busy = max(0.0, 1.0 - idle["idle"])
        out["productive"], out["throttled"] = busy * (1.0 - throttled), busy * throttled
        for reason, value in idle.items():
            if reason != "idle":
                out[IDLE_CAUSES.get(reason, "unattributed")] += max(0.0, value)
    else:
        ri = insight.roles.get(role) if insight is not None else None
        host_measured = ri is not None and ri.host_measured
        for phase, value in (ri.time_share.items() if ri is not None else ()):
            # The gap no timing covers is host time only where the insight measured it as such.
            cause = SHARE_CAUSES.get(phase, "unattributed") if phase != "other" or host_measured else "unattributed"
            out[cause] += max(0.0, value)
        out["throttled"], out["productive"] = out["productive"] * throttled, out["productive"] * (1.0 - throttled)
    total = sum(out.values())
    if total > 1.0:
        out = {k: v / total for k, v in out.items()}
    out["unattributed"] += max(0.0, 1.0 - sum(out.values()))
    return out


def _timed(report: IngestReport, role: str) -> tuple[float, float, float, float, float, float]:
    """The role's mean seconds per worker in timings named ``checkpoint`` and ``compile`` this
    window, the compile excess of its ``step`` timing (``COMPILE_FACTOR``), its ``step`` seconds,
    and ``RoleFact.lone_step_s`` and ``median_step_s``."""
    sums: dict[str, dict[str, float]] = {"checkpoint": {}, "compile": {}, "step": {}}
    first: dict[str, float] = {}
    lone: dict[str, float] = {}
    median: dict[str, float] = {}
    workers: set[str] = set()
    for v in report.window.window_series(TIMING):
        if v.role != role:
            continue
        workers.add(v.worker)
        win = v.window or {}
        if v.meaning == "step" and not v.snapshot:
            sums["step"][v.worker] = sums["step"].get(v.worker, 0.0) + float(win.get("sum", 0.0)) / 1000.0
        for what in ("checkpoint", "compile"):
            if what in v.name:
                sums[what][v.worker] = sums[what].get(v.worker, 0.0) + float(win.get("sum", 0.0)) / 1000.0
        if v.meaning == "step" and not v.snapshot and win.get("count", 0) == 1:
            lone[v.worker] = float(win.get("max", 0.0)) / 1000.0
        if v.meaning == "step" and not v.snapshot and win.get("count", 0) >= 2:
            p50, top = float(win.get("p50", 0.0)), float(win.get("max", 0.0))
            median[v.worker] = p50 / 1000.0
            if p50 > 0 and top >= COMPILE_FACTOR * p50:
                first[v.worker] = (top - p50) / 1000.0
    n = max(1, len(workers))
    first = {w: max(0.0, x - sums["checkpoint"].get(w, 0.0)) for w, x in first.items()}  # a step that saved
    lone = {w: max(0.0, x - sums["checkpoint"].get(w, 0.0)) for w, x in lone.items()}
    return (sum(sums["checkpoint"].values()) / n, sum(sums["compile"].values()) / n, sum(first.values()) / n,
            sum(sums["step"].values()) / n, sum(lone.values()) / n,
            sum(median.values()) / len(median) if median else 0.0)

