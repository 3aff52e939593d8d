"""Abuse: random and hostile frames never crash ingest, and valid data is still counted exactly."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.core.ingest import IngestLoop
from sidecar.core.pipeline import Pipeline
from tests.daemon_harness import DaemonProc, NoSocket, publish, raw_publisher, wait_for
from trainer_shim import wire

enc = msgspec.msgpack.Encoder()

ints = st.integers(min_value=-2**63, max_value=2**63 - 1)
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**63, max_value=2**64 - 1),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=200), st.binary(max_size=50))
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=20)
records = st.lists(st.one_of(
    st.tuples(st.sampled_from(list(range(0, 9))), st.one_of(st.text(max_size=140), ints, st.none()), values),
    values), max_size=20)
batches = st.builds(
    lambda *fields: list(fields),  # [version, kind, sender, seq, role, worker, step, total, dropped, recs]
    st.sampled_from([1, 1, 1, 2, 0, -1]), st.sampled_from([1, 2, 2, 3]), st.integers(min_value=-1, max_value=2**63),
    st.integers(min_value=0, max_value=50), st.one_of(st.text(max_size=70), ints),
    st.text(max_size=10),
    st.one_of(st.none(), st.integers(min_value=-5, max_value=10**6)), st.integers(min_value=-1, max_value=10**6),
    st.dictionaries(st.text(max_size=10), ints, max_size=3), records)
encoded = batches.map(enc.encode)
frames = st.one_of(st.binary(max_size=300), encoded, encoded.map(lambda f: f[: len(f) // 2]), values.map(enc.encode))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(frames, max_size=8))
def test_any_frame_sequence_is_counted_never_raised(frame_list: list[bytes]) -> None:
    loop = IngestLoop(NoSocket(), 10.0, Pipeline())
    for frame in frame_list:
        loop.handle_frame(frame)
    assert loop.pipeline.internal_errors == 0
    for state in loop.pipeline.registry:
        # the accounting identity holds for every sender, whatever arrived
        assert state.received == state.accepted + sum(state.rejected.values())
        assert state.before_join + state.lost_in_transit + state.received == state.records_total
    loop._roll(1.0, 1.0)  # a window closes cleanly after abuse


def test_garbage_on_the_socket_leaves_valid_data_exact(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path)
    try:
        with raw_publisher(d.endpoint) as pub:
            garbage = [b"", b"\xc1\xc1", enc.encode([9, 2, 1]), enc.encode([1, 2, "x"]), b"\x91" * 50_000,
                       enc.encode([1, 2, 5, 0, "r", "w", None, 10**18, {}, [[1, "t", math.nan]] * 100]),
                       enc.encode([1, 2, 6, 0, "drafter", "9", None, 3, {},
                                   [[3, "g" * 500, 1.0], [77, "x", 1], "junk"]]),
                       enc.encode([1, 1, 5, 0, {"pid": "nope"}])]
            for _ in range(20):
                for frame in garbage:
                    pub.send(frame)
            # Taken in before the frame that makes ZeroMQ drop the link: frames still queued on a link
            # that ZeroMQ drops (at most RECV_HWM) go with it.
            wait_for(lambda: (d.value("dflash_sidecar_frames_received_total") or 0) >= 20 * len(garbage),
                     what="the garbage taken in")
            pub.send(b"\x00" * (wire.MAX_MESSAGE_BYTES + 10))  # over ZeroMQ's limit: the daemon drops the link
            res = publish(d.endpoint, "drafter", "0", 500)
            wait_for(lambda: d.value("dflash_sidecar_records_accepted_total", role="drafter", worker="0")
                     == res["records_total"], what="valid records counted")
            dropped = {lab["reason"]: v for lab, v in d.samples()["dflash_sidecar_messages_dropped_total"]}
            assert dropped["malformed"] >= 80 and dropped["unknown_version"] == 20
            per_record = {lab["reason"]: v for lab, v in d.samples()["dflash_sidecar_records_dropped_total"]
                          if lab["worker"] == "9"}
            # the same counters 20 times: counted once, the 19 replays refused as a whole
            assert per_record == {"bad_name": 1, "unknown_kind": 1, "malformed_record": 1}
            assert dropped["bad_sequence"] == 19  # sender 6 replayed 19 times
            assert dropped["impossible_count"] == 20  # sender 5 claims 10**18 records: no process makes that many
            assert d.value("dflash_trainer_tokens_total", role="drafter", worker="0") == 5000
            assert d.proc.poll() is None
    finally:
        d.stop()
