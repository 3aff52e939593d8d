"""A GPU's energy counter between two readings: integrated from power, corrected by the counter.

Reading the counter costs milliseconds on some drivers (an H200 in a VM: 3.1 ms per call, or a
share of the 5 ms field batch), power costs microseconds. So the poller reads power every poll
and the counter on a slower cadence; in between, the energy is the last counter reading plus
the power integrated since (trapezoids over the polls). Each counter reading replaces the
estimate. The value handed out never goes back (it is exported as a counter and the run ledger
books its increases): when the estimate ran ahead of the counter, the value holds until the
counter catches up. A counter that went back (the driver was reloaded) starts over from it.
"""

from __future__ import annotations


class EnergyEstimate:
    """One GPU's energy in joules since the driver was loaded; used by the poller thread only."""

    def __init__(self) -> None:
        self._counter_j: float | None = None
        """The last counter reading."""
        self._integral_j = 0.0
        """Energy integrated from power since that reading."""
        self._power: tuple[float, float] | None = None
        """The last power reading: (watts, monotonic seconds)."""
        self._value_j: float | None = None

    def counter(self, joules: float, now: float) -> None:
        """A counter reading (joules) taken at ``now`` (monotonic seconds)."""
        if self._counter_j is not None and joules < self._counter_j:
            self._value_j = None  # the counter was reset: follow it down, once
        self._counter_j, self._integral_j = joules, 0.0
        if self._power is not None:
            self._power = (self._power[0], now)

    def power(self, watts: float | None, now: float) -> None:
        """A power reading (watts; None: not read this poll) taken at ``now``."""
        if watts is None:
            self._power = None  # a gap is not integrated: the next counter reading fills it
            return
        if self._power is not None and now > self._power[1]:
            self._integral_j += (self._power[0] + watts) / 2.0 * (now - self._power[1])
        self._power = (watts, now)

    def value(self) -> float | None:
        """The energy now (joules), never below an earlier value; None before a counter reading."""
        if self._counter_j is None:
            return None
        estimate = self._counter_j + self._integral_j
        if self._value_j is None or estimate > self._value_j:
            self._value_j = estimate
        return self._value_j

    def forget(self) -> None:
        """The counter cannot be read any more (unsupported): no value from now on."""
        self._counter_j, self._value_j, self._integral_j = None, None, 0.0
