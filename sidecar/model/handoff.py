"""What one stage hands the pipeline for the next: each stage's part of a window, as a value.

A window (``model.window.IngestReport``) is put together from three parts, each handed back by
the stage that owns the figures, copied at the window's end so that nothing in it is shared
with the stage afterwards: the receiver's counters (``Received``), the sender registry's
accounting (``SendersPart``) and the aggregator's aggregates (``AggregatesPart``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sidecar.model.window import LabelTotals, SenderView, WindowReport


@dataclass(frozen=True, slots=True)
class Received:
    """The receiver's counters since it started: frames and bytes taken, connections lost,
    frames dropped unread by reason (``over_share``)."""

    frames: int = 0
    bytes: int = 0
    disconnects: int = 0
    refused: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SendersPart:
    """The sender registry's part of a window (``aggregation.senders.SenderRegistry.window``)."""

    live: tuple[int, ...]
    """The ids of the senders live in the window (the steps the window reports are theirs)."""
    known: frozenset[int]
    """The ids of every sender the registry still holds (the aggregator forgets the others)."""
    senders: tuple[SenderView, ...]
    totals: dict[tuple[str, str], LabelTotals]
    """Copies of each label pair's cumulative counts."""
    messages_dropped: dict[str, int]
    """Messages (and tallies) dropped, by reason, since the start."""


@dataclass(frozen=True, slots=True)
class AggregatesPart:
    """The aggregator's part of a window (``aggregation.aggregator.Aggregator.close``)."""

    window: WindowReport
    profile_entries_rejected: dict[tuple[str, str, str], int]
    """(role, worker, reason) -> profile entries skipped since the start."""
    series: int
    """Series held at the window's end."""
