"""Window quantiles: exact while a window is small, a KLL sketch with a stated bound beyond.

Values are appended to a plain list (the cheapest thing per record). When a window holds more
than ``EXACT_LIMIT`` values, they are folded into an Apache DataSketches KLL sketch (k=200) with
numpy, and the list starts over, so memory per series stays bounded whatever the input rate.

Error bound: with at most ``EXACT_LIMIT`` values in a window, quantiles are exact (numpy's
``inverted_cdf``: an observed value). Beyond, a quantile's rank is within ``RANK_ERROR`` of the
true rank with 99 % confidence (KLL, k=200: 1.33 % single-quantile normalized rank error). Count,
sum, mean and max are always exact.
"""

from __future__ import annotations

import math

import numpy as np
from datasketches import kll_doubles_sketch

EXACT_LIMIT = 65_536
KLL_K = 200
RANK_ERROR = kll_doubles_sketch.get_normalized_rank_error(KLL_K, False)
QUANTILES = (0.5, 0.95)


def inverted_cdf_rank(n: int, q: float) -> int:
    """The index in ``n`` sorted values of quantile ``q`` by numpy's ``inverted_cdf`` method (its
    arithmetic, step for step): ``np.quantile(a, q, method="inverted_cdf") == sorted(a)[rank]``.
    A sort and two look-ups cost a few µs where ``np.quantile`` takes ~40 µs a series."""
    index = n * q - 1
    previous = math.floor(index)
    return max(0, previous if index == previous else previous + 1)


class QuantileBuffer:
    """Collects one window of values for one series."""

    __slots__ = ("window", "_sketch", "_count", "_sum", "_max")

    def __init__(self) -> None:
        self.window: list[float] = []
        """The values appended since the last fold: a plain list, so that a caller on the hot
        path may append to it directly and call ``fold`` when it reaches ``EXACT_LIMIT``."""
        self._reset()

    def _reset(self) -> None:
        self.window = []
        self._sketch: kll_doubles_sketch | None = None
        self._count = 0
        self._sum = 0.0
        self._max = -np.inf

    def append(self, value: float) -> None:
        """Add one value (``TimingSeries.add`` does the same inline)."""
        window = self.window
        window.append(value)
        if len(window) >= EXACT_LIMIT:
            self.fold()

    def fold(self) -> None:
        """Move the listed values into the sketch (keeps memory bounded)."""
        arr = np.asarray(self.window, dtype=np.float64)
        self.window = []
        if arr.size == 0:
            return
        if self._sketch is None:
            self._sketch = kll_doubles_sketch(KLL_K)
        self._sketch.update(arr)
        self._count += arr.size
        self._sum += float(arr.sum())
        self._max = max(self._max, float(arr.max()))

    def __len__(self) -> int:
        return self._count + len(self.window)

    def close_window(self) -> dict[str, float] | None:
        """Statistics of the window now ending (``count``, ``sum``, ``mean``, ``p50``, ``p95``,
        ``max``, ``exact`` 1.0/0.0), or None if it was empty. Starts the next window."""
        if self._sketch is None:
            if not self.window:
                return None
            arr = np.asarray(self.window, dtype=np.float64)
            stats = {"count": float(arr.size), "sum": float(arr.sum()), "max": float(arr.max())}
            arr.sort()  # after the sum: numpy's pairwise sum depends on the order
            n = arr.size
            stats.update(p50=float(arr[inverted_cdf_rank(n, QUANTILES[0])]),
                         p95=float(arr[inverted_cdf_rank(n, QUANTILES[1])]), exact=1.0)
        else:
            self.fold()
            assert self._sketch is not None
            q = self._sketch.get_quantiles(list(QUANTILES))
            stats = {"count": float(self._count), "sum": self._sum, "max": self._max,
                     "p50": float(q[0]), "p95": float(q[1]), "exact": 0.0}
        stats["mean"] = stats["sum"] / stats["count"]
        self._reset()
        return stats
