"""Abuse: floods of made-up labels and sender ids hold the daemon's tables only for a while. A
trainer that starts after a flood of 10,000 worker names (or 10,000 sender ids) is admitted once
the flood's entries have been silent for ``EVICT_IDLE_S``, and counted exactly from then on (its
earlier records as ``before_join``); a live sender keeps its place through a continuing flood."""

from __future__ import annotations

import msgspec

from sidecar.aggregation.senders import EVICT_IDLE_S, MAX_LABEL_PAIRS, MAX_SENDERS
from sidecar.core.ingest import IngestLoop
from sidecar.core.pipeline import Pipeline
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
    loop = IngestLoop(NoSocket(), 10.0, Pipeline(clock=clock), clock=clock)
    _flood_labels(loop, 10_000, 0)
    assert len(loop.pipeline.registry.totals) == MAX_LABEL_PAIRS
    honest = [0, 0]
    _honest(loop, clock, 5, honest)  # the flood is fresh: refused, as whole messages
    assert ("trainer", "0") not in loop.pipeline.registry.totals
    clock.t += EVICT_IDLE_S
    _honest(loop, clock, 10, honest)
    _flood_labels(loop, 10_000, 10_000)  # a flood that goes on cannot push the live trainer out
    _honest(loop, clock, 10, honest)
    totals = loop.pipeline.registry.totals["trainer", "0"]
    assert totals.accepted + totals.dropped.get("before_join", 0) == honest[1]
    assert totals.accepted == 20 * 5 and totals.dropped == {"before_join": 5 * 5}  # the refused batches
    assert len(loop.pipeline.registry.totals) <= MAX_LABEL_PAIRS


def test_a_trainer_starting_after_a_sender_id_flood_gets_in() -> None:
    clock = _Clock()
    loop = IngestLoop(NoSocket(), 10.0, Pipeline(clock=clock), clock=clock)
    for i in range(10_000):
        loop.handle_frame(_batch(100_000 + i, 0, "flood", "0", 1, 1))
    assert len(loop.pipeline.registry.senders) == MAX_SENDERS
    clock.t += EVICT_IDLE_S
    honest = [0, 0]
    _honest(loop, clock, 10, honest)
    totals = loop.pipeline.registry.totals["trainer", "0"]
    assert totals.accepted == 10 * 5 and loop.pipeline.registry.senders[42].accepted == 50
    assert len(loop.pipeline.registry.senders) <= MAX_SENDERS


def _profile_flood(loop: IngestLoop, frames: int, keys_per_frame: int, start: int, peer: int = 1111) -> None:
    """A sender on its own connection (``peer``) publishing profile dicts whose keys are all new."""
    for f in range(start, start + frames):
        profile = {f"k{f * keys_per_frame + j}": 1.0 for j in range(keys_per_frame)}
        loop.handle_frame(enc.encode([1, 2, 9, f, "flood", "p", f, f + 1, {}, [[6, f, profile]]]), peer)


def _honest_names(loop: IngestLoop, seq: int, total: int, peer: int = 2222) -> int:
    """One batch of 1001 records under 143 names (7 each) from an honest trainer; returns its new total."""
    records = [[1, f"step{j}_ms", 1.0] for j in range(143)] * 7
    loop.handle_frame(enc.encode([1, 2, 42, seq, "trainer", "0", seq, total + len(records), {}, records]), peer)
    return total + len(records)


def test_a_trainer_starting_after_a_series_flood_is_admitted_at_once_and_keeps_its_place() -> None:
    # The report: a flood of distinct profile keys filled the 10,000-series table and a trainer
    # starting afterwards had every record refused as cardinality, still 70 s later.
    clock = _Clock()
    loop = IngestLoop(NoSocket(), 10.0, Pipeline(clock=clock), clock=clock)
    agg = loop.pipeline.aggregator
    _profile_flood(loop, 12, 1000, 0)
    assert agg.series_count() == agg.max_series
    total = _honest_names(loop, 0, 0)
    trainer = loop.pipeline.registry.totals["trainer", "0"]
    assert trainer.accepted == total and trainer.dropped == {}, trainer  # at once, every record
    _profile_flood(loop, 12, 1000, 12)  # the flood goes on: it cannot push the trainer back out
    clock.t += 11.0
    loop._roll_if_due()
    for seq in range(1, 4):
        total = _honest_names(loop, seq, total)
        _profile_flood(loop, 2, 1000, 24 + 2 * seq)
    assert trainer.accepted == total and trainer.dropped == {}, trainer
    assert agg.series_count() <= agg.max_series and agg.evicted_series >= 143
    flood = loop.pipeline.registry.totals["flood", "p"]
    assert agg.profile_entries_rejected["flood", "p", "cardinality"] > 0 and flood.accepted > 0


def test_a_flood_of_new_names_is_refused_unmapped_beyond_its_budget() -> None:
    # Mapping a name costs about 10 us; a 1 MiB frame of new profile keys (60,000 of them) took
    # 0.6 s. Beyond the owner's budget per window its new names are refused without mapping.
    clock = _Clock()
    loop = IngestLoop(NoSocket(), 10.0, Pipeline(clock=clock), clock=clock)
    agg = loop.pipeline.aggregator
    calls = []
    resolve = loop.pipeline.mapper.resolve

    def counted(*args: object) -> object:
        calls.append(args[1])
        return resolve(*args)  # type: ignore[arg-type]

    loop.pipeline.mapper.resolve = counted  # type: ignore[method-assign]
    _profile_flood(loop, 30, 1000, 0)
    assert len(calls) == agg.resolve_budget, len(calls)
    assert agg.profile_entries_rejected["flood", "p", "cardinality"] == 30_000 - agg.max_series
    total = _honest_names(loop, 0, 0)  # another owner has its own budget (and its share of the table)
    assert loop.pipeline.registry.totals["trainer", "0"].accepted == total
    clock.t += 11.0
    loop._roll_if_due()
    calls.clear()
    _profile_flood(loop, 1, 1000, 30)  # a new window: a new budget
    assert len(calls) == 1000
