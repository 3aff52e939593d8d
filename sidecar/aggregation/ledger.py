"""The run ledger (goodput): windows in, per run and role where the wall time and the energy went.

Pure (no I/O, no clock, no locks; the ingest thread owns it): ``window_facts(report)`` is the one
function that reads a window (its senders, steps, insight and GPU view) and ``RunLedger.add``
folds those facts into totals kept as plain JSON-able data (``state()`` / ``RunLedger(state)``),
so ``sidecar.core.ledger_state`` can persist them across daemon restarts. How each cause is told is
in ``sidecar.model.ledger.CAUSES`` and docs/METRICS.md ("Run ledger").

A role's timeline: it starts at its first sender's start (``started_unix_s`` of its hello: the
shim's first use) and is accounted, window by window, up to its senders' last message. The
time since the last accounted moment is split by the window's shares: the GPU group's busy share
and idle attribution where NVML reads the GPUs, else the role's phase time shares; a timing named
``checkpoint`` or ``compile`` and the excess of a sender's first long steps are taken out of the
idle causes first. Before a role's first step (a step number, else ``step_cycles``) its time is
held (``starting_s``) and told as ``startup`` or ``compile`` once that step arrives, or as
``unobserved`` if its senders all go before one. Once its step time settles, the idle time
nothing explained in its slow first windows is retold as ``warmup`` (``_warmup``); at a clean end
(a sender that closed), the time told since its last step is retold as ``shutdown``
(``_shutdown``). Time the daemon did not run while the same sender process lived is
``unobserved``; a successor's arrival turns the gap since its predecessor's last message into
``restart_gap`` up to the successor's start.

The run (``run_of``): the W&B run id of the hello, else its run label (the shim's, from the
launcher's environment), else the host; a host's senders after no sender of its current run sent
for ``run_gap_s`` start a new run, ``host:<name>@<UTC start>`` (``RunLedger._host_runs``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sidecar.aggregation import run_verdicts
from sidecar.model.insight import Verdict
from sidecar.model.ledger import CAUSES, RoleLedger, RunLedgerView
from sidecar.model.meanings import PHASES
from sidecar.model.window import COUNT, GAUGE, LIVE_S, TIMING, IngestReport, SenderView, WindowReport

GONE_AFTER_S = 3.0
"""A sender silent for longer than this at a window's end left at its last message (a shim sends
a heartbeat every 2 s)."""
COMPILE_FACTOR = 5.0
"""A step in a sender's first ``COMPILE_WINDOWS`` windows with steps at least this many times its
window's median step marks compilation: its excess over the median is ``compile``."""
COMPILE_WINDOWS = 2
MAX_RUNS = 64
"""Runs kept; beyond, the one seen least recently is forgotten (counted)."""
MAX_SENDERS_PER_ROLE = 64
"""Sender processes remembered per run and role (to tell a daemon restart from a trainer restart)."""
STATE_VERSION = 1
LAST_END_DETAIL = 160
"""Characters of a role's last end's detail kept in the state file, at most."""
RUN_GAP_S = 300.0
"""Default ``run_gap_s``: a host's senders without a W&B run or run label start a new run when no
sender of the host's current run sent for longer than this (seconds)."""
HOST_RUN = "host:"

IDLE_CAUSES = {"data": "data", "queue": "queue", "collectives": "communication", "host": "host",
               "unexplained": "unattributed", "unattributed": "unattributed"}
"""The insight's GPU idle reasons -> ledger causes (any other reason is ``unattributed``)."""
SHARE_CAUSES = {"data_wait": "data", "queue_wait": "queue", "queue_put_wait": "queue", "comm_wait": "communication",
                "other": "host", "forward": "productive", "backward": "productive", "optimizer": "productive",
                "pack": "productive", "forward_backward": "productive"}
"""The role's phase time shares -> ledger causes, used without GPU readings."""
TAKE_ORDER = ("unattributed", "host", "data", "queue", "communication", "productive", "throttled")
"""Where checkpoint and compile seconds are taken from: the GPU-idle causes first."""
SHUTDOWN_FROM = TAKE_ORDER
"""The causes a window tells by its shares: after a role's last step, these seconds are its shutdown."""
WARMUP_SETTLE = 1.25
"""A role's step time has settled once two consecutive stretches of its windows take per step
within this factor of each other (``_warmup``)."""
WARMUP_MAX_STRETCHES = 20
"""Stretches watched for the step time to settle; a role whose step time never settles in as
many keeps its first windows' idle time ``unattributed``."""


