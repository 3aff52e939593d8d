"""The capture breakdown's arithmetic on a Kineto-shaped GPU trace written here, with known
kernels, launches and gaps: every second of host wait, kernel wait and other is known exactly."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.aggregation.trace_breakdown import breakdown, load_trace
from sidecar.model.trace import TraceBreakdown

PID, TID = 4242, 4242
US = 1e-6


def _x(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": PID if cat in ("cpu_op", "user_annotation", "cuda_runtime")
            else 0, "tid": TID if cat in ("cpu_op", "user_annotation", "cuda_runtime") else 7,
            "ts": ts, "dur": dur, "args": args}


def _kernel(name: str, start: float, end: float, launched: float, corr: int,
            cat: str = "kernel") -> list[dict[str, Any]]:
    """A device activity and the runtime call that launched it (same correlation)."""
    return [_x(cat, name, start, end - start, correlation=corr, stream=7, device=0),
            _x("cuda_runtime", "cudaLaunchKernel", launched, 4, correlation=corr)]


def fixture_trace() -> dict[str, Any]:
    """Two steps of 1000 us each, 10 us apart. Step 1 [1000, 2000): a host wait of 100 at its
    start (the first kernel launched at 1050), a kernel wait of 10 (launched early, 10 us gap),
    an other of 100 (launched early, 100 us gap), a trailing host wait of 150 (the next kernel
    launched at 2020). Step 2 [2010, 3010): host waits of 40 and 20, an other of 200, a kernel
    running past the step's end."""
    events: list[dict[str, Any]] = [
        _x("user_annotation", "ProfilerStep#0", 1000, 1000),
        _x("user_annotation", "ProfilerStep#1", 2010, 1000),
        {**_x("gpu_user_annotation", "ProfilerStep#0", 1100, 700), "pid": 0, "tid": 7},  # GPU-side copy: ignored
        _x("cpu_op", "aten::mm", 1020, 280), _x("cpu_op", "aten::empty", 1030, 10),
        _x("cpu_op", "aten::add", 1350, 50), _x("cpu_op", "aten::mm", 2015, 185),
        _x("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 1900, 90),
        {"ph": "M", "name": "process_name", "pid": PID, "args": {"name": "python"}},
    ]
    events += _kernel("sgemm", 1100, 1400, 1050, 1)
    events += _kernel("vectorized_elementwise", 1410, 1500, 1200, 2)
    events += _kernel("ncclAllReduce_RING", 1600, 1800, 1300, 3)
    events += _kernel("Memcpy HtoD (Pageable -> Device)", 1700, 1850, 1650, 4, cat="gpu_memcpy")
    events += _kernel("vectorized_elementwise", 2050, 2300, 2020, 5)
    events += _kernel("sgemm", 2300, 2600, 2100, 6)
    events += _kernel("sgemm", 2620, 2700, 2605, 7)
    events += _kernel("reduce_kernel", 2900, 3100, 2690, 8)
    return {"schemaVersion": 1, "traceEvents": events}


def test_the_fixture_breakdown_is_exact() -> None:
    b = breakdown(fixture_trace())
    assert b.has_gpu and [s.label for s in b.steps] == ["ProfilerStep#0", "ProfilerStep#1"]
    one, two = b.steps
    expect_one = dict(wall_s=1000, gap_before_s=None, gpu_busy_s=640, idle_host_wait_s=250, idle_kernel_wait_s=10,
                      idle_other_s=100, communication_s=200, memcpy_s=150, compute_s=390, host_busy_s=330,
                      data_wait_s=90)
    expect_two = dict(wall_s=1000, gap_before_s=10, gpu_busy_s=740, idle_host_wait_s=60, idle_kernel_wait_s=0,
                      idle_other_s=200, communication_s=0, memcpy_s=0, compute_s=740, host_busy_s=185, data_wait_s=0)
    for step, expect in ((one, expect_one), (two, expect_two)):
        for name, us in expect.items():
            got = getattr(step, name)
            assert (got is None) if us is None else got == pytest.approx(us * US, abs=1e-12), (step.label, name, got)
        idle = step.idle_host_wait_s + step.idle_kernel_wait_s + step.idle_other_s
        assert step.gpu_busy_s + idle == pytest.approx(step.wall_s, abs=1e-12)
    assert b.total("idle_host_wait_s") == pytest.approx(310 * US, abs=1e-12)
    assert b.share("gpu_busy_s") == pytest.approx(1380 / 2000)
    assert [(h.name, round(h.total_s / US), h.count) for h in b.top_kernels] == [
        ("sgemm", 680, 3), ("vectorized_elementwise", 340, 2), ("ncclAllReduce_RING", 200, 1),
        ("reduce_kernel", 200, 1), ("Memcpy HtoD (Pageable -> Device)", 150, 1)]
    # Host ops by self time: aten::mm 280 - 10 (its child) + 185.
    assert [(h.name, round(h.total_s / US), h.count) for h in b.top_host_ops] == [
        ("aten::mm", 455, 2), ("aten::add", 50, 1), ("aten::empty", 10, 1)]


def test_the_threshold_moves_a_gap_between_kernel_wait_and_other() -> None:
    b = breakdown(fixture_trace(), threshold_s=150 * US)
    assert b.steps[0].idle_kernel_wait_s == pytest.approx(110 * US, abs=1e-12)
    assert b.steps[0].idle_other_s == pytest.approx(0.0, abs=1e-12)
    assert b.kernel_wait_threshold_s == 150 * US


def test_without_device_activity_it_says_so_and_keeps_the_host_side() -> None:
    trace = fixture_trace()
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("cat") not in ("kernel", "gpu_memcpy")]
    b = breakdown(trace)
    assert not b.has_gpu and b.top_kernels == []
    assert b.steps[0].gpu_busy_s == 0.0 and b.steps[0].host_busy_s == pytest.approx(330 * US, abs=1e-12)


