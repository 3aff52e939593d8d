"""Whose ``publish(step, ...)`` step counts samples or tokens, not steps.

Many loggers plot against what the trainer has seen, not the steps it took: DeepSpeed's
TensorBoard monitor writes every ``Train/Samples/...`` scalar at ``global_samples``, and many
TensorBoard users pass the sample or token count as ``global_step``. Counted as steps, such a run
would take 32 times as many steps as it did (a batch of 32). A sender's step axis counts items
when a key it publishes says so: its namespace is a count of items (``Train/Samples/...``, not a
rate such as ``samples/s``: the mapping stage's ``Mapped.axis``). Its steps are then the times its
step value changed: one per logged step, whatever the items per step (a batch-size ramp, a
variable number of tokens). A logger that writes such an axis only every N steps is counted N
times short; one that writes every N steps on a step axis says no such namespace, and its step
numbers are read as sent.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass


@dataclass(slots=True)
class _Axis:
    last: int
    changes: int = 1
    """Distinct step values in a row: the first one counts as the first step."""


class StepAxes:
    """Each sender's step axis. Not thread-safe: the ingest thread owns it."""

    def __init__(self) -> None:
        self._axes: dict[int, _Axis] = {}
        self._named: set[int] = set()

    def see(self, sender: int, step: int) -> None:
        """A profile of ``sender`` at ``step`` (once per ``publish``: one compare, and an add on a new step)."""
        axis = self._axes.get(sender)
        if axis is None:
            self._axes[sender] = _Axis(step)
        elif step != axis.last:
            axis.last = step
            axis.changes += 1

    def name(self, sender: int) -> None:
        """A key of ``sender`` says its axis counts items (``Mapped.axis``)."""
        self._named.add(sender)

    def counted(self) -> dict[int, int]:
        """Sender -> its steps so far, for the senders whose axis counts items (the rules above)."""
        return {s: a.changes for s, a in self._axes.items() if s in self._named}

    def forget(self, gone: Collection[int]) -> None:
        for sender in gone:
            self._axes.pop(sender, None)
            self._named.discard(sender)
