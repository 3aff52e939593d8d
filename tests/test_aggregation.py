"""Aggregation units: series statistics, quantile bounds, names, cardinality, accounting."""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest

from sidecar.aggregation.aggregator import Aggregator
from sidecar.aggregation.senders import SenderRegistry
from sidecar.aggregation.series import CategorySeries, entropy_bits
from sidecar.aggregation.sketch import EXACT_LIMIT, RANK_ERROR, QuantileBuffer
from sidecar.core.pipeline import ingest_records
from sidecar.model.messages import BatchMessage, HelloMessage
from sidecar.model.names import counter_token, family_names, metric_token, timing_token
from sidecar.model.window import COUNT, GAUGE, TIMING
from sidecar.processing.mapping import Mapper
from sidecar.sources.decode import DecodeError, decode
from trainer_shim import wire

enc = msgspec.msgpack.Encoder()


def test_small_windows_have_exact_quantiles() -> None:
    buf = QuantileBuffer()
    for v in range(1, 101):
        buf.append(float(v))
    stats = buf.close_window()
    assert stats == {"count": 100.0, "sum": 5050.0, "max": 100.0, "p50": 50.0, "p95": 95.0, "exact": 1.0,
                     "mean": 50.5}
    assert buf.close_window() is None  # the next window starts empty


def test_large_windows_stay_within_the_stated_rank_error() -> None:
    rng = np.random.default_rng(7)
    values = rng.lognormal(mean=2.0, sigma=0.7, size=EXACT_LIMIT * 3 + 17)
    buf = QuantileBuffer()
    for v in values.tolist():
        buf.append(v)
    stats = buf.close_window()
    assert stats is not None and stats["exact"] == 0.0
    assert stats["count"] == values.size and stats["max"] == values.max()
    assert stats["sum"] == pytest.approx(values.sum())
    ordered = np.sort(values)
    for q in ("p50", "p95"):
        rank = np.searchsorted(ordered, stats[q]) / values.size
        assert abs(rank - float(q[1:]) / 100) <= RANK_ERROR


def test_entropy_and_category_overflow() -> None:
    assert entropy_bits([5, 5, 5, 5]) == pytest.approx(2.0)
    assert entropy_bits([7]) == 0.0 and entropy_bits([]) == 0.0
    series = CategorySeries()
    for key in range(70):
        assert series.add(key)
    assert not series.add(1.5) and not series.add("") and not series.add(None)
    stats = series.roll()
    assert stats is not None and stats["count"] == 70 and len(stats["distribution"]) == 70  # every key of the window
    assert stats["entropy_bits"] == pytest.approx(math.log2(70))
    assert len(series.totals) == 65 and series.totals["_other"] == 6  # exported: 64 keys + _other


def test_name_tokens() -> None:
    assert metric_token("drafter/fwd.time") == "drafter_fwd_time"
    assert timing_token("forward_ms") == "forward" and timing_token("_ms") == "ms"
    assert counter_token("tokens_total") == "tokens"
    assert family_names(TIMING, "forward") == ("dflash_trainer_forward_seconds",)


def _ingest(agg: Aggregator, records: list, role: str = "r", worker: str = "w"):
    return ingest_records(agg, role, worker, records, Mapper())


def test_values_are_validated_per_kind() -> None:
    agg = Aggregator()
    records = [[TIMING, "t", 1.0], [TIMING, "t", -1.0], [TIMING, "t", math.nan], [TIMING, "t", True],
               [COUNT, "c", 3], [COUNT, "c", -3], [GAUGE, "g", math.inf], [GAUGE, "g", "7"], [GAUGE, "g", -2.5],
               [99, "x", 1.0], [GAUGE, ["list"], 1.0], [GAUGE, "a\nb", 1.0], "junk", [1, 2],
               [wire.RecordKind.PROFILE, 5, {"step_ms": 3.0, "bad": "x", "": 1.0}],
               [wire.RecordKind.PROFILE, -1, {}], [wire.RecordKind.ALLOCATOR, 0, [1, 2, 3]],
               [wire.RecordKind.ALLOCATOR, 0, [1, 2]]]
    accepted, rejected = _ingest(agg, records)
    assert accepted == 5
    assert rejected == {"invalid_value": 8, "unknown_kind": 1, "bad_name": 2, "malformed_record": 2}
    assert accepted + sum(rejected.values()) == len(records)
    assert agg.profile_entries_rejected == {("r", "w", "invalid_value"): 1, ("r", "w", "bad_name"): 1}
    report = agg.roll(1.0, 0.0, 2.0)
    by_name = {v.name: v for v in report.series}
    assert by_name["c"].window == {"delta": 3.0, "rate": 1.5, "total": 3.0}
    assert by_name["g"].window["last"] == -2.5
    assert by_name["step"].window["count"] == 1.0  # the profile's step_ms timing
    assert report.steps == {("r", "w"): 5} and report.allocator == {("r", "w", 0): (1, 2, 3)}


