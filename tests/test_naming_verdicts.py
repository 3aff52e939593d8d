"""End to end, the trainers that publish their own way: ``dflash-sidecar demo --style seed`` (the
DFlash pipeline as one profile dict per interval from a monitor thread) and ``--style generic``
(a plain 2-rank loop in every single-role verdict, publishing every occurrence and, the same
loop, per-batch-mean snapshots). Real daemon, real shim, real sockets; ``compute-bound`` and the
loop's ``throttled`` on the fake NVML driver. After warm-up the console verdict must name the
injected bottleneck in >= 95 % of each scenario's windows, and the snapshot form must give the
verdict the every-occurrence form gives. The long form is ``bench/bench_verdict.py``; both run the
demo through ``tests/verdict_demo.py``."""

from __future__ import annotations

import pytest

from tests import verdict_demo as demo
from tests.fake_nvml.helpers import library_or_skip


@pytest.mark.timeout(150)
def test_seed_style_and_plain_loops_get_the_injected_verdict() -> None:
    library_or_skip("full")  # loop-compute and loop-throttled run on the fake NVML driver
    scenarios = [s for s in demo.SCENARIOS if s.startswith(("seed-", "loop-", "snap-"))]
    results = demo.evaluate(scenarios, duration_s=7.0, interval_s=1.0, warmup=2, parallel=6)
    matrix = demo.confusion(results)
    report = {b: dict(c) for b, c in matrix.items()}
    for scenario, counts in matrix.items():
        assert sum(counts.values()) >= 3, report  # enough full windows were scored
        assert demo.accuracy(counts, scenario) >= 0.95, (scenario, report, results[scenario])
    assert {"input-bound", "host-bound", "communication-bound", "compute-bound", "throttled", "straggler",
            "balanced"} <= {demo.EXPECTED[s] for s in scenarios if s.startswith("loop-")}
    for name in ("none", "input", "host", "comm", "straggler"):  # snapshot form = every-occurrence form
        occurrence, snapshot = matrix[f"loop-{name}"], matrix[f"snap-{name}"]
        assert occurrence.most_common(1)[0][0] == snapshot.most_common(1)[0][0] == demo.EXPECTED[f"loop-{name}"]
