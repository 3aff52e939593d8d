"""The aggregator's fast paths give what the straightforward code gave: the per-sender cache
(same outcome on the first and every later batch, whatever arrives in which order; profile
entries and direct records share series) and exact window quantiles without np.quantile."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sidecar.aggregation.aggregator import Aggregator
from sidecar.aggregation.sketch import QUANTILES, QuantileBuffer, inverted_cdf_rank
from sidecar.core.pipeline import ingest_records
from sidecar.model.mapped import Mapped
from sidecar.model.window import GAUGE, PROFILE, TIMING
from sidecar.processing.mapping import Mapper


def _ingest(agg: Aggregator, records: list) -> tuple[int, dict[str, int]]:
    return ingest_records(agg, "r", "w", records, Mapper())


def _window(agg: Aggregator, kind: int, token: str) -> dict:
    report = agg.roll(0.0, 0.0, 1.0)
    return next(v.window for v in report.series if v.kind == kind and v.name == token)


def test_profile_entries_and_direct_records_share_a_series() -> None:
    agg = Aggregator()
    for _ in range(2):  # the second batch runs from the cache
        assert _ingest(agg, [[PROFILE, 1, {"fwd_ms": 2.0, "loss": 1.5}], [TIMING, "fwd_ms", 4.0],
                                    [GAUGE, "loss", 0.5]]) == (3, {})
    assert _window(agg, TIMING, "fwd")["count"] == 4.0
    agg2 = Aggregator()
    assert _ingest(agg2, [[TIMING, "fwd_ms", 4.0], [PROFILE, 1, {"fwd_ms": 2.0}]]) == (2, {})
    assert _window(agg2, TIMING, "fwd")["count"] == 2.0


def test_rejected_profile_entries_are_counted_the_same_from_the_cache() -> None:
    agg = Aggregator()
    profile = {"": 1.0, "x" * 300: 1.0, 5: 2.0, "neg_ms": -1.0, "nan": math.nan, "ok": 1.0}
    for n in (1, 2):
        assert _ingest(agg, [[PROFILE, n, profile]]) == (1, {})
        assert agg.profile_entries_rejected == {("r", "w", "bad_name"): 3 * n, ("r", "w", "invalid_value"): 2 * n}


def test_a_profile_step_is_never_taken_for_a_cached_entry() -> None:
    agg = Aggregator()
    _ingest(agg, [[PROFILE, 1, {7: 1.0}]])  # int key: a bad name, cached under (PROFILE, 7)
    assert _ingest(agg, [[PROFILE, 7, {"loss": 1.0}]]) == (1, {})
    assert agg.roll(0.0, 0.0, 1.0).steps == {("r", "w"): 7}


def test_cardinality_refusals_are_not_cached() -> None:
    agg = Aggregator(max_series=1)
    assert _ingest(agg, [[PROFILE, 1, {"a": 1.0, "b": 2.0}]]) == (1, {})
    assert agg.profile_entries_rejected == {("r", "w", "cardinality"): 1}
    assert (PROFILE, "b") not in agg.names_of(0) and (GAUGE, "b") not in agg.names_of(0)
    assert _ingest(agg, [[GAUGE, "b", 1.0]]) == (0, {"cardinality": 1})


def test_a_batch_remembers_its_refusals_and_the_next_batch_starts_afresh() -> None:
    # the sender's turn is reused batch after batch: what one batch refused over its owner's
    # budget of new names is asked again by the next, once the window gave the budget back
    agg = Aggregator()
    agg.resolve_budget = 1
    assert _ingest(agg, [[GAUGE, "a", 1.0], [GAUGE, "b", 1.0], [GAUGE, "b", 2.0]]) == (1, {"cardinality": 2})
    assert _ingest(agg, [[GAUGE, "b", 3.0]]) == (0, {"cardinality": 1})  # the same window: still over
    agg.roll(0.0, 0.0, 1.0)
    assert _ingest(agg, [[GAUGE, "b", 4.0]]) == (1, {})
    assert _window(agg, GAUGE, "b")["last"] == 4.0


def test_a_pending_batch_is_resumed_before_its_senders_next_batch_or_refused() -> None:
    # a profile stopped at its second key for mapping: resumed after the sender's next batch began,
    # it would replay the profile from its first key (counted twice); the aggregator says so instead
    agg, mapper = Aggregator(), Mapper()
    pending = agg.ingest(0, 0, "r", "w", [[PROFILE, 1, {"a_ms": 1.0}]])[2]  # stops: a_ms needs mapping
    assert pending is not None
    done = agg.resume(pending, mapper.map_names(pending.unmapped, "r", "w"))
    assert done[:2] == (1, {}) and done[2] is None
    first = agg.ingest(0, 0, "r", "w", [[PROFILE, 3, {"a_ms": 1.0, "b_ms": 2.0}]])[2]
    assert first is not None and first.unmapped == ((PROFILE, "b_ms"),)
    agg.ingest(0, 0, "r", "w", [[GAUGE, "loss", 1.0]])  # the sender's next batch begins
    with pytest.raises(ValueError, match="resumed after"):
        agg.resume(first, mapper.map_names(first.unmapped, "r", "w"))


def test_exact_window_quantiles_equal_numpy_inverted_cdf() -> None:
    rng = np.random.default_rng(4)
    for n in [1, 2, 3, 4, 5, 19, 20, 21, 99, 100, 101, 1000, 4099]:
        for values in (rng.lognormal(1.0, 1.0, n), rng.integers(0, 5, n).astype(float), np.arange(n, 0, -1.0)):
            buf = QuantileBuffer()
            for v in values.tolist():
                buf.append(v)
            stats = buf.close_window()
            assert stats is not None
            expected = np.quantile(values, QUANTILES, method="inverted_cdf")
            assert (stats["p50"], stats["p95"]) == (float(expected[0]), float(expected[1])), n
            assert stats["sum"] == float(values.sum()) and stats["max"] == float(values.max())
    for n in range(1, 300):
        for q in (0.5, 0.95, 0.01, 0.99, 1.0):
            assert sorted(range(n))[inverted_cdf_rank(n, q)] == np.quantile(np.arange(n), q, method="inverted_cdf")


def test_new_names_are_mapped_once_each_where_the_batch_meets_them() -> None:
    asked: list[tuple[int, str]] = []

    class Asked(Mapper):
        def resolve(self, kind: int, raw: str, role: str, worker: str) -> Mapped:
            asked.append((kind, raw))
            return super().resolve(kind, raw, role, worker)

    agg, mapper = Aggregator(), Asked()
    assert ingest_records(agg, "r", "w", [[GAUGE, "old", 1.0]], mapper) == (1, {})
    batch = [[GAUGE, "new", 1.0], [GAUGE, "old", 2.0], [PROFILE, 3, {"new": 2.0, "p_ms": 1.0}], [GAUGE, "new", 3.0],
             [TIMING, "p_ms", 2.0]]
    assert ingest_records(agg, "r", "w", batch, mapper) == (5, {})
    # a dict key is asked as (PROFILE, key): the mapping stage decides its kind from its unit; the
    # record under the same name finds the series the key made
    assert asked == [(GAUGE, "old"), (GAUGE, "new"), (PROFILE, "new"), (PROFILE, "p_ms")]
    views = {v.name: v for v in agg.roll(0.0, 0.0, 1.0).series}
    assert views["new"].window["last"] == 3.0 and views["new"].window["count"] == 3.0  # 1.0, the entry 2.0, 3.0
    assert views["old"].window["last"] == 2.0 and views["p"].window["count"] == 2.0
    assert ingest_records(agg, "r", "w", batch, mapper) == (5, {}) and len(asked) == 4  # known now: not asked again
