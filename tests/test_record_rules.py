"""One validation table (``wire.RECORD_RULES``), two users: the shim's strict mode and the daemon.

The same records, valid and each kind of invalid, go to a ``StrictChannel`` (which raises at the
call site) and, encoded by the publisher's own encoder, through the daemon's ingest loop (which
drops and counts by reason): both must reach the table's verdict, reason for reason.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

import msgspec
import numpy as np
import pytest

from sidecar.core.ingest import IngestLoop
from sidecar.core.pipeline import OnWindow, Pipeline
from sidecar.model.window import IngestReport
from tests.daemon_harness import NoSocket
from trainer_shim import wire
from trainer_shim.channel import StrictChannel
from trainer_shim.publisher import _coerce
from trainer_shim.wire import MAX_GAUGE_MAGNITUDE as G
from trainer_shim.wire import MAX_MAGNITUDE as M
from trainer_shim.wire import RecordKind

T, C, GA, CA, S, P, A = (int(k) for k in (RecordKind.TIMING, RecordKind.COUNT, RecordKind.GAUGE, RecordKind.CATEGORY,
                                          RecordKind.SCALAR, RecordKind.PROFILE, RecordKind.ALLOCATOR))
BAD_NAMES = [None, 3, "", "a\nb", "x" * (wire.MAX_NAME_BYTES + 1)]
NUMBERS = [0, 0.0, 1, 2.5, -1, -2.5, M, math.nextafter(M, math.inf), 1e19, -M, G, math.nextafter(G, math.inf), -G,
           math.nextafter(-G, -math.inf), 1e308, -1e308, math.nan, math.inf, -math.inf, True, False, None, "1", [1.0],
           np.float32(1.5), np.float64(-3.0), np.int64(7), np.float64(2e18), Fraction(1, 3)]
KEYS = [0, -5, 2**40, "k", "k" * wire.MAX_CATEGORY_KEY_CHARS, "k" * (wire.MAX_CATEGORY_KEY_CHARS + 1), "", "a\tb",
        1.5, None, True, np.int64(4)]


def _cases() -> list[tuple[int, Any, Any]]:
    cases: list[tuple[int, Any, Any]] = []
    for kind in (T, C, GA, S):
        cases += [(kind, f"m{kind}", v) for v in NUMBERS] + [(kind, n, 1.0) for n in BAD_NAMES]  # a name per kind
    cases += [(CA, "c", k) for k in KEYS] + [(CA, n, 1) for n in BAD_NAMES]
    cases += [(P, step, {}) for step in (0, 7, np.int64(3), -1, "1", None, True, 1.5)]
    cases += [(P, 1, {key: v}) for key in ("e_ms", "e") for v in NUMBERS if not isinstance(v, list)]  # as its kind
    cases += [(P, 1, {n: 1.0}) for n in BAD_NAMES if n is not None]
    cases += [(P, 1, {f"k{i}": 1.0 for i in range(n)}) for n in (wire.MAX_PROFILE_KEYS, wire.MAX_PROFILE_KEYS + 1)]
    return cases


CASES = _cases()


def _strict_verdict(kind: int, name: Any, value: Any) -> str | None:
    """None if the strict channel takes the call, else the reason its error names."""
    ch = StrictChannel("trainer", "0", 100, [])
    call = {T: ch.timing, C: ch.count, GA: ch.gauge, CA: ch.category, S: ch.scalar, P: ch.publish}[kind]
    try:
        call(name, value)
    except (TypeError, ValueError) as exc:
        reason = re.search(r"the daemon would drop it: (\w+)\)$", str(exc))
        assert reason, f"strict mode's message names no reason: {exc}"
        assert ch.pending() == 0
        return reason[1]
    assert ch.pending() == 1
    return None


def _daemon_report(records: list[list[Any]], same_sender: bool = False) -> IngestReport:
    """Each record from its own sender (worker ``w<i>``), or all in one batch of worker ``w0``,
    encoded as the flusher encodes it, through the daemon's ingest loop; the window's report."""
    encoder = msgspec.msgpack.Encoder(enc_hook=_coerce)
    reports: list[IngestReport] = []
    loop = IngestLoop(NoSocket(), 1.0, Pipeline(listeners=[OnWindow(reports.append)]))  # type: ignore[arg-type]
    batches = [records] if same_sender else [[record] for record in records]
    for i, batch in enumerate(batches):
        loop.handle_frame(wire.encode_batch(encoder, i + 1, 0, "trainer", f"w{i}", None, len(batch), {}, batch))
    loop._roll(0.0, 1.0)
    return reports[-1]


def _daemon_verdict(report: IngestReport, i: int, record: list[Any]) -> str | None:
    totals = report.totals[("trainer", f"w{i}")]
    if record[0] == P and type(record[2]) is dict and record[2] and not totals.dropped:  # one entry: the entry's
        assert totals.accepted == 1 and not totals.dropped, totals
        skipped = [r for (_, w, r), n in report.profile_entries_rejected.items() if w == f"w{i}" for _ in range(n)]
        assert len(skipped) <= 1, skipped
        return skipped[0] if skipped else None
    assert totals.accepted + sum(totals.dropped.values()) == 1, totals
    (reason,) = totals.dropped or (None,)
    return reason


def test_strict_mode_and_the_daemon_reach_the_tables_verdict_on_every_record() -> None:
    report = _daemon_report([[kind, name, value] for kind, name, value in CASES])
    disagreements = []
    for i, (kind, name, value) in enumerate(CASES):
        table = wire.record_problem(kind, _coerce_like_the_flusher(name), _coerce_like_the_flusher(value))
        if kind == P and table is None and value:
            for key, entry in value.items():
                table = table or wire.profile_entry_problem(key, _coerce_like_the_flusher(entry))
        verdicts = (table, _strict_verdict(kind, name, value), _daemon_verdict(report, i, [kind, name, value]))
        if len(set(verdicts)) != 1:
            disagreements.append(((kind, name, value), verdicts))
    assert disagreements == [], "(table, strict, daemon):\n" + "\n".join(map(repr, disagreements))
    # the cases cover every reason the table gives, and the bounds from both sides
    reasons = {wire.record_problem(k, _coerce_like_the_flusher(n), _coerce_like_the_flusher(v)) for k, n, v in CASES}
    assert reasons == {None, "bad_name", "invalid_value", "out_of_range", "malformed_record"}


@pytest.mark.parametrize("kind, name, value", [(P, 1, {"e_ms": [1.0]}), (P, 1, {"e": {"a": 1}}), (GA, "g", [[1.0]]),
                                               (T, "t", {"a": [1]}), (GA, b"bytes", 1.0), (P, 1, {None: 1.0})])
def test_records_beyond_the_decoders_structure_are_refused_by_both(kind: int, name: Any, value: Any) -> None:
    """Types and sizes msgpack's schema states are the decode stage's to judge (before any Python
    object is built): a value nested deeper than the protocol's records, a binary name, a map
    key that is neither int nor str: ``malformed_record``
    there; strict mode refuses each too."""
    assert _strict_verdict(kind, name, value) is not None
    assert _daemon_verdict(_daemon_report([[kind, name, value]]), 0, [kind, name, value]) == "malformed_record"


def _coerce_like_the_flusher(value: Any) -> Any:
    return msgspec.msgpack.decode(msgspec.msgpack.Encoder(enc_hook=_coerce).encode(value))


def test_allocator_records_the_daemon_and_the_table_agree() -> None:
    """The allocator sampler's records (no strict call makes them)."""
    records = [[A, 0, [1, 2, 3]], [A, 3, [0, 0, 0]], [A, -1, [1, 2, 3]], [A, "0", [1, 2, 3]], [A, 0, [1, 2]],
               [A, 0, [1, 2, -3]], [A, 0, [1, 2, 3.0]], [A, 0, (1, 2, 3)], [A, 0, None], [A, True, [1, 2, 3]]]
    report = _daemon_report(records)
    for i, record in enumerate(records):
        decoded = _coerce_like_the_flusher(record)
        assert _daemon_verdict(report, i, record) == wire.record_problem(*decoded), record