@dataclass(frozen=True, slots=True)
class SenderFact:
    """One sender in one window: ``key`` names its process (pid and start); ``begin`` the later of
    its start and the window's begin, ``end`` its last message (unix seconds, read once at its
    receipt: the same float in every window, so only a message sent since places it later);
    ``alive`` whether it is still sending at the window's end (``GONE_AFTER_S``; not once it
    closed); ``step`` its latest step (None before one)."""

    key: str
    run: str
    role: str
    started_unix_s: float
    begin: float
    end: float
    step: int | None
    alive: bool = True
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


def run_of(hello: Mapping[str, Any] | None) -> str:
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


def _flops_of(hello: Mapping[str, Any] | None) -> float | None:
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
                                  s.last_seen_age_s <= GONE_AFTER_S and not s.closed, _flops_of(s.hello),
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


class RunLedger:
    """The totals, as JSON-able data (``state()``), fed one window at a time (``add``)."""

    def __init__(self, state: Mapping[str, Any] | None = None, flops_per_token: float | None = None,
                 run_gap_s: float = RUN_GAP_S) -> None:
        """``state``: what ``state()`` returned before (a daemon restart), validated by the caller
        (``sidecar.core.ledger_state``). ``flops_per_token``: the model FLOPs per token, for MFU, where
        the trainer's hello states none. ``run_gap_s``: seconds without a sender after which a
        host's next sender (no W&B run, no run label) starts a new run."""
        self.flops_per_token = flops_per_token
        self.run_gap_s = run_gap_s
        s = dict(state or {})
        self.runs: dict[str, dict[str, dict[str, Any]]] = s.get("runs", {})
        self.host_runs: dict[str, str] = {k: v for k, v in dict(s.get("host_runs", {})).items()
                                          if isinstance(k, str) and isinstance(v, str)}
        """``host:<name>`` -> the run its senders now go to (``_host_runs``)."""
        self.no_trainer_s: float = float(s.get("no_trainer_s", 0.0))
        self.no_trainer_j: float = float(s.get("no_trainer_j", 0.0))
        self.runs_dropped: int = int(s.get("runs_dropped", 0))
        self.energy_prev: dict[str, float] = dict(s.get("energy_prev", {}))
        self.now_unix_s: float = float(s.get("now_unix_s", 0.0))
        self.trainer_until: float = float(s.get("trainer_until", 0.0))
        """Unix time of the newest sender message folded in."""
        self.idle_until: float = float(s.get("idle_until", 0.0))
        """No-trainer time is accounted up to here (0 while a sender is alive)."""
        self.session_begin: float | None = None
        """Begin of the first window this daemon folded: earlier time was not watched."""
        self.verdicts: run_verdicts.Verdicts = run_verdicts.clean(s.get("verdicts"), self.runs)
        """Each run's verdicts (``sidecar.aggregation.run_verdicts``)."""

    def state(self) -> dict[str, Any]:
        """Everything the ledger holds, as JSON-able data."""
        return {"version": STATE_VERSION, "runs": self.runs, "no_trainer_s": self.no_trainer_s,
                "no_trainer_j": self.no_trainer_j, "runs_dropped": self.runs_dropped,
                "energy_prev": self.energy_prev, "now_unix_s": self.now_unix_s,
                "trainer_until": self.trainer_until, "idle_until": self.idle_until, "host_runs": self.host_runs,
                "verdicts": self.verdicts}

    def add(self, facts: WindowFacts) -> None:
        """Fold one window in."""
        begin = facts.end_unix_s - facts.duration_s
        if self.session_begin is None:
            self.session_begin = begin
        joules = self._energy(facts)
        groups: dict[tuple[str, str], list[SenderFact]] = {}
        for s in self._host_runs(facts.senders):
            groups.setdefault((s.run, s.role), []).append(s)
        self._hold_gap_energy(joules, {role for _, role in groups})
        for (run, role), senders in sorted(groups.items()):
            fact = facts.roles.get(role) or RoleFact(dict.fromkeys(CAUSES, 0.0) | {"unattributed": 1.0})
            self._add_role(run, role, senders, fact, joules.get(role), begin)
        for run, members in self.runs.items():
            for role, r in members.items():
                r["live"] = any(s.alive for s in groups.get((run, role), ()))
                heard = max(float(r["observed_until"] or 0.0), self.session_begin or 0.0)
                if (run, role) not in groups and r["pending_startup"] > 0 and facts.end_unix_s - heard > LIVE_S:
                    self._unplaced(r)
        for end in facts.ends:
            _book_end(self.runs, *end[:4])
        self._verdicts(groups, facts.verdict, begin, facts.end_unix_s)
        self._no_trainer(facts, begin, sum(joules.values()))
        self.now_unix_s = facts.end_unix_s
        self._bound()

    def _verdicts(self, groups: Mapping[tuple[str, str], list[SenderFact]], verdict: Verdict | None,
                  begin: float, end: float) -> None:
        """The window's verdict goes to each run with a live sender, for the seconds of the window
        the run was alive: from the later of the window's begin and its senders' first start to the
        window's end."""
        if verdict is None:
            return
        by_run: dict[str, list[SenderFact]] = {}
        for (run, _), senders in groups.items():
            by_run.setdefault(run, []).extend(senders)
        for run, senders in by_run.items():
            if any(s.alive for s in senders):
                run_verdicts.fold(self.verdicts, run, verdict, end - max(begin, min(s.begin for s in senders)))

    def _hold_gap_energy(self, joules: Mapping[str, float], present: set[str]) -> None:
        """The energy of a role's GPUs while none of its senders is there is held in the role of
        the most recent run that has it (``gap_j``): a successor tells it as ``restart_gap``; if
        the run ended, it stays outside the run like the gap's seconds. GPUs of no role go to
        that run's role when it has only one."""
        latest: dict[str, tuple[float, dict[str, Any]]] = {}
        runs = sorted(self.runs.values(), key=lambda m: max(float(r["observed_until"] or 0.0) for r in m.values()))
        for members in runs:
            for role, r in members.items():
                latest[role] = (float(r["observed_until"] or 0.0), r)
        if runs and len(runs[-1]) == 1 and "" in joules:
            [(role, r)] = runs[-1].items()
            if role not in present and r["observed_until"] is not None:
                r["gap_j"] = r.get("gap_j", 0.0) + joules[""]
        for role, j in joules.items():
            if role and role not in present and role in latest:
                r = latest[role][1]
                if r["observed_until"] is not None:
                    r["gap_j"] = r.get("gap_j", 0.0) + j

    def _host_runs(self, senders: tuple[SenderFact, ...]) -> list[SenderFact]:
        """``senders`` with each host run (``host:<name>``: no W&B run, no run label) resolved: a
        sender the host's current run knows stays in it; new ones join it when they started within
        ``run_gap_s`` of its last message, else they start a new run, ``host:<name>@<their first
        start, UTC>``."""
        resolved: dict[str, str] = {}
        for base in sorted({s.run for s in senders if s.run.startswith(HOST_RUN)}):
            mine = [s for s in senders if s.run == base]
            current = self.host_runs.get(base) or base  # a state from before run gaps: the host's one run
            members = self.runs.get(current, {})
            runs = [run for run in self.runs if run == base or run.startswith(base + "@")]
            for s in mine:  # a sender stays in the run that knows it, the current one or an earlier one
                run = next((run for run in runs if any(s.key in r["senders"] for r in self.runs[run].values())), None)
                if run is not None:
                    resolved[s.key] = run
            known = [s for s in mine if resolved.get(s.key) == current]
            new = [s for s in mine if s.key not in resolved]
            if new:
                ends = [float(r["observed_until"] or r["first_unix_s"]) for r in members.values()]
                last = max(ends + [s.end for s in known], default=None)
                if last is None or _start(new) - last > self.run_gap_s:
                    current = f"{base}@{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(_start(new)))}"
                for s in new:
                    resolved[s.key] = current
            self.host_runs[base] = current
        return [dataclasses.replace(s, run=resolved[s.key]) if s.key in resolved else s for s in senders]

    def _no_trainer(self, facts: WindowFacts, begin: float, joules: float) -> None:
        """Daemon time with no live sender: from the later of the last message, the last time
        accounted so and this session's start, to the window's end (or to the first message of a
        sender that came after it)."""
        floor = max(self.idle_until, self.trainer_until, self.session_begin or begin)
        alive = [s for s in facts.senders if s.alive]
        if facts.senders:
            self.trainer_until = max(self.trainer_until, max(s.end for s in facts.senders))
        if alive:
            first = min(s.begin for s in alive)  # a gone one still listed began long before
            if self.idle_until > 0 and first > floor:
                self.no_trainer_s += first - floor
            self.idle_until = 0.0
            return
        start = max(floor, self.trainer_until)
        if facts.end_unix_s > start:
            self.no_trainer_s += facts.end_unix_s - start
            if facts.duration_s > 0:
                self.no_trainer_j += joules * min(1.0, (facts.end_unix_s - start) / facts.duration_s)
        self.idle_until = facts.end_unix_s

    def _energy(self, facts: WindowFacts) -> dict[str, float]:
        """Role -> joules its GPUs used since the previous window ("" for GPUs of no role)."""
        out: dict[str, float] = {}
        for uuid, value in facts.energy.items():
            prev = self.energy_prev.get(uuid)
            if prev is not None and value >= prev:
                role = facts.gpu_roles.get(uuid, "")
                out[role] = out.get(role, 0.0) + value - prev
        self.energy_prev.update(facts.energy)  # a window without a poll yet keeps the last readings
        return out

    def _add_role(self, run: str, role: str, senders: list[SenderFact], fact: RoleFact,
                  joules: float | None, begin: float) -> None:
        """Account one (run, role) from where it was accounted up to its senders' last message."""
        r = self.runs.setdefault(run, {}).setdefault(role, _new_role(senders))
        known = r["senders"]
        stepped = [s for s in senders if s.step is not None or s.cycles or known.get(s.key, {}).get("windows_stepped")]
        b = max(s.end for s in senders)
        prev, continuing, joules_now = _resume(r, senders, joules)
        if b <= prev:  # nothing new from its senders: the energy waits for the seconds it goes with
            r["carry_j"] = joules_now
            return
        seconds = dict.fromkeys(CAUSES, 0.0)
        released: dict[str, float] = {}
        """Held startup seconds told this window (they take the held joules, not this window's)."""
        apart = 0.0
        """Restart-gap seconds before this window whose energy was held apart (``gap_j``)."""
        if not continuing:  # a successor: the gap until it started; a predecessor's unfinished startup stands
            prev, apart = _successor(r, senders, prev, b, begin, seconds, released)
        session = self.session_begin or 0.0
        if prev < session:  # the daemon was not running: the trainer was alive unseen
            unseen = min(session, b) - prev
            seconds["startup" if not stepped and not r["steps"] and not r["stepped"] else "unobserved"] += unseen
            prev += unseen
        alive, pended = self._split_alive(r, fact, stepped, prev, b, begin, seconds, released)
        progress = _advance_senders(senders, known)
        r["steps"] += max(progress, default=0)  # data-parallel workers step together
        r["pending_startup"] += pended
        self._joules(r, seconds, released, pended, joules_now, apart)
        if stepped:
            _warmup(r, alive, seconds["unattributed"], max(progress, default=0))
        _shutdown(r, seconds, bool(progress), senders)
        self._close_role(r, senders, fact, b)

    def _split_alive(self, r: dict[str, Any], fact: RoleFact, stepped: list[SenderFact], prev: float, b: float,
                     begin: float, seconds: dict[str, float], released: dict[str, float]) -> tuple[float, float]:
        """The seconds from ``prev`` to ``b`` into ``seconds`` by cause: (the seconds alive, the
        seconds held as startup until the first step tells how much of it was compilation)."""
        alive = max(0.0, b - prev)
        pended = 0.0
        if stepped and not r["stepped"]:  # the first steps: the span before them is startup still
            stepping = fact.step_s if fact.step_s > 0 else b - max(prev, begin)
            pended += max(0.0, alive - stepping)
            alive = min(alive, max(0.0, stepping))
        if not stepped:  # held until the first step tells how much of it was the first step's compilation
            pended += seconds["startup"] + alive
            seconds["startup"] = 0.0
            return alive, pended
        for cause, share in fact.shares.items():
            seconds[cause] += alive * share
        young = any(r["senders"].get(s.key, {}).get("windows_stepped", 0) < COMPILE_WINDOWS for s in stepped)
        excess = fact.first_step_excess_s if young else 0.0
        self._lone_step(r, fact, young)
        pending, r["pending_startup"] = r["pending_startup"] + pended, 0.0
        # with step timings the long step lies in this window's stepping part; without them
        # it may lie in the held startup
        from_pending = min(excess, pending) if fact.step_s <= 0 else 0.0
        seconds["compile"] += from_pending
        seconds["startup"] += pending - from_pending
        released["compile"] = released.get("compile", 0.0) + from_pending
        released["startup"] = released.get("startup", 0.0) + pending - from_pending
        left = fact.compile_s + excess - from_pending
        for cause, amount in (("checkpoint", fact.checkpoint_s), ("compile", left)):
            _take(seconds, cause, min(amount, alive))
        r["stepped"] = True
        self._efficiency(r, fact, alive)
        return alive, 0.0

    def _close_role(self, r: dict[str, Any], senders: list[SenderFact], fact: RoleFact, b: float) -> None:
        """The role's facts as of ``b`` (its senders' last message); the longest-silent senders
        forgotten beyond ``MAX_SENDERS_PER_ROLE``."""
        stated = next((s.flops_per_token for s in senders if s.flops_per_token), None)
        if stated or self.flops_per_token:  # the trainer's statement wins over the daemon's setting
            r["flops_per_token"] = stated or self.flops_per_token
        r["gpus"] = max(r["gpus"], fact.gpus)
        r["gpu_name"] = fact.gpu_name or r["gpu_name"]
        r["observed_until"] = b
        known = r["senders"]
        if len(known) > MAX_SENDERS_PER_ROLE:
            for key in sorted(known, key=lambda k: known[k]["seen_unix_s"])[: len(known) - MAX_SENDERS_PER_ROLE]:
                del known[key]

    @staticmethod
    def _efficiency(r: dict[str, Any], fact: RoleFact, seconds: float) -> None:
        """Tokens from the trainer's ``tokens`` counter, else from the tokens/s it reports over the
        ``seconds`` accounted as stepping; its own MFU and FLOP/s per GPU over those seconds."""
        own = fact.reported
        r["tokens"] += fact.tokens if fact.tokens > 0 else own.get("tokens_per_s", 0.0) * seconds
        for meaning, key in (("mfu", "reported_mfu_s"), ("flops_per_s", "reported_flop")):
            if meaning in own:
                r[key] = r.get(key, 0.0) + own[meaning] * seconds

    @staticmethod
    def _unplaced(r: dict[str, Any]) -> None:
        """A role whose senders all went (none listed in the window, none heard for ``LIVE_S``,
        nor since this daemon began: a restarted daemon waits for them to reconnect) with time
        still held before a first step: no step ever told how much of it was startup, so it is
        ``unobserved``, with the energy held with it (never left out of the wall time)."""
        held, r["pending_startup"] = r["pending_startup"], 0.0
        RunLedger._joules(r, dict.fromkeys(CAUSES, 0.0) | {"unobserved": held}, {"unobserved": held}, 0.0, 0.0)

    @staticmethod
    def _lone_step(r: dict[str, Any], fact: RoleFact, young: bool) -> None:
        """A young sender's step alone in its window (``RoleFact.lone_step_s``) is held until the
        next window's median step tells whether it compiled: its excess is then moved from the
        time already accounted (where the long step lay) to ``compile``, like ``_take``."""
        held = float(r.pop("lone_step_s", 0.0))
        reference = fact.median_step_s or fact.lone_step_s
        if held > 0 and reference > 0 and held >= COMPILE_FACTOR * reference:
            _retell(r, "compile", held - reference)
        elif not held and young and fact.lone_step_s > 0 and fact.median_step_s <= 0:
            r["lone_step_s"] = fact.lone_step_s

    @staticmethod
    def _joules(r: dict[str, Any], seconds: dict[str, float], released: dict[str, float], pended: float,
                joules: float, apart: float = 0.0) -> None:
        """Add the window's seconds, and its GPU energy split in proportion to them: the seconds
        the window itself accounted or held take this window's joules; held seconds told now take
        the joules held with them; ``apart`` restart-gap seconds took the gap's own (none here)."""
        own = {c: max(0.0, v - released.get(c, 0.0)) for c, v in seconds.items()}
        own["restart_gap"] = max(0.0, own["restart_gap"] - apart)
        denom = sum(own.values()) + pended
        held_j = r.get("pending_j", 0.0) if released else 0.0
        if released:
            r["pending_j"] = 0.0
        told = sum(released.values())
        for cause, value in seconds.items():
            r["seconds"][cause] = r["seconds"].get(cause, 0.0) + value
            j = joules * own[cause] / denom if denom > 0 else 0.0
            j += held_j * released.get(cause, 0.0) / told if told > 0 else 0.0
            r["joules"][cause] = r["joules"].get(cause, 0.0) + j
        if denom > 0:
            r["pending_j"] = r.get("pending_j", 0.0) + joules * pended / denom

    def _bound(self) -> None:
        while len(self.runs) > MAX_RUNS:
            oldest = min(self.runs, key=lambda run: max(r["observed_until"] or 0.0 for r in self.runs[run].values()))
            del self.runs[oldest]
            self.runs_dropped += 1
        self.host_runs = {k: v for k, v in self.host_runs.items() if v in self.runs}
        self.verdicts = {k: v for k, v in self.verdicts.items() if k in self.runs}

    def view(self, state_errors: Mapping[str, int] | None = None) -> RunLedgerView:
        """The totals as exporters read them (a copy)."""
        return view_of(self.state(), self.flops_per_token, state_errors)


