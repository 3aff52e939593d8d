"""End to end: ``dflash-sidecar demo --bottleneck X`` for every X, and the balanced demo on a fake
NVML driver reporting a throttled GPU (real shim, real sockets, real pynvml, real daemon, one
process per case, all in parallel); after the warm-up window the console
verdict must name the injected bottleneck in >= 95 % of windows. The long form, with its
confusion matrix, is ``bench/bench_verdict.py`` (bench/RESULTS_VERDICT.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.fake_nvml.helpers import library_or_skip

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_verdict.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_verdict", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(110)
def test_demo_verdict_matches_injected_bottleneck() -> None:
    library_or_skip("full")  # "throttled" runs the demo on the fake NVML driver
    bench = load_bench()
    results = bench.evaluate(list(bench.EXPECTED), duration_s=7.0, interval_s=1.0, warmup=1)
    matrix = bench.confusion(results)
    report = {b: dict(c) for b, c in matrix.items()}
    for bottleneck, counts in matrix.items():
        assert sum(counts.values()) >= 4, report  # enough full windows were scored
        assert bench.accuracy(counts, bottleneck) >= 0.95, (bottleneck, report, results[bottleneck])
    assert set(matrix["none"]) == {"balanced"}
