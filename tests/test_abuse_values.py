"""Abuse: values no trainer produces. Finite but absurd timings, counter increments and gauges
(1e308: two of them overflow a sum) are refused as ``out_of_range``, so no exported sample is
NaN or infinite, in the trainer's series or in the pipeline figures derived from them."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from sidecar.core.pipeline import ingest_records
from tests.daemon_harness import DaemonProc, raw_publisher, wait_for

enc = msgspec.msgpack.Encoder()


def test_absurd_finite_values_are_refused_and_nothing_exported_is_infinite(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path)
    try:
        with raw_publisher(d.endpoint) as pub:
            records = [[1, "forward_ms", 5.0], [2, "tokens", 100], [3, "loss_token_fraction", 0.5],
                       [1, "forward_ms", 1e308], [1, "forward_ms", 1e308], [2, "tokens", 1e308],
                       [2, "tokens", 1e308], [3, "loss_token_fraction", -1e308], [3, "loss_token_fraction", -1e308],
                       [6, 1, {"queue_wait_ms": 1e308, "step_ms": 1e308}]]
            pub.send(enc.encode([1, 2, 99, 0, "drafter", "0", 1, len(records), {}, records]))
            wait_for(lambda: d.value("dflash_sidecar_records_accepted_total", role="drafter"), what="the batch")
            wait_for(lambda: d.value("dflash_trainer_forward_seconds_count"), what="a window with the timing")
            text = d.text()
    finally:
        d.stop()
    bad = [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples
           if not math.isfinite(s.value)]
    assert bad == [], bad
    dropped = {}
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if s.name == "dflash_sidecar_records_dropped_total":
                dropped[s.labels["reason"]] = s.value
            if s.name == "dflash_sidecar_profile_entries_rejected_total":
                dropped["profile_" + s.labels["reason"]] = s.value
    assert dropped.get("out_of_range") == 6, dropped
    assert dropped.get("profile_out_of_range") == 2, dropped


def test_entropy_counts_every_key_of_the_window_within_its_bound() -> None:
    from sidecar.aggregation.aggregator import CATEGORY, Aggregator
    from sidecar.aggregation.series import MAX_WINDOW_KEYS, WINDOW_KEYS_BUDGET
    from sidecar.processing.mapping import Mapper

    agg = Aggregator()
    ingest_records(agg, "drafter", "0", [[CATEGORY, "bucket", k] for k in range(100) for _ in range(3)], Mapper())
    view = next(v for v in agg.roll(1.0, 1.0, 1.0).series if v.name == "bucket")
    assert abs(view.window["entropy_bits"] - math.log2(100)) < 1e-9, view.window["entropy_bits"]
    assert len(view.cumulative["totals"]) == 65  # exported keys stay capped: 64 and _other
    # many series with many keys: the window's extra keys are bounded in all
    for s in range(200):
        ingest_records(agg, "drafter", "0", [[CATEGORY, f"c{s}", k] for k in range(2000)], Mapper())
    windows = [v.window for v in agg.roll(2.0, 2.0, 1.0).series if v.window and v.name.startswith("c")]
    keys = sum(len(w["distribution"]) for w in windows)
    assert max(len(w["distribution"]) for w in windows) <= MAX_WINDOW_KEYS + 1
    assert keys <= 200 * 65 + WINDOW_KEYS_BUDGET
