"""When each group of NVML values is read: every poll, or on a slower cadence kept within a CPU budget.

Some values change every second and are cheap to read (utilization, power, clocks: microseconds
a call); others are counters or near-constants that cost milliseconds a call on some drivers (an
H200 in a VM: the field batch 5 ms, GPM 5.3 ms per GPU). So each group has the period its
meaning needs (``SLOW_PERIODS_S``): the ``FAST`` groups are read every poll, always; the slow
ones when due. The slow groups of one GPU that fall due together, or within half a period of
each other, share one field batch; the GPUs' slow reads are spread over the period instead of
landing in one poll.

The budget (a share of one core) is kept by stretching the slow periods, all by one factor, never
the fast ones: the poller measures its own CPU time (the fast part of each poll, and each slow
read per GPU), and the factor is what leaves the slow reads the room the fast part does not use,
between 1 and ``MAX_STRETCH``. ``EVERY_POLL`` mode reads every group every poll, as the poller
did before it had cadences (no budget).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

COST_AWARE = "cost-aware"
EVERY_POLL = "every-poll"
MODES = (COST_AWARE, EVERY_POLL)

FAST: tuple[str, ...] = ("utilization", "memory", "power", "temperature", "clocks", "clock_events", "processes",
                         "xid_events")
"""Read every poll, whatever the budget."""

SLOW_PERIODS_S: dict[str, float] = {
    "gpm": 5.0,
    "energy_counter": 10.0,
    "pcie_counters": 10.0,
    "throttle_counters": 10.0,
    "memory_temperature": 10.0,
    "ecc_counters": 60.0,
    "power_limit": 60.0,
}
"""Seconds between two reads of each slow group before any stretch: GPM's metrics are averages
over the time between two samples (half a window); the counters give rates and increases that
a window (10 s) reads once; energy in between is integrated from power; ECC counts and the power
limit change rarely."""

UNITS: dict[str, str] = {name: "gpm" if name == "gpm" else "fields" for name in SLOW_PERIODS_S}
"""How a slow group is read: ``gpm`` (sample + metrics) or ``fields`` (one field batch per GPU,
shared by every field group due). The budget prices these per GPU read."""

MAX_STRETCH = 60.0
"""The slow periods grow at most this much (10 s counters: every 10 minutes)."""

_SMOOTHING = 0.2
"""Weight of the newest measurement in the running cost estimates."""


class Cadence:
    """The slow groups' schedule per GPU and the stretch that keeps the budget; poller thread only."""

    def __init__(self, interval_s: float, budget: float | None, periods: Mapping[str, float] | None = None,
                 log: logging.Logger | None = None) -> None:
        """``budget``: share of one core (0.01 = 1 %), or None to read every group every poll
        (``EVERY_POLL``). ``periods``: the slow groups' base periods in seconds (default
        ``SLOW_PERIODS_S``; a test's shorter ones). Raises ``ValueError`` for an unknown group or
        a period that is not positive."""
        self.interval_s = interval_s
        self.budget = budget
        self.periods = dict(SLOW_PERIODS_S if periods is None else periods)
        for name, period in self.periods.items():
            if name not in UNITS or not period > 0:
                raise ValueError(f"slow NVML group {name!r}: expected one of {sorted(UNITS)} with a period > 0 s")
        self.stretch = 1.0
        self._log = log or logging.getLogger("sidecar.nvml")
        self._next: dict[tuple[int, str], float] = {}
        self._fast_cpu_s: float | None = None
        self._unit_cpu_s: dict[str, float] = {}
        self._warned = False

    def period(self, name: str) -> float:
        """Seconds between two reads of group ``name`` now."""
        if name not in self.periods:
            return self.interval_s
        return self.periods[name] * self.stretch

    def intervals(self) -> tuple[tuple[str, float], ...]:
        """Every group with its seconds between reads now (the fast ones: the poll interval)."""
        if self.budget is None:
            return tuple((name, self.interval_s) for name in (*FAST, *self.periods))
        return tuple([(name, self.interval_s) for name in FAST] +
                     [(name, max(self.interval_s, self.period(name))) for name in self.periods])

    def due(self, gpu: int, now: float) -> frozenset[str]:
        """The slow groups to read on GPU ``gpu`` in the poll starting at ``now`` (monotonic s)."""
        if self.budget is None:
            return frozenset(self.periods)
        slack = self.interval_s / 2.0
        due = {name for name in self.periods if self._next.get((gpu, name), now) <= now + slack}
        fields = [self.period(name) for name in due if UNITS[name] == "fields"]
        if fields:  # a field group due soon rides along in the same batch
            soon = now + min(fields) / 2.0
            due |= {name for name in self.periods
                    if UNITS[name] == "fields" and self._next.get((gpu, name), now) <= soon}
        return frozenset(due)

    def read(self, gpu: int, names: Collection[str], now: float, phase: float = 0.0) -> None:
        """Groups ``names`` of GPU ``gpu`` were read at ``now``. ``phase`` (0-1) delays the
        second read of a group once, by that share of the shortest period of its unit (so a
        GPU's field groups stay in step): GPUs given different phases spread their slow reads."""
        for name in names:
            delay = 0.0
            if (gpu, name) not in self._next:
                delay = phase * min(self.period(n) for n in self.periods if UNITS[n] == UNITS[name])
            self._next[(gpu, name)] = now + self.period(name) + delay

    def measured(self, fast_cpu_s: float, slow_cpu_s: Mapping[str, list[float]],
                 readers: Mapping[str, int]) -> None:
        """One poll's CPU time: ``fast_cpu_s`` outside the slow reads (since the previous poll
        ended: the wait between polls costs too), ``slow_cpu_s`` per unit
        (``fields``, ``gpm``) one entry per GPU read; ``readers``: GPUs that read each unit now.
        Updates the stretch."""
        self._fast_cpu_s = _smoothed(self._fast_cpu_s, fast_cpu_s)
        for unit, costs in slow_cpu_s.items():
            for cost in costs:
                self._unit_cpu_s[unit] = _smoothed(self._unit_cpu_s.get(unit), cost)
        if self.budget is not None:
            self.stretch = self._stretch(self.budget, readers)

    def _stretch(self, budget: float, readers: Mapping[str, int]) -> float:
        """The factor on the slow periods that brings the poller's CPU share within ``budget``."""
        slow = 0.0  # share of a core at the base periods
        for unit, cost in self._unit_cpu_s.items():
            periods = [p for name, p in self.periods.items() if UNITS[name] == unit]
            if periods:
                slow += readers.get(unit, 0) * cost / min(periods)
        room = budget - (self._fast_cpu_s or 0.0) / self.interval_s
        if slow <= room:
            return 1.0
        stretch = slow / room if room > 0 else MAX_STRETCH
        if stretch > MAX_STRETCH and not self._warned:
            self._warned = True
            self._log.warning("NVML: the CPU budget (%.2f %% of a core) cannot be kept: the values read every poll "
                              "cost %.2f %% and the slow ones %.2f %% even at %g times their periods; raise "
                              "nvml_cpu_budget or nvml_interval", budget * 100, (budget - room) * 100,
                              slow / MAX_STRETCH * 100, MAX_STRETCH)
        return min(stretch, MAX_STRETCH)


def _smoothed(previous: float | None, value: float) -> float:
    return value if previous is None else previous + _SMOOTHING * (value - previous)
