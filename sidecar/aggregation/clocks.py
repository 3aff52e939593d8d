"""What a name could not decide, decided by its numbers: a clock, a time of many steps or a running total
read as a phase.

A bare ``time`` (``train/time``, ``Time``, ``time/time``) is the step's duration in some loggers
(mmengine, detectron2) and the seconds since the start in others (Lightning's, k-diffusion's,
Spinning Up's), and the name alone cannot tell: the reader reads it as the step at a lowered
certainty. Its numbers can. A step's duration stays near one value while the run goes on; the
seconds since the start climb with the wall clock.

``Clocks.settle`` watches every timing read as the step with a certainty below 1. It is a clock
once its window mean has risen, ``CLIMBS`` windows with data in a row, by between ``1 / SLACK`` and
``SLACK`` times the wall time since the window before (a logger that writes every minute climbs by
a minute a minute), and stands at no less than ``1 / SLACK`` of the time it has been watched: from
then on it is no phase of the step (``outside``, its ``rule`` says why, for ``explain`` and the
verdict's detail), for as long as the daemon keeps the series. A step that slows (a leak, a
growing sequence length) grows by milliseconds a window, not by the window's seconds, and a
step's duration does not keep pace with the time it has been watched. A clock that falls back (a
resumed run's clock restarting) is watched afresh from the fall.

A time of many steps read as the step (an epoch's ``train_time``, a run's ``Train/Time`` logged
at its end) does not climb window by window: it is logged once in many steps and stands at about
the wall time since its last record. Every logged step moves the trainer's step axis
(``StepAxes.moves``). A window holding one record of the series, at least ``SPAN_MOVES`` moves of
every sender of its worker after its last record (or after the worker was first seen), that stands
at no less than ``1 / SLACK`` of the wall time since then, spans those steps; ``SPANS_IN_A_ROW`` such
records in a row and the series is no phase of the step from then on, its ``rule`` says so. A
step's time logged every step or every tenth is logged with a few moves between its records; one
logged every hundredth step stands at a hundredth of the time between its records, but once (a
step that held a checkpoint or an evaluation), never twice in a row. A series whose every record
so far spanned (its first among them: an epoch's first end) is no phase in the windows of those
records already; a step's time logged rarely has a record that spanned nothing before its long
one, and keeps it.

A running total read as a phase (``time/dataloader`` summing every batch's load since the start; a
count of steps under ``time/``) is no duration of one step either, whatever its name says: a
step's phase cannot take longer than the wall time between the windows its records come in. Every
timing whose phase was read from its name (or is uncertain) is watched: once its window mean has
risen, ``CLIMBS`` windows with data in a row, each time standing above ``SLACK`` times the wall
time since the window before (times the senders of its worker), its median above the last window's
largest record, its rise per second within ``SLACK`` of the last window's, it is no phase of the
step from then on (its ``rule`` says so). A total climbs at its phase's share of the wall time, and
every record of it stands above the ones before. A phase timed by parallel threads of one process,
or by processes under one label, can stand above the wall time, but climbs by chance, unevenly,
its records mixed; a step longer than a window stands at about the time between its records.

What it cannot see: a clock the reader took in another unit than its own (seconds sent as a
``timing()`` record, which the protocol reads in milliseconds; minutes read as seconds) climbs at
another pace than the wall clock's and stays the step; a clock logged once every few minutes needs
``CLIMBS`` of its records, so as many intervals, to be known. A time of many steps is known for good
at its second record (two epochs); a step's time logged rarely whose first logged step held a long
stall (a checkpoint) is left out of that one window; a time of fewer than ``SPAN_MOVES`` logged
steps (a small epoch), or whose worker has a sender that logs no more often than it (per-epoch
metrics sent apart), stays the step. A step a window long or more, logged with 50 or more moves of
its step axis each (``wandb.log`` without ``step=`` for every micro-batch or every metric), reads as
a time of many steps: the numbers of the two are the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace

from sidecar.model.mapped import READ
from sidecar.model.meanings import OVERLAP_OF, PHASES
from sidecar.model.window import TIMING, SeriesView

CLIMBS = 5
"""Windows with data in a row whose mean climbed with the wall clock before a series is a clock: a
minute with 10-second windows. Steps of random duration over 10-second windows, 2,000 runs of 60
windows each: 5 to 30 s steps made no false clock (with three climbs, 105; four, none), 10 to 60 s
steps one, 1 to 100 s steps three (``tests/test_clocks.py`` keeps a sample of the first)."""
SLACK = 2.0
"""How far a climb may stray from the wall time between its windows (a factor either way)."""
SPAN_MOVES = 50
"""Moves of the step axis, by every sender of the worker, between two records of a series that
spans them: an epoch is hundreds of steps. A step's time is logged with one move between its
records, or a few (wandb.log called a few times a step moves the axis each time; every tenth step;
gradient accumulation logged per micro-batch), and with a step's time, not the time since its last
record; a sender that publishes its own steps beside it (an actor's episodes under the learner's
labels) counts only where it is the slowest."""
SPANS_IN_A_ROW = 2
"""Records in a row that span ``SPAN_MOVES`` steps before a series is a time of many steps: a
step's time logged rarely that once held a checkpoint's minutes is no epoch."""


@dataclass(slots=True)
class _Since:
    """Where an uncertain step timing's last record left its worker's step axes."""

    at_s: float
    """Monotonic seconds of the window its last record was in (or the worker was first seen in)."""
    moves: dict[int, int]
    """Sender -> its step axis's moves so far, then."""
    spans: int = 0
    """Its records in a row so far that spanned ``SPAN_MOVES`` steps."""
    always: bool = True
    """Whether every record of it so far spanned ``SPAN_MOVES`` steps."""

    def spanned(self, count: float, median_s: float, now_s: float, moves: dict[int, int]) -> tuple[bool, bool]:
        """Take a window ending at ``now_s`` with ``count`` records of the series (median
        ``median_s``) and its worker's ``moves``; (whether the series now reads as a time of many
        steps for good, whether this window's record does: the module's rule)."""
        common = moves.keys() & self.moves.keys()
        moved = min((moves[s] - self.moves[s] for s in common), default=0)
        one = count == 1 and moved >= SPAN_MOVES and median_s >= (now_s - self.at_s) / SLACK
        self.spans = self.spans + 1 if one else 0
        self.always = self.always and one
        self.at_s, self.moves = now_s, moves
        return self.spans >= SPANS_IN_A_ROW, self.always


