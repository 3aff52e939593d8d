"""What a tap forwards: the numbers of a logger call, as ``publish(step, dict)`` records.

A logger call carries more than numbers (images, histograms, tables, strings, nested dicts):
only real numbers are forwarded; a one-element tensor goes to ``scalar()`` (a CUDA tensor is
copied without synchronizing there, never read here); everything else is skipped and counted
(``TapSink.skipped``). Nothing here raises on the trainer's values; the tap's caller catches
what an unforeseen object could still raise.
"""

from __future__ import annotations

import numbers
import operator
import threading
from collections.abc import Mapping
from typing import Any

_PLAIN = frozenset({int, float})
"""Value types forwarded as they are with one type check (bool is not among them)."""


class TapSink:
    """Where the tapped numbers go: ``target`` is a ``Channel`` or the ``telemetry`` module (the
    default channel of the moment). Holds the last step seen, for calls that give none."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.step = 0
        """The last step forwarded (the step of a call without one)."""
        self.skipped = 0
        """Values not forwarded: not a real number or a one-element tensor."""
        self.errors = 0
        """Tap calls that failed inside the tap (the trainer's call was unaffected)."""
        self._lock = threading.Lock()

    def count(self, what: str, n: int = 1) -> None:
        """Add ``n`` to ``skipped`` or ``errors`` (any thread)."""
        with self._lock:
            setattr(self, what, getattr(self, what) + n)

    def step_of(self, value: Any) -> int:
        """The step of a call: ``value`` when it is an int >= 0 (a Python int, a numpy integer, a
        CPU integer tensor), else the last step forwarded. A CUDA tensor is never read."""
        if type(value) is not int:
            if value is None or getattr(value, "is_cuda", False):
                return self.step
            try:
                value = operator.index(value)
            except (TypeError, ValueError, RuntimeError):
                return self.step
        if value < 0:
            return self.step
        self.step = value
        return value

    def mapping(self, step: Any, data: Mapping[str, Any], prefix: str = "") -> None:
        """Forward the numbers of ``data`` (keys prefixed with ``prefix``) for ``step``."""
        step = self.step_of(step)
        if prefix:
            data = {f"{prefix}{k}": v for k, v in data.items()}
        # All plain numbers (the usual case, one C-level pass): the dict as it is, which publish
        # copies; else the numbers sorted out of it.
        plain = data if _PLAIN.issuperset(map(type, data.values())) else self._sort_out(data)
        if plain:
            self.target.publish(step, plain)

    def one(self, step: Any, name: str, value: Any) -> None:
        """Forward one named value for ``step``."""
        step = self.step_of(step)
        if type(value) in _PLAIN:
            self.target.publish(step, {name: value})
        else:
            plain = self._sort_out({name: value})
            if plain:
                self.target.publish(step, plain)

    def _sort_out(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """The real numbers of ``data`` (a one-element numpy array's value too); one-element
        tensors go to ``scalar()``; the rest is counted as skipped."""
        plain: dict[str, Any] = {}
        skipped = 0
        for key, value in data.items():
            if type(value) in _PLAIN or (isinstance(value, numbers.Real) and not isinstance(value, bool)):
                plain[key] = value
            elif _one_element_tensor(value):
                self.target.scalar(key, value)
            elif type(value).__name__ == "ndarray" and getattr(value, "size", 0) == 1 \
                    and type(number := value.item()) in _PLAIN:  # numpy: host memory, read at once
                plain[key] = number
            else:
                skipped += 1
        if skipped:
            self.count("skipped", skipped)
        return plain


def _one_element_tensor(value: Any) -> bool:
    """A tensor of one element (reads its shape only: no synchronization)."""
    numel = getattr(value, "numel", None)
    if numel is None or not hasattr(value, "is_cuda"):
        return False
    try:
        return bool(numel() == 1)
    except Exception:  # noqa: BLE001 - not a tensor after all
        return False
