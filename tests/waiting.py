"""Polling for a condition in tests: a liveness bound, never a performance threshold."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout_s: float = 15.0, interval_s: float = 0.05,
               what: str = "condition") -> T:
    """Call ``predicate`` until it returns something truthy and return that; raise
    ``AssertionError`` naming ``what`` and the last value after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {value!r})")
        time.sleep(interval_s)