def view_of(state: Mapping[str, Any], flops_per_token: float | None = None,
            state_errors: Mapping[str, int] | None = None) -> RunLedgerView:
    """A ``RunLedgerView`` of ledger state (``RunLedger.state()``, or a state file read back).
    ``flops_per_token``: for roles whose state holds none (neither the trainer's hello nor the
    daemon's setting stated one while it accounted them)."""
    now = float(state.get("now_unix_s", 0.0))
    roles = []
    for run, members in state.get("runs", {}).items():
        for role, r in members.items():
            last = float(r["observed_until"] or 0.0)
            gone = not r.get("live", False)
            roles.append(RoleLedger(run, role, {c: float(r["seconds"].get(c, 0.0)) for c in CAUSES},
                                    {c: float(r["joules"].get(c, 0.0)) for c in CAUSES}, float(r["tokens"]),
                                    int(r["steps"]), int(r["gpus"]), str(r["gpu_name"]), float(r["first_unix_s"]),
                                    last, max(0.0, now - last) if gone else 0.0,
                                    r.get("flops_per_token") or flops_per_token,
                                    float(r.get("pending_startup", 0.0)), float(r.get("reported_mfu_s", 0.0)),
                                    float(r.get("reported_flop", 0.0)), dict(r.get("ends", {})),
                                    dict(r.get("gap_after", {})), _last_end(r.get("last_end"))))
    return RunLedgerView(tuple(roles), float(state.get("no_trainer_s", 0.0)), float(state.get("no_trainer_j", 0.0)),
                         int(state.get("runs_dropped", 0)), dict(state_errors or {}),
                         run_verdicts.views(run_verdicts.clean(state.get("verdicts"), state.get("runs", {}))))