@pytest.mark.parametrize("kind, verdict", [(0, "unknown_kind"), (8, "unknown_kind"), (-1, "unknown_kind"),
                                           (2**40, "unknown_kind"), ("1", "unknown_kind"), (None, "unknown_kind"),
                                           ([1], "unknown_kind"), (1.5, "unknown_kind"), (1.0, None), (True, None),
                                           (6.0, None)])
def test_a_kind_is_known_by_equality_to_both(kind: Any, verdict: str | None) -> None:
    """``True`` and ``1.0`` equal TIMING and ``6.0`` PROFILE, for the table as for the daemon's
    caches (dicts); the record after a TIMING of the same name lands in the same series either way."""
    record = [kind, 5 if kind == P else "m", {} if kind == P else 1.0]
    assert wire.record_problem(*record) == verdict
    report = _daemon_report([[T, "m", 1.0], record], same_sender=True)
    assert report.totals[("trainer", "w0")].dropped == ({} if verdict is None else {verdict: 1})


def test_strict_errors_are_type_or_value_errors_as_the_table_says() -> None:
    """A value of a type the kind never takes is a TypeError; the right type out of bounds a ValueError."""
    ch = StrictChannel("trainer", "0", 100, [])
    for call, error in [(lambda: ch.timing("t", "1"), TypeError), (lambda: ch.timing("t", True), TypeError),
                        (lambda: ch.timing("t", 1e19), ValueError), (lambda: ch.gauge("g", -1e151), ValueError),
                        (lambda: ch.count("c", -1), ValueError), (lambda: ch.category("c", 1.5), TypeError),
                        (lambda: ch.category("c", "k" * 65), ValueError), (lambda: ch.gauge(3, 1.0), TypeError),
                        (lambda: ch.gauge("", 1.0), ValueError), (lambda: ch.publish("1", {}), TypeError),
                        (lambda: ch.publish(-1, {}), ValueError), (lambda: ch.publish(1, {"a_ms": -1.0}), ValueError)]:
        with pytest.raises(error, match="telemetry") as caught:
            call()
        assert type(caught.value) is error
