"""Whose ``publish(step, ...)`` step counts samples or tokens, not steps.

Many loggers plot against what the trainer has seen, not the steps it took: DeepSpeed's
TensorBoard monitor writes every ``Train/Samples/...`` scalar at ``global_samples``, and many
TensorBoard users pass the sample or token count as ``global_step``. Counted as steps, such a run
would take 32 times as many steps as it did (a batch of 32). A sender's step axis counts items
when a key it publishes says so: its namespace is a count of items (``Train/Samples/...``, not a
rate such as ``samples/s``: the mapping stage's ``Mapped.axis``), or when its numbers say so: the
step moved by one stride larger than one at every change (``STRIDE_CHANGES`` or more in a row)
and the time between changes is one step's time (the sender's own ``step`` timing), not the stride
times it. A trainer that logs every tenth step on a step axis moves by 10 every ten steps' time
and is read as sent; one that logs every step on a sample axis moves by its batch every step's
time. Without a step timing the stride alone cannot tell the two apart, and the numbers are read
as sent. A counted axis's steps are the times its step value changed: one per logged step,
whatever the items per step (a batch-size ramp, a variable number of tokens). A logger that writes
such an axis only every N steps is counted N times short.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

STRIDE_CHANGES = 8
"""Step changes in a row, each by the same stride, before a stride says anything."""


@dataclass(slots=True)
class _Axis:
    last: int
    first_s: float
    """Monotonic seconds when the first step value was seen."""
    changes: int = 1
    """Distinct step values in a row: the first one counts as the first step."""
    stride: int = 0
    """What the step moved by at every change so far; 0 before the first, -1 once it varied."""
    last_s: float = 0.0
    """Monotonic seconds of the last change."""

    def items_per_change(self, step_ms: float | None) -> bool:
        """Whether the stride counts items: the time between changes is nearer one step's time
        (``step_ms``, milliseconds) than the stride's steps' time."""
        if self.stride <= 1 or self.changes - 1 < STRIDE_CHANGES or not step_ms or step_ms <= 0:
            return False
        between_ms = (self.last_s - self.first_s) * 1000.0 / (self.changes - 1)
        if between_ms <= 0:
            return False
        return abs(math.log(between_ms / step_ms)) < abs(math.log(between_ms / (self.stride * step_ms)))


class StepAxes:
    """Each sender's step axis. Not thread-safe: the ingest thread owns it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._axes: dict[int, _Axis] = {}
        self._named: set[int] = set()
        self._clock = clock

    def see(self, sender_id: int, step: int) -> None:
        """A profile of ``sender_id`` at ``step`` (once per ``publish``: one compare; on a new step a
        subtraction, a compare and a clock read)."""
        axis = self._axes.get(sender_id)
        if axis is None:
            self._axes[sender_id] = _Axis(step, self._clock())
        elif step != axis.last:
            moved = step - axis.last
            axis.stride = moved if axis.stride in (0, moved) else -1
            axis.last = step
            axis.changes += 1
            axis.last_s = self._clock()

    def name(self, sender_id: int) -> None:
        """A key of ``sender_id`` says its axis counts items (``Mapped.axis``)."""
        self._named.add(sender_id)

    def counted(self, step_ms: Mapping[int, float]) -> dict[int, int]:
        """Sender -> its steps so far, for the senders whose axis counts items (the rules above);
        ``step_ms``: each sender's step time this window (milliseconds), where it publishes one."""
        return {s: a.changes for s, a in self._axes.items()
                if s in self._named or a.items_per_change(step_ms.get(s))}

    def moves(self) -> dict[int, int]:
        """Sender -> how many times its step value changed so far (one per logged step)."""
        return {sender: axis.changes for sender, axis in self._axes.items()}

    def forget(self, gone: Collection[int]) -> None:
        for sender in gone:
            self._axes.pop(sender, None)
            self._named.discard(sender)