def _last_end(raw: Any) -> dict[str, str]:
    """A role's last end as kept in the state file (``how``, ``cause``, ``detail``), every value a
    bounded string; empty if none (or not a mapping: a state file of an earlier version)."""
    if not isinstance(raw, Mapping):
        return {}
    return {k: str(raw.get(k, ""))[:LAST_END_DETAIL] for k in ("how", "cause", "detail")}


def _book_end(runs: Mapping[str, dict[str, dict[str, Any]]], role: str, how: str, cause: str = "",
              detail: str = "") -> None:
    """Count a sender end of ``role`` (``model.ends``) in the most recent run that has the role,
    keep it as the role's last (how, cause and detail: ``report`` shows what ended it), and give
    it the restart gap its successor opened, if that came first (else the next one)."""
    members = [m[role] for m in runs.values() if role in m]
    if not members:
        return
    r = max(members, key=lambda m: float(m["observed_until"] or 0.0))
    r.setdefault("ends", {})[how] = r.get("ends", {}).get(how, 0) + 1
    r["last_end"] = {"how": how, "cause": cause, "detail": detail[:LAST_END_DETAIL]}
    gap = r.pop("gap_waiting", None)
    if gap is None:
        r["end_waiting"] = how
    else:
        r.setdefault("gap_after", {})[how] = r.get("gap_after", {}).get(how, 0.0) + gap


