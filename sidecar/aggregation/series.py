"""Per-series accumulators: one object per (kind, name, role, worker).

Each ``add`` validates its value and returns False to reject it; nothing here raises on bad
input. The check is ``trainer_shim.wire.RECORD_RULES``' rule for the kind, inlined (one
comparison against ``wire.VALUE_BOUNDS``: this is the hottest path); on a refusal the caller takes
the reason from the rule itself (``wire.record_problem``), and tests/test_record_rules.py holds the
two to the same verdicts. ``roll`` closes the window, returning its
statistics and starting the next one; cumulative totals (for Prometheus counters) survive rolls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sidecar.aggregation.sketch import EXACT_LIMIT, QuantileBuffer
from trainer_shim.wire import MAX_CATEGORY_KEY_CHARS, VALUE_BOUNDS, RecordKind

INF = math.inf
_TIMING_LOW, _TIMING_HIGH = VALUE_BOUNDS[RecordKind.TIMING]
_COUNT_LOW, _COUNT_HIGH = VALUE_BOUNDS[RecordKind.COUNT]
_GAUGE_LOW, _GAUGE_HIGH = VALUE_BOUNDS[RecordKind.GAUGE]


MAX_CATEGORY_KEYS = 64
"""Distinct keys exported per category series (cumulative totals); further keys are counted
under ``OTHER_KEY``."""
MAX_WINDOW_KEYS = 1024
"""Distinct keys one category series counts within a window, for its entropy and distribution:
the entropy is exact up to this many keys (with 64, 100 even keys read 4.78 bits for 6.64)."""
WINDOW_KEYS_BUDGET = 100_000
"""Keys beyond the first ``MAX_CATEGORY_KEYS`` that all category series together may count in
one window (a few MB): past it, further new keys fall into ``OTHER_KEY`` and that window's
entropy is a lower bound."""
OTHER_KEY = "_other"


@dataclass(slots=True)
class KeyBudget:
    """The window's remaining ``WINDOW_KEYS_BUDGET``, shared by all category series."""

    left: int = WINDOW_KEYS_BUDGET


@dataclass(slots=True)
class TimingSeries:
    """Durations, received in milliseconds. Window: count, mean, p50, p95, max (seconds at export)."""

    values: QuantileBuffer = field(default_factory=QuantileBuffer)
    total_count: int = 0
    total_sum_ms: float = 0.0
    updated: float = 0.0

    def add(self, value: object) -> bool:
        if (value.__class__ is float or value.__class__ is int) and _TIMING_LOW <= value <= _TIMING_HIGH:  # type: ignore[operator]
            window = self.values.window  # QuantileBuffer.append, inlined: the hottest path
            window.append(value)  # type: ignore[arg-type]
            if len(window) >= EXACT_LIMIT:
                self.values.fold()
            return True
        return False

    def roll(self) -> dict[str, float] | None:
        stats = self.values.close_window()
        if stats is None:
            return None
        self.total_count += int(stats["count"])
        self.total_sum_ms += stats["sum"]
        return stats


@dataclass(slots=True)
class CounterSeries:
    """Increments. Window: delta and rate (per second); cumulative total."""

    window: float = 0.0
    total: float = 0.0
    updated: float = 0.0

    def add(self, value: object) -> bool:
        if (value.__class__ is int or value.__class__ is float) and _COUNT_LOW <= value <= _COUNT_HIGH:  # type: ignore[operator]
            self.window += value  # type: ignore[operator]
            return True
        return False

    def roll(self, duration_s: float) -> dict[str, float]:
        delta, self.window = self.window, 0.0
        self.total += delta
        return {"delta": delta, "rate": delta / duration_s if duration_s > 0 else 0.0, "total": self.total}


@dataclass(slots=True)
class GaugeSeries:
    """Instantaneous values. Window: last, mean, min, max; ``last`` persists across windows."""

    last: float = math.nan
    count: int = 0
    total: float = 0.0
    low: float = INF
    high: float = -INF
    updated: float = 0.0

    def add(self, value: object) -> bool:
        if (value.__class__ is float or value.__class__ is int) and \
                _GAUGE_LOW <= value <= _GAUGE_HIGH:  # type: ignore[operator]
            self.last = value  # type: ignore[assignment]
            self.count += 1
            self.total += value  # type: ignore[operator]
            if value < self.low:  # type: ignore[operator]
                self.low = value  # type: ignore[assignment]
            if value > self.high:  # type: ignore[operator]
                self.high = value  # type: ignore[assignment]
            return True
        return False

    def roll(self) -> dict[str, float] | None:
        if self.count == 0:
            return None
        stats = {"last": self.last, "mean": self.total / self.count, "min": self.low,
                 "max": self.high, "count": float(self.count)}
        self.count, self.total, self.low, self.high = 0, 0.0, INF, -INF
        return stats


@dataclass(slots=True)
class CategorySeries:
    """Categorical samples. Window: distribution and Shannon entropy (bits); cumulative counts."""

    window: dict[str | int, int] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=dict)
    updated: float = 0.0
    budget: KeyBudget = field(default_factory=KeyBudget)

    def add(self, value: object) -> bool:
        if value.__class__ is int or (value.__class__ is str and 0 < len(value) <= MAX_CATEGORY_KEY_CHARS  # type: ignore[arg-type]
                                      and value.isprintable()):  # type: ignore[attr-defined]
            window = self.window
            if value in window:
                window[value] += 1  # type: ignore[index]
            elif len(window) < MAX_CATEGORY_KEYS:
                window[value] = 1  # type: ignore[index]
            elif len(window) < MAX_WINDOW_KEYS and self.budget.left > 0:
                self.budget.left -= 1
                window[value] = 1  # type: ignore[index]
            else:
                window[OTHER_KEY] = window.get(OTHER_KEY, 0) + 1
            return True
        return False

    def roll(self) -> dict[str, object] | None:
        window, self.window = self.window, {}
        n = sum(window.values())
        if n == 0:
            return None
        for key, count in window.items():
            label = str(key)
            if label in self.totals or len(self.totals) < MAX_CATEGORY_KEYS:
                self.totals[label] = self.totals.get(label, 0) + count
            else:
                self.totals[OTHER_KEY] = self.totals.get(OTHER_KEY, 0) + count
        return {"count": float(n), "entropy_bits": entropy_bits(window.values()),
                "distribution": {str(k): c / n for k, c in window.items()}}


def entropy_bits(counts: object) -> float:
    """Shannon entropy (bits) of a distribution given by non-negative counts; 0 for empty."""
    values = [c for c in counts if c > 0]  # type: ignore[attr-defined]
    total = sum(values)
    if total == 0:
        return 0.0
    return -sum((c / total) * math.log2(c / total) for c in values) + 0.0


Series = TimingSeries | CounterSeries | GaugeSeries | CategorySeries
