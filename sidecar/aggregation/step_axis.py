"""Whose ``publish(step, ...)`` step counts samples or tokens, not steps.

Many loggers plot against what the trainer has seen, not the steps it took: DeepSpeed's
TensorBoard monitor writes every ``Train/Samples/...`` scalar at ``global_samples``, and many
TensorBoard users pass the sample count as ``global_step``. Counted as steps, such a run would
take 32 times as many steps as it did (a batch of 32). A sender's step axis is read as a count of
items when both hold:

- a key it publishes says so: its namespace is a count of items (``Train/Samples/...``; the
  mapping stage's ``Mapped.axis``);
- the axis moves by the same stride, larger than one, from one step value to the next (at least
  ``MIN_RUNS`` times in a row): the items of one step.

Its steps are then its step numbers divided by that stride (the run ledger's count). A logger
that writes every N steps moves by N too, but says no such namespace: its steps stay as sent.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

MIN_RUNS = 2
"""Consecutive advances by the same stride before it is taken."""


@dataclass(slots=True)
class _Axis:
    last: int
    stride: int = 0
    runs: int = 0


class StepAxes:
    """Each sender's step axis. Not thread-safe: the ingest thread owns it."""

    def __init__(self) -> None:
        self._axes: dict[int, _Axis] = {}
        self._named: set[int] = set()

    def see(self, sender: int, step: int) -> None:
        """A profile of ``sender`` at ``step`` (once per ``publish``: a compare and, on a new step, a subtraction)."""
        axis = self._axes.get(sender)
        if axis is None:
            self._axes[sender] = _Axis(step)
        elif step != axis.last:
            delta = step - axis.last
            if delta == axis.stride:
                axis.runs += 1
            else:
                axis.stride, axis.runs = delta, 1
            axis.last = step

    def name(self, sender: int) -> None:
        """A key of ``sender`` says its axis counts items (``Mapped.axis``)."""
        self._named.add(sender)

    def strides(self) -> dict[int, int]:
        """Sender -> the items per step of a sender whose axis counts items (the rules above), 0
        while its keys say so but its stride is not known yet (its steps are not counted until
        it is: a sample number is never taken for a step number)."""
        out = {}
        for s in self._named:
            a = self._axes.get(s)
            if a is not None:
                out[s] = a.stride if a.stride > 1 and a.runs >= MIN_RUNS else 0
        return out

    def forget(self, gone: Collection[int]) -> None:
        for sender in gone:
            self._axes.pop(sender, None)
            self._named.discard(sender)