def _resume(r: dict[str, Any], senders: list[SenderFact], joules: float | None) -> tuple[float, bool, float]:
    """(where the role was accounted up to, whether a sender it knows sent more (else a successor
    took over), the joules to book now: this window's ``joules`` with what was held)."""
    known = r["senders"]
    prev = r["observed_until"]
    if prev is None:  # the role's first window: from its first sender's start
        prev = _start(senders)
        r["first_unix_s"] = prev
        continuing = True
    else:  # a known one sent more
        continuing = any(s.key in known and s.end > prev for s in senders)
    total = (joules or 0.0) + r.get("carry_j", 0.0)
    r["carry_j"] = 0.0
    if continuing and "gap_j" in r:  # a known sender heard again (after a daemon restart, say):
        total += r.pop("gap_j")  # the energy held while none was heard goes with the seconds booked now
    return prev, continuing, total


def _successor(r: dict[str, Any], senders: list[SenderFact], prev: float, b: float, begin: float,
               seconds: dict[str, float], released: dict[str, float]) -> tuple[float, float]:
    """A successor's start: the gap since ``prev`` booked as ``restart_gap`` and the predecessor's
    held startup released. Returns (the successor's start, the restart-gap seconds before this
    window whose energy was held apart)."""
    r.pop("warm", None)  # it warms up anew
    r.pop("tail", None)
    known = r["senders"]
    succ = _start([s for s in senders if s.key not in known] or senders)
    succ = min(max(succ, prev), b)
    seconds["restart_gap"] += succ - prev
    _gap_after_end(r, succ - prev)
    apart = 0.0
    if "gap_j" in r:
        r["joules"]["restart_gap"] = r["joules"].get("restart_gap", 0.0) + r.pop("gap_j")
        apart = max(0.0, min(succ, begin) - prev)
    released["startup"] = r["pending_startup"]
    seconds["startup"] += r["pending_startup"]
    r["pending_startup"] = 0.0
    return succ, apart