def test_cardinality_budget_and_name_collisions() -> None:
    agg = Aggregator(max_series=3)
    records = [[GAUGE, f"g{i}", 1.0] for i in range(5)]
    accepted, rejected = _ingest(agg, records)
    assert accepted == 3 and rejected == {"cardinality": 2}
    agg = Aggregator()
    accepted, rejected = _ingest(agg, [[GAUGE, "a.b", 1.0], [GAUGE, "a_b", 2.0], [COUNT, "a_b", 1],
                                       [GAUGE, "step", 1.0]])
    # "a_b" sanitizes onto the same family as "a.b"; a counter may not share a gauge's family;
    # "step" would clash with the daemon's own dflash_trainer_step.
    assert accepted == 1 and rejected == {"name_collision": 3}
    # names whose families or samples would repeat on the page: counter x exposes x_total, a
    # summary exposes _count and _sum
    for first, second in [([COUNT, "x", 1], [COUNT, "x_total_total", 1]), ([COUNT, "x", 1], [GAUGE, "x_total", 1.0]),
                          ([TIMING, "x_ms", 1.0], [GAUGE, "x_seconds_count", 1.0]),
                          ([GAUGE, "x_total", 1.0], [COUNT, "x", 1])]:
        accepted, rejected = _ingest(Aggregator(), [first, second])
        assert accepted == 1 and rejected == {"name_collision": 1}, (first, second)


def test_roles_share_a_family_and_a_remaining_collision_is_logged_once_with_both_names(
        caplog: pytest.LogCaptureFixture) -> None:
    agg = Aggregator()
    # timing("xyz") in one role, a profile's "xyz_ms" in another: one family, two label sets
    assert _ingest(agg, [[TIMING, "xyz", 1.0]], role="target", worker="0") == (1, {})
    assert _ingest(agg, [[wire.RecordKind.PROFILE, 1, {"xyz_ms": 2.0}]], role="drafter", worker="3") == (1, {})
    assert agg.profile_entries_rejected == {}
    # a counter and a gauge cannot share dflash_trainer_x, whatever their roles
    assert _ingest(agg, [[GAUGE, "x", 1.0], [COUNT, "c", 1]], role="target", worker="0") == (2, {})
    with caplog.at_level("WARNING", logger="sidecar"):
        for _ in range(3):
            assert _ingest(agg, [[COUNT, "x", 1]], role="drafter", worker="3") == (0, {"name_collision": 1})
            _ingest(agg, [[wire.RecordKind.PROFILE, 2, {"c_total": 1.0}]], role="drafter", worker="4")
    assert agg.profile_entries_rejected == {("drafter", "4", "name_collision"): 3}
    warnings = [r.getMessage() for r in caplog.records if "name collision" in r.getMessage()]
    assert len(warnings) == 2, warnings  # once per colliding name and sender
    assert "counter 'x' of role 'drafter' worker '3'" in warnings[0]
    assert "gauge 'x' of role 'target' worker '0'" in warnings[0]
    assert "gauge 'c_total' of role 'drafter' worker '4'" in warnings[1]
    assert "counter 'c' of role 'target' worker '0'" in warnings[1]
    report = agg.roll(1.0, 0.0, 1.0)
    assert sorted((v.role, v.worker) for v in report.series if v.name == "xyz") == [("drafter", "3"), ("target", "0")]


def test_idle_series_expire_and_free_the_budget() -> None:
    agg = Aggregator(max_series=1, series_ttl_s=10)
    assert _ingest(agg, [[GAUGE, "a", 1.0]]) == (1, {})
    agg.roll(0.0, 0.0, 1.0)
    agg.roll(5.0, 0.0, 1.0)
    assert agg.series_count() == 1
    agg.roll(20.0, 0.0, 1.0)
    assert agg.series_count() == 0 and agg.generation == 1
    assert _ingest(agg, [[GAUGE, "b", 1.0]]) == (1, {})
    assert _ingest(Aggregator(), [[GAUGE, "a.x", 1.0]])[0] == 1
    # once "a" expired, its family is free for another raw name
    agg = Aggregator(series_ttl_s=10)
    _ingest(agg, [[GAUGE, "a.x", 1.0]])
    agg.roll(0.0, 0.0, 1.0)
    agg.roll(20.0, 0.0, 1.0)
    assert _ingest(agg, [[GAUGE, "a_x", 1.0]]) == (1, {})


