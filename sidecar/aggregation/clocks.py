"""What a name could not decide, decided by its numbers: a clock or a time of many steps read as the step.

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
at its end) does not climb window by window: it stands far above the trainer's own pace. Every
logged step moves the trainer's step axis; a step's duration, logged every step or every tenth,
is at most about the wall time between those moves. A window whose median stands ``SPANS`` times
or more above the mean time between the moves of its worker's step axis (``StepAxes.between_s``,
once the axis has moved ``STRIDE_CHANGES`` times over ``PACE_AFTER_S``) spans many steps: no phase
of the step from then on, its ``rule`` says so.

What it cannot see: a clock the reader took in another unit than its own (seconds sent as a
``timing()`` record, which the protocol reads in milliseconds; minutes read as seconds) climbs at
another pace than the wall clock's and stays the step; a clock logged once every few minutes
needs ``CLIMBS`` of its records, so as many intervals, to be known. A time of many steps logged
before the trainer's pace is known (its first minute) is read as the step in that window; one
whose trainer logs nothing more often than it (an epoch's time beside per-epoch metrics only) is
at the trainer's pace, and stays the step: then the trainer's steps are its epochs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from sidecar.model.window import TIMING, SeriesView

CLIMBS = 5
"""Windows with data in a row whose mean climbed with the wall clock before a series is a clock: a
minute with 10-second windows. Steps of random duration over 10-second windows, 2,000 runs of 60
windows each: 5 to 30 s steps made no false clock (with three climbs, 105; four, none), 10 to 60 s
steps one, 1 to 100 s steps three (``tests/test_clocks.py`` keeps a sample of the first)."""
SLACK = 2.0
"""How far a climb may stray from the wall time between its windows (a factor either way)."""
SPANS = 10.0
"""How many times the wall time between the trainer's logged steps a window's median must stand
before a step timing spans many steps. A step's timer stands at most about once that time (twice or
three times where several loggers move one axis with their own step values); an epoch spans
hundreds of steps. Gradient accumulation logged per micro-batch with the optimizer step's time
stands at the accumulation factor: below ten, it stays the step."""


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


class Clocks:
    """The uncertain step timings watched, and those found to be no step. Not thread-safe: the
    aggregator's owner calls it once per window. It holds an entry per uncertain step series the
    window still keeps (bounded by the aggregator's series budget)."""

    def __init__(self) -> None:
        self._watched: dict[tuple[str, str, str], _Watch] = {}
        self._known: dict[tuple[str, str, str], str] = {}
        """The series found to be no step, with why."""

    def settle(self, series: tuple[SeriesView, ...], now_s: float,
               between_s: Mapping[tuple[str, str], float] | None = None) -> tuple[SeriesView, ...]:
        """``series`` with the clocks and the times of many steps among its uncertain steps read as
        no phase; ``now_s``: the window's end (monotonic seconds); ``between_s``: (role, worker) ->
        the mean wall time between its step axis's moves (seconds), where known. The same
        sequence where nothing is uncertain."""
        out: list[SeriesView] | None = None
        kept: set[tuple[str, str, str]] = set()
        for i, v in enumerate(series):
            if v.kind != TIMING or v.meaning != "step" or v.certainty >= 1.0:
                continue
            key = (v.role, v.worker, v.name)
            kept.add(key)
            why = self._known.get(key) or self._spans(key, v, (between_s or {}).get((v.role, v.worker)))
            if not why and self._see(key, v, now_s):
                why = self._known[key] = "its numbers climb with the wall clock: seconds since the start"
            if why:
                out = list(series) if out is None else out
                out[i] = replace(v, meaning="", outside=True, rule=f"{v.rule}; {why}, no phase of the step")
        if self._watched.keys() - kept or self._known.keys() - kept:
            self._watched = {k: w for k, w in self._watched.items() if k in kept}
            self._known = {k: why for k, why in self._known.items() if k in kept}
        return series if out is None else tuple(out)

    def _spans(self, key: tuple[str, str, str], v: SeriesView, between_s: float | None) -> str:
        """Why ``v``'s window spans many steps (remembered from then on), or ""."""
        if v.window is None or not between_s or between_s <= 0:
            return ""
        median_s = v.window.get("p50", v.window["mean"]) / 1000.0
        if median_s < SPANS * between_s:
            return ""
        self._watched.pop(key, None)
        why = self._known[key] = (f"it stands at {median_s:.3g} s, {median_s / between_s:.0f} times the "
                                  f"{between_s:.3g} s between the trainer's logged steps: a time of many steps")
        return why

    def _see(self, key: tuple[str, str, str], v: SeriesView, now_s: float) -> bool:
        """Whether ``v``'s window makes it a clock (the caller remembers it)."""
        if v.window is None:
            return False
        mean_s = v.window["mean"] / 1000.0
        watch = self._watched.get(key)
        if watch is None:
            self._watched[key] = _Watch(now_s, now_s, mean_s)
            return False
        if not watch.climbed(mean_s, now_s):
            return False
        del self._watched[key]
        return True
