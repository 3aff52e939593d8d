"""What a name could not decide, decided by its numbers: a clock read as the step.

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

What it cannot see: a clock the reader took in another unit than its own (seconds sent as a
``timing()`` record, which the protocol reads in milliseconds; minutes read as seconds) climbs at
another pace than the wall clock's and stays the step; a clock logged once every few minutes
needs ``CLIMBS`` of its records, so as many intervals, to be known.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sidecar.model.window import TIMING, SeriesView

CLIMBS = 5
"""Windows with data in a row whose mean climbed with the wall clock before a series is a clock: a
minute with 10-second windows. Steps of random duration over 10-second windows, 2,000 runs of 60
windows each: 5 to 30 s steps made no false clock (with three climbs, 105; four, none), 10 to 60 s
steps one, 1 to 100 s steps three (``tests/test_clocks.py`` keeps a sample of the first)."""
SLACK = 2.0
"""How far a climb may stray from the wall time between its windows (a factor either way)."""


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
    """The uncertain step timings watched, and those found to be clocks. Not thread-safe: the
    aggregator's owner calls it once per window. It holds an entry per uncertain step series the
    window still keeps (bounded by the aggregator's series budget)."""

    def __init__(self) -> None:
        self._watched: dict[tuple[str, str, str], _Watch] = {}
        self._clocks: set[tuple[str, str, str]] = set()

    def settle(self, series: tuple[SeriesView, ...], now_s: float) -> tuple[SeriesView, ...]:
        """``series`` with the clocks among its uncertain steps read as no phase; ``now_s``: the
        window's end (monotonic seconds). The same sequence where nothing is uncertain."""
        out: list[SeriesView] | None = None
        kept: set[tuple[str, str, str]] = set()
        for i, v in enumerate(series):
            if v.kind != TIMING or v.meaning != "step" or v.certainty >= 1.0:
                continue
            key = (v.role, v.worker, v.name)
            kept.add(key)
            if key not in self._clocks and not self._see(key, v, now_s):
                continue
            out = list(series) if out is None else out
            out[i] = replace(v, meaning="", outside=True,
                             rule=f"{v.rule}; its numbers climb with the wall clock: seconds since the start, "
                                  "no phase of the step")
        if self._watched.keys() - kept or self._clocks - kept:
            self._watched = {k: w for k, w in self._watched.items() if k in kept}
            self._clocks &= kept
        return series if out is None else tuple(out)

    def _see(self, key: tuple[str, str, str], v: SeriesView, now_s: float) -> bool:
        """Whether ``v``'s window makes it a clock (remembered from then on)."""
        if v.window is None:
            return False
        mean_s = v.window["mean"] / 1000.0
        watch = self._watched.get(key)
        if watch is None:
            self._watched[key] = _Watch(now_s, now_s, mean_s)
            return False
        if not watch.climbed(mean_s, now_s):
            return False
        self._clocks.add(key)
        del self._watched[key]
        return True