def _batch(seq: int, records_total: int, n: int, dropped: dict[str, int] | None = None) -> BatchMessage:
    frame = wire.encode_batch(enc, 7, seq, "drafter", "0", None, records_total, dropped or {},
                              [[GAUGE, "g", 1.0]] * n)
    msg = decode(frame)
    assert isinstance(msg, BatchMessage)
    return msg


def test_sender_accounting_counts_every_gap() -> None:
    reg = SenderRegistry()
    state = reg.on_batch(_batch(3, 100, 10), 0.0, 0.0)   # joined late: 90 records before us
    assert state is not None and state.before_join == 90
    reg.on_batch(_batch(4, 110, 10), 0.0, 0.0)
    reg.on_batch(_batch(7, 150, 10), 0.0, 0.0)           # 30 records in 2 messages lost in transit
    assert state.lost_in_transit == 30 and state.messages_lost == 2
    reg.on_batch(_batch(8, 160, 10, {"buffer_full": 5}), 0.0, 0.0)
    assert state.before_join + state.lost_in_transit + state.received == state.records_total == 160
    assert reg.totals["drafter", "0"].dropped == {"before_join": 90, "lost_in_transit": 30, "sender_buffer_full": 5}
    assert reg.on_batch(_batch(9, 120, 10), 0.0, 0.0) is None  # a counter going backwards is refused
    assert reg.messages_dropped == {"bad_sequence": 1}


def test_a_sender_without_a_hello_cannot_claim_a_history() -> None:
    # A shim says hello before its first batch; a frame under a fresh id claiming 10**9 records
    # would put 10**9 drops under any labels it names.
    reg = SenderRegistry()
    assert reg.on_batch(_batch(0, 10**9, 1, {"buffer_full": 10**9 - 1}), 0.0, 1_000_000.0) is None
    assert reg.messages_dropped == {"impossible_count": 1}
    assert reg.totals == {}
    # The same claim after a hello stating a start a day ago is one a real process can make.
    hello = HelloMessage(7, 0, {"pid": 1, "role": "drafter", "worker": "0", "started_unix_s": 1_000_000.0 - 86400})
    assert reg.on_hello(hello, 1.0, 1e9 + 1.0) is not None
    assert reg.on_batch(_batch(1, 10**9, 1, {"buffer_full": 10**9 - 1}), 1.0, 1_000_001.0) is not None


def test_the_kernels_pid_is_the_senders_pid_and_a_container_hello_is_accepted() -> None:
    # A trainer in a container states the pid of its own pid namespace (often 1); the kernel gives
    # the daemon's view of the same process, which is also what NVML reports.
    reg = SenderRegistry()
    state = reg.on_hello(HelloMessage(7, 0, {"pid": 1, "role": "drafter", "worker": "0"}), 0.0, 1e9, peer_pid=4242)
    assert state is not None and state.hello is not None and state.pid == 4242
    assert reg.on_batch(_batch(1, 10, 10), 0.0, 0.0, peer_pid=4242) is state
    assert reg.on_batch(_batch(2, 20, 10), 0.0, 0.0, peer_pid=4243) is None  # another process, same id
    assert reg.messages_dropped == {"wrong_peer": 1}


@pytest.mark.parametrize("frame, reason", [
    (b"", "malformed"), (b"\xc1", "malformed"), (enc.encode({"a": 1}), "malformed"),
    (enc.encode([2, 2, 1]), "unknown_version"), (enc.encode([1, 9]), "malformed"),
    (enc.encode([1, 2, 1, 0, "r", "w", None, 0, {}, [[1, "x", 1.0]]]), "malformed"),  # more records than total
    (enc.encode([1, 2, -1, 0, "r", "w", None, 1, {}, []]), "malformed"),
    (enc.encode([1, 2, 1, 0, "r" * 100, "w", None, 1, {}, []]), "malformed"),
    (b"\x91" * 10_000 + b"\x01", "malformed"),  # 10,000 nested arrays
    (b"\x00" * (wire.MAX_MESSAGE_BYTES + 1), "oversized"),
])
def test_bad_frames_are_named(frame: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as err:
        decode(frame)
    assert err.value.reason == reason