@dataclass(slots=True)
class _Watch:
    """One uncertain step timing's numbers so far (seconds, monotonic)."""

    first_s: float
    at_s: float
    mean_s: float
    climbs: int = 0

    def climbed(self, mean_s: float, now_s: float) -> bool:
        """Take the window ending at ``now_s`` whose mean is ``mean_s``; whether the series now
        reads as a clock (the module's rule)."""
        rise, between = mean_s - self.mean_s, now_s - self.at_s
        if mean_s < self.mean_s / SLACK:
            self.first_s = now_s  # fell back: a clock restarted (a resumed run) is watched from here
        self.climbs = self.climbs + 1 if between > 0 and between / SLACK <= rise <= between * SLACK else 0
        self.at_s, self.mean_s = now_s, mean_s
        return self.climbs >= CLIMBS and mean_s >= (now_s - self.first_s) / SLACK


@dataclass(slots=True)
class _Total:
    """One phase timing read from its name: its last window with data (monotonic seconds; its mean
    and its largest record, seconds; its rise per wall second) and its windows in a row so far that
    climbed like a running total."""

    at_s: float
    mean_s: float
    max_s: float
    rate: float = 0.0
    climbs: int = 0

    def summed(self, window: Mapping[str, float], now_s: float, senders: int) -> bool:
        """Take the window ending at ``now_s`` (its ``mean``, ``p50`` and ``max``, milliseconds) of
        a worker with ``senders`` senders; whether the series now reads as a running total (the
        module's rule)."""
        mean_s = window["mean"] / 1000.0
        between = now_s - self.at_s
        rate = (mean_s - self.mean_s) / between if between > 0 else 0.0
        steady = self.rate <= 0.0 or self.rate / SLACK <= rate <= self.rate * SLACK
        above = window.get("p50", window["mean"]) / 1000.0 > self.max_s
        running = rate > 0.0 and steady and above and mean_s > SLACK * between * max(1, senders)
        self.climbs = self.climbs + 1 if running else 0
        self.at_s, self.mean_s, self.rate = now_s, mean_s, rate
        self.max_s = window.get("max", window["mean"]) / 1000.0
        return self.climbs >= CLIMBS


WATCHED = (*PHASES, "step", *OVERLAP_OF)
"""The meanings whose timings, read from their names, are watched for running totals."""
Key = tuple[str, str, str]
"""A series' (role, worker, name)."""
Place = tuple[str, str]
"""A worker's (role, worker)."""