def _advance_senders(senders: list[SenderFact], known: dict[str, dict[str, Any]]) -> list[int]:
    """Each sender's steps since the last window (those that advanced), its record in ``known``
    brought up to date."""
    progress = []
    for s in senders:
        k = known.setdefault(s.key, {"windows_stepped": 0, "step": None, "seen_unix_s": s.end})
        advanced = _advance(s, k)
        if advanced > 0:
            progress.append(advanced)
        k["seen_unix_s"] = max(k["seen_unix_s"], s.end)
    return progress


def _gap_after_end(r: dict[str, Any], gap_s: float) -> None:
    """Book a restart gap under the end that opened it (``gap_after``): the end told before its
    successor came, or the next one told (the daemon tells an end ``sender_gone_after`` after it)."""
    how = r.pop("end_waiting", None)
    if how is None:
        r["gap_waiting"] = gap_s
    else:
        r.setdefault("gap_after", {})[how] = r.get("gap_after", {}).get(how, 0.0) + gap_s


def _start(senders: list[SenderFact]) -> float:
    """When the first of ``senders`` started (its hello), else its first moment in a window."""
    return min((s.started_unix_s for s in senders if s.started_unix_s > 0), default=min(s.begin for s in senders))


def _new_role(senders: list[SenderFact]) -> dict[str, Any]:
    return {"seconds": {}, "joules": {}, "tokens": 0.0, "steps": 0, "gpus": 0, "gpu_name": "", "senders": {},
            "first_unix_s": min(s.begin for s in senders), "observed_until": None, "stepped": False,
            "pending_startup": 0.0}


