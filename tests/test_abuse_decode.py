"""Abuse of the decoder and of the daemon's tables, in process: every hostile frame has a counted,
named outcome, costs little, and no table grows past its stated cap."""

from __future__ import annotations

import time
import tracemalloc

import msgspec
import pytest

from sidecar.aggregation.aggregator import MAX_ALLOCATOR_SERIES, RESERVED_FAMILIES, Aggregator
from sidecar.aggregation.senders import MAX_LABEL_PAIRS
from sidecar.core.ingest import IngestLoop
from sidecar.core.pipeline import Pipeline, ingest_records
from sidecar.model.messages import BatchMessage, HelloMessage
from sidecar.processing.mapping import Mapper
from sidecar.sources.decode import MAX_PROFILE_KEYS, DecodeError, decode
from tests.daemon_harness import NoSocket
from trainer_shim import wire

enc = msgspec.msgpack.Encoder()
FOUR_MIB = wire.MAX_MESSAGE_BYTES - 64  # near the limit (it was 4 MiB)


def _loop() -> IngestLoop:
    return IngestLoop(NoSocket(), 10.0, Pipeline())


def _identities_hold(loop: IngestLoop) -> bool:
    return all(s.received == s.accepted + sum(s.rejected.values())
               and s.before_join + s.lost_in_transit + s.received == s.records_total for s in loop.pipeline.registry)


def test_an_integer_drop_reason_is_counted_not_an_internal_error() -> None:
    # Found by bench/fuzz_decode.py (atheris): a sender-drop map with an int key made on_batch
    # raise half-way through ("sender_" + 5), breaking that sender's accounting.
    crash = b"\x9a\x01\x02\x07\x01\xa7drafter\xa6target\x00\n\x82\xabno_receiver\x1e\x05\x18\x90"
    loop = _loop()
    loop.handle_frame(crash)
    assert loop.pipeline.internal_errors == 0 and _identities_hold(loop)
    assert loop.pipeline.registry.totals["drafter", "target"].dropped == {"before_join": 10, "sender_no_receiver": 30,
                                                                  "sender_5": 24}


def _timed_decode(frame: bytes) -> tuple[str, float, int]:
    tracemalloc.start()
    start = time.thread_time()  # CPU time: what the decoding costs, whatever else the box runs
    try:
        outcome = type(decode(frame)).__name__
    except DecodeError as exc:
        outcome = exc.reason
    took = time.thread_time() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return outcome, took, peak


