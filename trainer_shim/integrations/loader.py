"""A data-loader wrapper for plain loops: times the exact wait for each batch. Two lines::

    from trainer_shim.integrations.loader import timed
    for batch in timed(loader):          # publishes data_wait_ms and counts batches
        ...

``data_wait_ms`` is the host wall time spent inside the loader's ``next()`` for each batch,
the first one included (it also pays for starting the workers). ``tokens``, when given, is a
function of the batch returning its token count (an int; never a tensor read), counted as
``tokens``. Each batch handed out is also a step boundary for a capture on request
(``trainer_shim.capture``), so a loop that never calls ``publish`` can be traced too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from time import perf_counter_ns
from typing import Any, Generic, TypeVar

from trainer_shim import capture, telemetry
from trainer_shim.integrations import names

T = TypeVar("T")


class TimedLoader(Generic[T]):
    """Iterates ``loader`` and records each wait; ``len()`` is the loader's."""

    def __init__(self, loader: Iterable[T], name: str = names.DATA_WAIT_MS,
                 tokens: Callable[[T], int] | None = None, channel: Any = None) -> None:
        self.loader = loader
        self.name = name
        self.tokens = tokens
        self._tm = channel if channel is not None else telemetry

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[T]:
        it = iter(self.loader)
        tm, name, tokens = self._tm, self.name, self.tokens
        batches = 0
        while True:
            t0 = perf_counter_ns()
            try:
                batch = next(it)
            except StopIteration:
                return
            tm.timing(name, (perf_counter_ns() - t0) / 1e6)
            tm.count(names.BATCHES)
            if tokens is not None:
                tm.count(names.TOKENS, tokens(batch))
            batches += 1
            if capture.armed:  # each batch is a step boundary too (trainer_shim.capture)
                capture.at_step(tm if tm is not telemetry else telemetry.channel(), batches, "loader")
            yield batch


def timed(loader: Iterable[T], name: str = names.DATA_WAIT_MS,
          tokens: Callable[[T], int] | None = None, channel: Any = None) -> TimedLoader[T]:
    """Wrap ``loader`` (any iterable: a DataLoader, a generator) to time each batch's wait."""
    return TimedLoader(loader, name, tokens, channel)
