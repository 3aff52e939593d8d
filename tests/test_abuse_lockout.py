"""Abuse: floods of made-up labels and sender ids hold the daemon's tables only for a while. A
trainer that starts after a flood of 10,000 worker names (or 10,000 sender ids) is admitted once
the flood's entries have been silent for ``EVICT_IDLE_S``, and counted exactly from then on (its
earlier records as ``before_join``); a live sender keeps its place through a continuing flood."""

from __future__ import annotations

import msgspec

from sidecar.aggregation.senders import EVICT_IDLE_S, MAX_LABEL_PAIRS, MAX_SENDERS
from sidecar.ingest import IngestLoop
from tests.daemon_harness import NoSocket

enc = msgspec.msgpack.Encoder()


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _batch(sender: int, seq: int, role: str, worker: str, total: int, n: int) -> bytes:
    return enc.encode([1, 2, sender, seq, role, worker, None, total, {}, [[2, "tokens", 1]] * n])


def _honest(loop: IngestLoop, clock: _Clock, batches: int, state: list[int]) -> None:
    for _ in range(batches):
        state[1] += 5
        loop.handle_frame(_batch(42, state[0], "trainer", "0", state[1], 5))
        state[0] += 1
        clock.t += 1.0


def _flood_labels(loop: IngestLoop, n: int, start: int) -> None:
    for i in range(start, start + n):
        loop.handle_frame(_batch(7, i, "flood", f"w{i}", i + 1, 1))


def test_a_trainer_starting_after_a_label_flood_gets_in_and_is_counted_exactly() -> None:
    clock = _Clock()
    loop = IngestLoop(NoSocket(), 10.0, lambda report: None, clock=clock)
    _flood_labels(loop, 10_000, 0)
    assert len(loop.registry.totals) == MAX_LABEL_PAIRS
    honest = [0, 0]
    _honest(loop, clock, 5, honest)  # the flood is fresh: refused, as whole messages
    assert ("trainer", "0") not in loop.registry.totals
    clock.t += EVICT_IDLE_S
    _honest(loop, clock, 10, honest)
    _flood_labels(loop, 10_000, 10_000)  # a flood that goes on cannot push the live trainer out
    _honest(loop, clock, 10, honest)
    totals = loop.registry.totals["trainer", "0"]
    assert totals.accepted + totals.dropped.get("before_join", 0) == honest[1]
    assert totals.accepted == 20 * 5 and totals.dropped == {"before_join": 5 * 5}  # the refused batches
    assert len(loop.registry.totals) <= MAX_LABEL_PAIRS


def test_a_trainer_starting_after_a_sender_id_flood_gets_in() -> None:
    clock = _Clock()
    loop = IngestLoop(NoSocket(), 10.0, lambda report: None, clock=clock)
    for i in range(10_000):
        loop.handle_frame(_batch(100_000 + i, 0, "flood", "0", 1, 1))
    assert len(loop.registry.senders) == MAX_SENDERS
    clock.t += EVICT_IDLE_S
    honest = [0, 0]
    _honest(loop, clock, 10, honest)
    totals = loop.registry.totals["trainer", "0"]
    assert totals.accepted == 10 * 5 and loop.registry.senders[42].accepted == 50
    assert len(loop.registry.senders) <= MAX_SENDERS