class Clocks:
    """The timings watched (phases read from their names, uncertain steps), and those found to be
    no phase. Not thread-safe: the aggregator's owner calls it once per window. It holds an entry
    per such series the window still keeps (bounded by the aggregator's series budget) and per
    worker with a step."""

    def __init__(self) -> None:
        self._watched: dict[Key, _Watch] = {}
        self._since: dict[Key, _Since] = {}
        self._first: dict[Place, tuple[float, dict[int, int]]] = {}
        """Each worker's step axes when first seen: where a series' first record is measured from."""
        self._totals: dict[Key, _Total] = {}
        self._known: dict[Key, str] = {}
        """The series found to be no phase, with why."""

    def settle(self, series: tuple[SeriesView, ...], now_s: float,
               moves: Mapping[Place, dict[int, int]] | None = None) -> tuple[SeriesView, ...]:
        """``series`` with the running totals among its phases read from names, and the clocks
        and the times of many steps among its uncertain steps, read as no phase; ``now_s``: the
        window's end (monotonic seconds); ``moves``: (role, worker) -> its senders' step axes'
        moves so far (``StepAxes.moves``). The same sequence where nothing is questioned."""
        moves = moves or {}
        for place, at in moves.items():
            self._first.setdefault(place, (now_s, at))
        out: list[SeriesView] | None = None
        kept: set[Key] = set()
        for i, v in enumerate(series):
            if v.kind != TIMING or v.meaning not in WATCHED or (v.certainty >= 1.0 and READ not in v.rule):
                continue
            key = (v.role, v.worker, v.name)
            kept.add(key)
            why, lasting = (self._known[key], True) if key in self._known else \
                self._why(key, v, now_s, moves.get((v.role, v.worker)))
            if why:
                if lasting:
                    self._known[key] = why
                out = list(series) if out is None else out
                out[i] = replace(v, meaning="", outside=True, rule=f"{v.rule}; {why}, no phase of the step")
        self._prune(kept, moves.keys())
        return series if out is None else tuple(out)

    def _why(self, key: Key, v: SeriesView, now_s: float, moves: dict[int, int] | None) -> tuple[str, bool]:
        """Why ``v``'s window makes it no step (the module's rules), or "", and whether for good."""
        if v.window is None:
            return "", False
        uncertain_step = v.meaning == "step" and v.certainty < 1.0
        if uncertain_step and moves is not None:
            since = self._since.get(key)
            if since is None:
                at_s, first = self._first.get((v.role, v.worker), (now_s, moves))
                since = self._since[key] = _Since(at_s, first)
            median_s = v.window.get("p50", v.window["mean"]) / 1000.0
            lasting, always = since.spanned(v.window["count"], median_s, now_s, moves)
            if lasting or always:
                span = f"logged once in {SPAN_MOVES} or more of its worker's steps at the time since its record before"
                return ((f"{span}, {SPANS_IN_A_ROW} records in a row: a time of many steps", True) if lasting else
                        (f"{span}, as every record of it so far: a time of many steps in this window", False))
        clock = uncertain_step and self._see(key, v.window["mean"] / 1000.0, now_s)
        total = self._summed(key, v.window, now_s, len(moves or ()))
        if clock:
            return "its numbers climb with the wall clock: seconds since the start", True
        if total:
            return (f"it climbs, above {SLACK:g} times the wall time between its windows, {CLIMBS} windows in a row: "
                    "a running total", True)
        return "", False

    def _summed(self, key: Key, window: Mapping[str, float], now_s: float, senders: int) -> bool:
        """Whether a ``window`` of the series ``key`` with data, its worker's ``senders`` senders,
        makes it a running total."""
        total = self._totals.get(key)
        if total is None:
            mean_s = window["mean"] / 1000.0
            self._totals[key] = _Total(now_s, mean_s, window.get("max", window["mean"]) / 1000.0)
            return False
        return total.summed(window, now_s, senders)

    def _prune(self, kept: set[Key], places: AbstractSet[Place]) -> None:
        """Forget the series the window no longer keeps and the workers with no step left."""
        if (self._watched.keys() - kept or self._since.keys() - kept or self._known.keys() - kept
                or self._totals.keys() - kept):
            self._watched = {k: w for k, w in self._watched.items() if k in kept}
            self._totals = {k: t for k, t in self._totals.items() if k in kept}
            self._since = {k: w for k, w in self._since.items() if k in kept}
            self._known = {k: why for k, why in self._known.items() if k in kept}
        if self._first.keys() - places:
            self._first = {p: f for p, f in self._first.items() if p in places}

    def _see(self, key: Key, mean_s: float, now_s: float) -> bool:
        """Whether a window of the series ``key`` with data, mean ``mean_s`` (seconds), makes it a clock."""
        watch = self._watched.get(key)
        if watch is None:
            self._watched[key] = _Watch(now_s, now_s, mean_s)
            return False
        if not watch.climbed(mean_s, now_s):
            return False
        del self._watched[key]
        return True
