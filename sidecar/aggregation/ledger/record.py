"""The run ledger's record: what it keeps per run and role, typed, and the state file's JSON.

``RoleRecord`` is one role of one run (its totals by cause, its senders, and what it holds until
a later window tells where it goes); ``LedgerRecord`` is every run with the daemon's own totals.
Each has ``to_json`` / ``from_json``: the state file's shape, version ``STATE_VERSION``
(``sidecar.core.ledger_state`` writes and reads the file; ``state_problem`` is its version rule).
``from_json`` reads what an earlier daemon of the same version wrote: a field it lacks takes its
default; a value of the wrong kind raises ``TypeError`` (the file is then not a ledger's).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from sidecar.aggregation import run_verdicts

STATE_VERSION = 1
"""The state file's version: a file of a newer one is not read (``state_problem``)."""
LAST_END_DETAIL = 160
"""Characters of a role's last end's detail kept in the state file, at most."""

Json = dict[str, object]
"""A JSON object as ``json`` writes and reads it."""


@dataclass(slots=True)
class SenderMemory:
    """One sender process of a role as the ledger remembers it: ``seen_unix_s`` its last message
    (unix seconds), ``windows_stepped`` the windows in which it told steps, ``step`` its last step
    number (None: none yet)."""

    seen_unix_s: float
    windows_stepped: int = 0
    step: int | None = None

    def to_json(self) -> Json:
        return {"windows_stepped": self.windows_stepped, "step": self.step, "seen_unix_s": self.seen_unix_s}

    @classmethod
    def from_json(cls, raw: object) -> SenderMemory:
        m = _mapping(raw)
        step = m.get("step")
        return cls(_number(m.get("seen_unix_s")), _count(m.get("windows_stepped")),
                   None if step is None else _count(step))


@dataclass(slots=True)
class WarmWatch:
    """A role's warm-up watch (``retell.warmup``): ``stretches`` of its stepping windows, each
    (alive seconds, ``unattributed`` seconds, steps); ``open`` the (alive, unattributed) seconds
    of the stretch not yet closed by a window with progress; ``done`` once settled or given up."""

    stretches: list[tuple[float, float, int]] = field(default_factory=list)
    open: tuple[float, float] = (0.0, 0.0)
    done: bool = False

    def to_json(self) -> Json:
        return {"stretches": [list(s) for s in self.stretches], "open": list(self.open), "done": self.done}

    @classmethod
    def from_json(cls, raw: object) -> WarmWatch:
        m = _mapping(raw)
        stretches = []
        for item in _list(m.get("stretches")):
            alive, unattributed, steps = _list(item)
            stretches.append((_number(alive), _number(unattributed), _count(steps)))
        opened = m.get("open")
        alive, unattributed = _list(opened) if opened is not None else (0.0, 0.0)
        return cls(stretches, (_number(alive), _number(unattributed)), bool(m.get("done", False)))


@dataclass(frozen=True, slots=True)
class LastEnd:
    """A role's last sender end (``model.ends``): how, its cause and detail (possibly empty)."""

    how: str
    cause: str = ""
    detail: str = ""

    def to_json(self) -> Json:
        return {"how": self.how, "cause": self.cause, "detail": self.detail}

    def told(self) -> dict[str, str]:
        """As ``model.ledger.RoleLedger.last_end`` holds it: every value at most ``LAST_END_DETAIL`` long."""
        return {k: v[:LAST_END_DETAIL] for k, v in self.to_json().items() if isinstance(v, str)}

    @classmethod
    def from_json(cls, raw: object) -> LastEnd | None:
        """None unless ``raw`` is a mapping (a state file of an earlier version kept none)."""
        if not isinstance(raw, Mapping):
            return None
        return cls(*(str(raw.get(k, "")) for k in ("how", "cause", "detail")))