def _advance(s: SenderFact, k: dict[str, Any]) -> int:
    """Steps sender ``s`` advanced this window, its memory ``k`` updated. Its step number wins:
    its rise since the previous window, and in its first window with one, the steps from the
    first number the daemon had from it, that one included (``publish(step)`` says step ``step``
    is done); without step numbers, its ``cycles``."""
    n = 0
    if s.step is not None:
        if k["step"] is not None:
            n = max(0, s.step - k["step"])
        elif not k["windows_stepped"]:
            first = s.first_step if s.first_step is not None and s.first_step <= s.step else s.step
            n = s.step - first + 1
        else:  # counted by cycles so far: its step numbers count from this one on
            n = s.cycles or 0
        k["step"] = s.step
    elif s.cycles and k["step"] is None:  # a sender with step numbers counts them when the next one comes
        n = s.cycles
    if s.step is not None or s.cycles or k["windows_stepped"]:
        k["windows_stepped"] += 1
    return n


def _retell(r: dict[str, Any], cause: str, amount: float, sources: tuple[str, ...] = TAKE_ORDER) -> None:
    """Move ``amount`` seconds already in role ``r``'s totals to ``cause`` from ``sources``, in
    order (as far as they hold it), each with its share of the joules they took (the sums are kept)."""
    seconds, joules = r["seconds"], r["joules"]
    for source in sources:
        if amount <= 0:
            return
        have = seconds.get(source, 0.0)
        moved = min(amount, have)
        if moved <= 0:
            continue
        j = joules.get(source, 0.0) * moved / have
        seconds[source] = have - moved
        joules[source] = joules.get(source, 0.0) - j
        seconds[cause] = seconds.get(cause, 0.0) + moved
        joules[cause] = joules.get(cause, 0.0) + j
        amount -= moved


