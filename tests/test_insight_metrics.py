"""The derived pipeline metrics of one window, from synthetic reports."""

from __future__ import annotations

import math

import pytest

from sidecar.aggregation.insight import OTHER, compute_insight
from tests.insight_synth import category, counter, gauge, pipeline, report, timing, worker


def test_throughput_per_role_and_worker() -> None:
    series = (worker("target", "0", {"forward": 30}, 30, duration_s=2.0)
              + worker("target", "1", {"forward": 30}, 20, duration_s=2.0))
    series += worker("drafter", "0", {"forward": 10}, 25, tokens_per_batch=2048, duration_s=2.0)
    insight = compute_insight(report(series, duration_s=2.0).window)
    target = insight.roles["target"]
    assert target.batches_per_s == pytest.approx(25.0) and target.workers == 2
    assert target.tokens_per_s == pytest.approx(50 * 4096 / 2.0)
    assert insight.roles["drafter"].tokens_per_s == pytest.approx(25 * 2048 / 2.0)
    rates = {(w.role, w.worker): w.batches_per_s for w in insight.workers}
    assert rates == {("drafter", "0"): 12.5, ("target", "0"): 15.0, ("target", "1"): 10.0}
    assert insight.target_drafter_batch_ratio == pytest.approx(2.0)
    assert target.rate_cv == pytest.approx(0.2)  # rates 15 and 10: std 2.5, mean 12.5
    assert insight.roles["drafter"].rate_cv is None  # one worker


def test_time_share_covers_wall_time_with_other() -> None:
    insight = compute_insight(report(worker("target", "0", {"data_wait": 2, "forward": 6, "pack": 1}, 100)).window)
    share = insight.roles["target"].time_share
    assert share["data_wait"] == pytest.approx(0.2) and share["forward"] == pytest.approx(0.6)
    assert share["pack"] == pytest.approx(0.1) and share[OTHER] == pytest.approx(0.1)
    assert sum(share.values()) == pytest.approx(1.0)


def test_time_share_is_scaled_when_timings_exceed_the_window() -> None:
    # A step that began in the previous window is reported whole in this one.
    insight = compute_insight(report(worker("drafter", "0", {"forward": 6, "backward": 9}, 100)).window)
    share = insight.roles["drafter"].time_share
    assert share["forward"] == pytest.approx(0.4) and share["backward"] == pytest.approx(0.6)
    assert share[OTHER] == 0.0


def test_queue_health() -> None:
    series = worker("target", "0", {"forward": 10, "queue_put_wait": 0}, 90)
    series += [gauge("target", "0", "queue_depth", 6.0), gauge("target", "0", "queue_capacity", 8, stale=True)]
    series += worker("drafter", "0", {"queue_wait": 3, "forward": 7}, 100)
    series += [gauge("drafter", "0", "prefetch_depth", 1.0), gauge("drafter", "0", "prefetch_capacity", 4)]
    insight = compute_insight(report(series).window)
    assert insight.queue_fill == pytest.approx(0.75)
    assert insight.prefetch_fill == pytest.approx(0.25)
    assert insight.ready_deficit == pytest.approx(0.3)
    assert insight.target_drafter_batch_ratio == pytest.approx(0.9)


def test_absent_inputs_are_none_not_zero() -> None:
    insight = compute_insight(report(worker("drafter", "0", {"forward": 5}, 10)).window)
    assert insight.queue_fill is None and insight.prefetch_fill is None
    assert insight.target_drafter_batch_ratio is None and insight.bucket_entropy_bits is None
    assert insight.roles["drafter"].time_share["forward"] == pytest.approx(0.05)
    assert insight.ready_deficit is None  # no queue_wait timing published
    empty = compute_insight(report([]).window)
    assert empty.roles == {} and empty.verdict.name == "unknown"


def test_worker_score_uses_median_busy_time() -> None:
    fast = {"forward": 8, "backward": 14, "optimizer": 4}
    slow = {k: v * 2 for k, v in fast.items()}
    insight = compute_insight(pipeline({"forward": 30}, fast, drafter_override={"0": slow}).window)
    drafters = {w.worker: w for w in insight.workers if w.role == "drafter"}
    assert drafters["0"].busy_ms == pytest.approx(52, rel=0.05)
    assert drafters["0"].score == pytest.approx(0.5, rel=0.05) and drafters["0"].straggler
    assert drafters["1"].score == pytest.approx(1.0) and not drafters["1"].straggler


def test_worker_score_falls_back_to_rates_without_phase_timings() -> None:
    series = [counter("drafter", "0", "batches", 10), counter("drafter", "1", "batches", 40)]
    insight = compute_insight(report(series).window)
    scores = {w.worker: w.score for w in insight.workers}
    assert scores == {"0": 0.25, "1": 1.0}
    single = compute_insight(report([counter("drafter", "0", "batches", 10)]).window)
    assert single.workers[0].score is None and not single.workers[0].straggler


def test_batch_composition() -> None:
    series = [counter("drafter", "0", "batches", 4), counter("drafter", "0", "tokens", 4000),
              counter("drafter", "0", "loss_tokens", 1000), gauge("drafter", "0", "batch_tokens", 1000.0, count=4),
              gauge("drafter", "1", "batch_tokens", 3000.0, count=12),
              category("drafter", "0", "bucket", {"0": 5}), category("drafter", "1", "bucket", {"1": 5})]
    insight = compute_insight(report(series).window)
    assert insight.batch_tokens_mean == pytest.approx(2500.0)  # count-weighted
    assert insight.loss_token_ratio == pytest.approx(0.25)
    assert insight.bucket_entropy_bits == pytest.approx(1.0)  # two buckets, equal counts once merged


def test_batch_composition_fallbacks() -> None:
    series = [counter("drafter", "0", "batches", 4), counter("drafter", "0", "tokens", 8192),
              gauge("drafter", "0", "loss_token_fraction", 0.4)]
    insight = compute_insight(report(series).window)
    assert insight.batch_tokens_mean == pytest.approx(2048.0)
    assert insight.loss_token_ratio == pytest.approx(0.4)


def test_stale_series_do_not_make_workers() -> None:
    series = [gauge("target", "9", "queue_capacity", 8, stale=True), timing("drafter", "0", "forward", 5, 10)]
    insight = compute_insight(report(series).window)
    assert "target" not in insight.roles
    assert not math.isnan(insight.roles["drafter"].time_share["forward"])


def test_a_phase_without_samples_this_window_counts_zero() -> None:
    # Drafters that only report queue_wait when they actually wait: no wait this window = 0.
    idle = timing("drafter", "0", "queue_wait", 5, 1)
    idle = type(idle)(idle.kind, idle.name, idle.role, idle.worker, None, idle.cumulative, idle.meaning)
    insight = compute_insight(report(worker("drafter", "0", {"forward": 5}, 100) + [idle]).window)
    assert insight.ready_deficit == 0.0
    assert insight.roles["drafter"].time_share["queue_wait"] == 0.0