@dataclass(slots=True)
class RoleRecord:
    """One role of one run: its totals since its first sender started, and what it holds.

    ``seconds``/``joules``: cause (``model.ledger.CAUSES``) -> total; ``observed_until``: its
    senders' last message accounted (unix seconds; None before its first window); ``stepped``:
    a step was told; ``pending_startup``: seconds held until its first step tells how much was
    compilation, with ``pending_j`` the joules held with them; ``carry_j``: joules of a window
    whose senders sent nothing new, for the next seconds told; ``gap_j``: joules while none of
    its senders was there (None: none held; a successor tells them as ``restart_gap``)."""

    first_unix_s: float
    seconds: dict[str, float] = field(default_factory=dict)
    joules: dict[str, float] = field(default_factory=dict)
    tokens: float = 0.0
    steps: int = 0
    gpus: int = 0
    gpu_name: str = ""
    senders: dict[str, SenderMemory] = field(default_factory=dict)
    """Its sender processes by key (``facts.sender_key``), at most ``fold.MAX_SENDERS_PER_ROLE``."""
    observed_until: float | None = None
    stepped: bool = False
    pending_startup: float = 0.0
    sending: bool = False
    """A sender of it was sending at the last window's end (``model.liveness.SENDING_S``; the state
    file's key ``live``, as earlier daemons wrote it)."""
    flops_per_token: float | None = None
    reported_mfu_s: float = 0.0
    reported_flop: float = 0.0
    ends: dict[str, int] = field(default_factory=dict)
    gap_after: dict[str, float] = field(default_factory=dict)
    last_end: LastEnd | None = None
    end_waiting: str | None = None
    """An end told while no successor came yet: the next restart gap is booked under it."""
    gap_waiting: float | None = None
    """A restart gap booked before the end that opened it was told."""
    gap_j: float | None = None
    carry_j: float = 0.0
    pending_j: float = 0.0
    lone_step_s: float = 0.0
    """A young sender's lone step held until the next window tells whether it compiled (0: none)."""
    warm: WarmWatch | None = None
    tail: dict[str, float] = field(default_factory=dict)
    """Seconds told by the windows' shares since the last window with step progress (``retell.shutdown``)."""

    @property
    def until(self) -> float:
        """``observed_until``, 0 before the role's first window."""
        return self.observed_until or 0.0

    def to_json(self) -> Json:
        out: Json = {
            "seconds": dict(self.seconds), "joules": dict(self.joules), "tokens": self.tokens, "steps": self.steps,
            "gpus": self.gpus, "gpu_name": self.gpu_name,
            "senders": {k: m.to_json() for k, m in self.senders.items()}, "first_unix_s": self.first_unix_s,
            "observed_until": self.observed_until, "stepped": self.stepped, "pending_startup": self.pending_startup,
            "live": self.sending, "reported_mfu_s": self.reported_mfu_s, "reported_flop": self.reported_flop,
            "ends": dict(self.ends), "gap_after": dict(self.gap_after), "carry_j": self.carry_j,
            "pending_j": self.pending_j, "lone_step_s": self.lone_step_s, "tail": dict(self.tail)}
        optional = {"flops_per_token": self.flops_per_token, "end_waiting": self.end_waiting,
                    "gap_waiting": self.gap_waiting, "gap_j": self.gap_j,
                    "last_end": self.last_end.to_json() if self.last_end is not None else None,
                    "warm": self.warm.to_json() if self.warm is not None else None}
        return out | {k: v for k, v in optional.items() if v is not None}  # absent, as an earlier daemon reads it

    @classmethod
    def from_json(cls, raw: object) -> RoleRecord:
        m = _mapping(raw)
        until, warm, waiting = m.get("observed_until"), m.get("warm"), m.get("end_waiting")
        return cls(
            _number(m.get("first_unix_s")), _numbers(m.get("seconds")), _numbers(m.get("joules")),
            _number(m.get("tokens")), _count(m.get("steps")), _count(m.get("gpus")), str(m.get("gpu_name", "")),
            {str(k): SenderMemory.from_json(v) for k, v in _mapping(m.get("senders", {})).items()},
            None if until is None else _number(until), bool(m.get("stepped", False)),
            _number(m.get("pending_startup")), bool(m.get("live", False)), _optional(m.get("flops_per_token")),
            _number(m.get("reported_mfu_s")), _number(m.get("reported_flop")),
            {str(k): _count(v) for k, v in _mapping(m.get("ends", {})).items()}, _numbers(m.get("gap_after")),
            LastEnd.from_json(m.get("last_end")), None if waiting is None else str(waiting),
            _optional(m.get("gap_waiting")), _optional(m.get("gap_j")), _number(m.get("carry_j")),
            _number(m.get("pending_j")), _number(m.get("lone_step_s")),
            None if warm is None else WarmWatch.from_json(warm), _numbers(m.get("tail")))