def _warmup(r: dict[str, Any], alive_s: float, unattributed_s: float, steps: int) -> None:
    """Fold one stepping window into the role's warm-up watch (``r["warm"]``; docs/METRICS.md, Run
    ledger): its alive and ``unattributed`` seconds, and the steps it progressed, gathered into
    stretches that each end at a window with progress (the first stepping window is a stretch of
    its own: how many steps it holds is not told). Once two consecutive stretches take per step
    within ``WARMUP_SETTLE`` of each other the step time has settled: the ``unattributed`` seconds
    of every stretch before them beyond those two stretches' ``unattributed`` share are retold
    as ``warmup``. Never settled within ``WARMUP_MAX_STRETCHES``: nothing is retold."""
    warm = r.setdefault("warm", {"stretches": [], "open": [0.0, 0.0], "done": False})
    if warm["done"]:
        return
    stretches = warm["stretches"]
    if not stretches:
        stretches.append([alive_s, unattributed_s, 0])
        return
    warm["open"] = [warm["open"][0] + alive_s, warm["open"][1] + unattributed_s]
    if steps <= 0:
        return
    stretches.append([*warm["open"], steps])
    warm["open"] = [0.0, 0.0]
    (a1, u1, n1), (a2, u2, n2) = stretches[-2:]
    if n1 > 0 and max(a1 / n1, a2 / n2) <= WARMUP_SETTLE * min(a1 / n1, a2 / n2):
        share = (u1 + u2) / (a1 + a2) if a1 + a2 > 0 else 0.0
        _retell(r, "warmup", sum(max(0.0, u - a * share) for a, u, _ in stretches[:-2]), ("unattributed",))
        warm.update(done=True, stretches=[])
    elif len(stretches) >= WARMUP_MAX_STRETCHES:
        warm.update(done=True, stretches=[])


def _shutdown(r: dict[str, Any], seconds: Mapping[str, float], progressed: bool,
              senders: list[SenderFact]) -> None:
    """Keep the seconds the role's windows told by their shares since its last window with step
    progress (``r["tail"]``); when its senders' window ends with a clean end (one closed, none
    alive), retell them as ``shutdown``: the time from its last step to its exit."""
    tail: dict[str, float] = r.setdefault("tail", {})
    if progressed:
        tail.clear()
    elif r["stepped"]:
        for cause in SHUTDOWN_FROM:
            if seconds.get(cause, 0.0) > 0:
                tail[cause] = tail.get(cause, 0.0) + seconds[cause]
    if tail and any(s.closed for s in senders) and not any(s.alive for s in senders):
        for cause, amount in tail.items():
            _retell(r, "shutdown", amount, (cause,))
        tail.clear()


def _take(seconds: dict[str, float], cause: str, amount: float) -> None:
    """Move ``amount`` seconds to ``cause`` from the others in ``TAKE_ORDER`` (the sum is kept)."""
    for source in TAKE_ORDER:
        if amount <= 0:
            return
        moved = min(amount, seconds[source])
        seconds[source] -= moved
        seconds[cause] += moved
        amount -= moved