HOSTILE = {
    # 4 MiB of empty arrays as a batch's records: untyped, this decoded into 4 M lists (26 s, 270 MB)
    "4M empty records": b"\x9a\x01\x02\x07\x00\xa1r\xa1w\xc0\xce\xff\xff\xff\xff\x80\xdd"
                        + FOUR_MIB.to_bytes(4, "big") + b"\x90" * FOUR_MIB,
    "4M empty arrays, bare": b"\xdd" + FOUR_MIB.to_bytes(4, "big") + b"\x90" * FOUR_MIB,
    "4M-entry map": b"\xdf" + (FOUR_MIB // 2).to_bytes(4, "big") + b"\x00\xc0" * (FOUR_MIB // 2),
    "deep nesting": b"\x91" * FOUR_MIB + b"\x00",
    "deep in a record": (enc.encode([1, 2, 7, 0, "r", "w", None, 1, {}, []])[:-1]
                         + b"\x91" + b"\x91" * 100_000 + b"\x00"),
    "one huge profile": enc.encode([1, 2, 7, 0, "r", "w", None, 1, {},
                                    [[6, 1, {f"k{i}": 1.0 for i in range(wire.MAX_MESSAGE_BYTES // 16)}]]]),
    "5000 records": enc.encode([1, 2, 7, 0, "r", "w", None, 5000, {}, [[2, "c", 1]] * 5000]),
    "huge hello": enc.encode([1, 1, 7, 0, {"pid": 1, "role": "r", "junk": "x" * FOUR_MIB}]),
    "hello with 10k keys": enc.encode([1, 1, 7, 0, {f"k{i}": i for i in range(10_000)}]),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_frame_costs_little_time_and_memory(name: str) -> None:
    frame = HOSTILE[name]
    assert len(frame) <= wire.MAX_MESSAGE_BYTES
    outcome, took, peak = _timed_decode(frame)
    # The decoding's own CPU seconds (a loaded box makes it wait longer, not work more); the untyped
    # decoder needed 26 s and 270 MB here.
    assert took < 2.0, f"{name}: {took:.2f} CPU s"
    assert peak < 3 * len(frame) + 1_000_000, f"{name}: {peak / 1e6:.1f} MB for a {len(frame) / 1e6:.1f} MB frame"
    loop = _loop()
    loop.handle_frame(frame)
    assert loop.pipeline.internal_errors == 0 and _identities_hold(loop)
    assert outcome in {"malformed", "oversized", "BatchMessage", "HelloMessage"}


def test_limits_are_named_and_a_bad_record_does_not_sink_its_batch() -> None:
    with pytest.raises(DecodeError) as err:
        decode(HOSTILE["5000 records"])
    assert err.value.reason == "oversized"
    msg = decode(enc.encode([1, 2, 7, 0, "r", "w", None, 4, {},
                             [[2, "c", 1], "junk", [6, 1, {f"k{i}": 1.0 for i in range(MAX_PROFILE_KEYS + 1)}],
                              [3, "g", [1, [2]]]]]))
    assert isinstance(msg, BatchMessage) and msg.records == [[2, "c", 1], None, None, None]
    assert ingest_records(Aggregator(), "r", "w", msg.records, Mapper()) == (1, {"malformed_record": 3})


def test_a_hello_keeps_known_short_fields_only() -> None:
    msg = decode(enc.encode([1, 1, 7, 0, {"pid": 12, "role": "drafter", "worker": "x" * 1000, "devices": [0, 1],
                                          "wandb_run_id": "abc", "future_field": {"nested": [1, 2]}}]))
    assert isinstance(msg, HelloMessage)
    assert msg.info == {"pid": 12, "role": "drafter", "devices": [0, 1], "wandb_run_id": "abc"}


def test_a_label_value_flood_is_capped_and_counted() -> None:
    loop = _loop()
    n = MAX_LABEL_PAIRS + 500
    for i in range(n):  # one sender cycling through ever new (role, worker) pairs
        loop.handle_frame(enc.encode([1, 2, 7, i, f"r{i}", f"w{i}", i, i + 1, {}, [[2, "c", 1]]]))
    assert len(loop.pipeline.registry.totals) == MAX_LABEL_PAIRS
    assert loop.pipeline.registry.messages_dropped == {"too_many_labels": 500}
    assert loop.pipeline.internal_errors == 0 and _identities_hold(loop)
    assert len(loop.pipeline.aggregator._steps) <= MAX_LABEL_PAIRS


def test_an_allocator_device_flood_is_capped_and_counted() -> None:
    agg = Aggregator()
    devices = [[7, device, [1, 2, 3]] for device in range(MAX_ALLOCATOR_SERIES + 300)]
    accepted, rejected = ingest_records(agg, "r", "w", devices, Mapper())
    assert accepted == MAX_ALLOCATOR_SERIES and rejected == {"cardinality": 300}
    assert len(agg.roll(0.0, 0.0, 1.0).allocator) == MAX_ALLOCATOR_SERIES


def test_expired_names_release_their_family() -> None:
    agg = Aggregator(series_ttl_s=10.0)
    ingest_records(agg, "r", "w", [[3, f"name_{i}", 1.0] for i in range(100)], Mapper())
    agg.roll(0.0, 0.0, 1.0)
    agg.roll(20.0, 20.0, 1.0)  # idle past the TTL: expired
    # only the reserved families remain
    assert agg.series_count() == 0 and len(agg._family_owner) == len(RESERVED_FAMILIES)
    assert ingest_records(agg, "r", "w", [[3, "name.0", 1.0]], Mapper()) == (1, {})  # and the name can be reused