@dataclass(slots=True)
class LedgerRecord:
    """Everything the run ledger keeps across daemon restarts.

    ``runs``: run -> role -> its record; ``host_runs``: ``host:<name>`` -> the run its senders now
    go to; ``no_trainer_s``/``no_trainer_j``: the daemon's time with no live sender and the GPU
    energy meanwhile; ``energy_prev``: GPU uuid -> its energy counter at the last window
    (joules); ``now_unix_s``: the last window's end; ``trainer_until``: the newest sender
    message folded in; ``idle_until``: no-trainer time accounted up to here (0 while a sender is
    alive); ``verdicts``: each run's verdicts (``sidecar.aggregation.run_verdicts``)."""

    runs: dict[str, dict[str, RoleRecord]] = field(default_factory=dict)
    host_runs: dict[str, str] = field(default_factory=dict)
    no_trainer_s: float = 0.0
    no_trainer_j: float = 0.0
    runs_dropped: int = 0
    energy_prev: dict[str, float] = field(default_factory=dict)
    now_unix_s: float = 0.0
    trainer_until: float = 0.0
    idle_until: float = 0.0
    verdicts: run_verdicts.Verdicts = field(default_factory=dict)

    def to_json(self) -> Json:
        """The state file's content (with its ``version``)."""
        return {"version": STATE_VERSION,
                "runs": {run: {role: r.to_json() for role, r in members.items()} for run, members in self.runs.items()},
                "no_trainer_s": self.no_trainer_s, "no_trainer_j": self.no_trainer_j,
                "runs_dropped": self.runs_dropped, "energy_prev": dict(self.energy_prev),
                "now_unix_s": self.now_unix_s, "trainer_until": self.trainer_until, "idle_until": self.idle_until,
                "host_runs": dict(self.host_runs), "verdicts": run_verdicts.to_json(self.verdicts)}

    @classmethod
    def from_json(cls, state: Mapping[str, object] | None) -> LedgerRecord:
        """The record of a state file's content (None: an empty one). Its version is the
        caller's to check (``state_problem``); a malformed verdict is dropped alone."""
        s = state or {}
        runs = {str(run): {str(role): RoleRecord.from_json(r) for role, r in _mapping(members).items()}
                for run, members in _mapping(s.get("runs", {})).items()}
        host_runs = {k: v for k, v in _mapping(s.get("host_runs", {})).items()
                     if isinstance(k, str) and isinstance(v, str)}
        return cls(runs, host_runs, _number(s.get("no_trainer_s")), _number(s.get("no_trainer_j")),
                   _count(s.get("runs_dropped")), _numbers(s.get("energy_prev")), _number(s.get("now_unix_s")),
                   _number(s.get("trainer_until")), _number(s.get("idle_until")),
                   run_verdicts.clean(s.get("verdicts"), runs))


def state_problem(state: object) -> tuple[str, str] | None:
    """The version rule: why a state file's content cannot be read (``corrupt`` or
    ``newer_version``, with a detail for the log), None when this daemon reads it. Not an
    integer ``version`` or not the shape ``LedgerRecord.from_json`` reads: corrupt; a version
    above ``STATE_VERSION``: newer (a downgraded daemon never overwrites what a newer one wrote)."""
    version = state.get("version") if isinstance(state, dict) else None
    if not isinstance(version, int) or not isinstance(state, dict) or not _well_formed(state):
        return "corrupt", "not a run ledger state"
    if version > STATE_VERSION:
        return "newer_version", f"version {version}, this daemon reads up to {STATE_VERSION}"
    return None


def _well_formed(state: Mapping[str, object]) -> bool:
    """runs -> roles -> records with senders, and finite numbers in their totals."""
    runs = state.get("runs", {})
    if not isinstance(runs, dict):
        return False
    for roles in runs.values():
        if not isinstance(roles, dict):
            return False
        for r in roles.values():
            if not isinstance(r, dict) or not isinstance(r.get("senders"), dict):
                return False
            seconds, joules = r.get("seconds", {}), r.get("joules", {})
            if not isinstance(seconds, dict) or not isinstance(joules, dict):
                return False
            numbers = [*seconds.values(), *joules.values(), r.get("tokens"), r.get("steps")]
            if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in numbers):
                return False
    return True


def _mapping(raw: object) -> Mapping[object, object]:
    if not isinstance(raw, Mapping):
        raise TypeError(f"a mapping expected in the run ledger state, not {type(raw).__name__}")
    return raw


def _list(raw: object) -> list[object]:
    if not isinstance(raw, list):
        raise TypeError(f"a list expected in the run ledger state, not {type(raw).__name__}")
    return raw


def _number(raw: object, default: float = 0.0) -> float:
    """A number of the state (absent: ``default``)."""
    if raw is None:
        return default
    if not isinstance(raw, (int, float)):
        raise TypeError(f"a number expected in the run ledger state, not {type(raw).__name__}")
    return float(raw)


def _optional(raw: object) -> float | None:
    return None if raw is None else _number(raw)


def _count(raw: object) -> int:
    """A whole number of the state (absent: 0)."""
    if raw is None:
        return 0
    if not isinstance(raw, (int, float)):
        raise TypeError(f"a count expected in the run ledger state, not {type(raw).__name__}")
    return int(raw)


def _numbers(raw: object) -> dict[str, float]:
    """A mapping of names to numbers (absent: empty)."""
    return {str(k): _number(v) for k, v in _mapping(raw if raw is not None else {}).items()}