def test_the_stored_form_round_trips_and_refuses_others(tmp_path: Path) -> None:
    b = breakdown(fixture_trace())
    assert TraceBreakdown.from_json(json.loads(json.dumps(b.to_json()))) == b
    with pytest.raises(ValueError, match="schema"):
        TraceBreakdown.from_json({"schema": 99})
    with pytest.raises(ValueError, match="malformed"):
        TraceBreakdown.from_json({"schema": 1, "steps": [{"label": "x"}], "has_gpu": False})


def test_load_trace_reads_gzip_and_refuses_what_is_not_a_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(fixture_trace(), f)
    assert len(breakdown(load_trace(str(path))).steps) == 2
    bad = tmp_path / "bad.json"
    bad.write_text('{"events": []}')
    with pytest.raises(ValueError, match="not a Chrome trace"):
        load_trace(str(bad))
    bad.write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        load_trace(str(bad))


def test_the_prometheus_figures_of_a_capture() -> None:
    from prometheus_client import CollectorRegistry
    from prometheus_client.registry import Collector

    from sidecar.exporters.prometheus.captures import capture_families
    from sidecar.model.trace import CaptureView

    view = CaptureView("trainer", "0", "run-1", 1.7e9, breakdown(fixture_trace()))

    class One(Collector):
        def collect(self) -> Any:
            return capture_families(view, "h")

    registry = CollectorRegistry()
    registry.register(One())
    labels = {"host": "h", "role": "trainer", "worker": "0"}
    assert registry.get_sample_value("dflash_capture_step_seconds", labels) == pytest.approx(1000 * US)
    assert registry.get_sample_value("dflash_capture_gpu_busy_ratio", labels) == pytest.approx(1380 / 2000)
    assert registry.get_sample_value("dflash_capture_gpu_idle_ratio", {**labels, "cause": "host_wait"}) == \
        pytest.approx(310 / 2000)
    assert registry.get_sample_value("dflash_capture_communication_ratio", labels) == pytest.approx(200 / 2000)
    assert registry.get_sample_value("dflash_capture_last_timestamp_seconds", labels) == 1.7e9
    assert capture_families(None, "h") == []
