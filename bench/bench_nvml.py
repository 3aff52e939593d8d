"""Cost of one NVML poll cycle for 8 GPUs, on the fake NVML driver (no GPU needed).

Runs the real ``NvmlSource`` poller thread against the fake driver (tests/fake_nvml) and reads
each poll's own duration and call count from its snapshots, plus the poller thread's CPU time.
Side by side: the same poller with 8 trainer pids to match (adds the process queries), and a
naive loop that reads the same values with one NVML call per value (no field batching).

The fake answers a call in about a microsecond; a real driver needs an ioctl per call (tens of
microseconds), so on real GPUs the call count dominates: see bench/gpu_check.py for real
hardware. Target (SPEC §7): <= 5 ms per poll of 8 GPUs.

    python bench/bench_nvml.py [--polls 500] [--interval 0.01]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sidecar.sources.nvml import NvmlSource  # noqa: E402
from sidecar.sources.nvml_driver import NvmlDriver, Outcome  # noqa: E402
from tests.fake_nvml import FakeNvml, build_fake_nvml  # noqa: E402

GPUS = 8


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _thread_cpu_s(thread: threading.Thread) -> float:
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def bench_source(library: Path, control: FakeNvml, polls: int, interval_s: float, trainer: bool
                 ) -> tuple[list[float], float, float, float]:
    """Run the poller; returns (poll durations s, calls/poll from snapshots, calls/poll seen by the
    driver, poller CPU s per poll)."""
    source = NvmlSource(interval_s=interval_s, library_path=str(library))
    if trainer:
        control.set({f"gpu.{i}.processes": {1000 + i: 2**30, 5000 + i: 2**29} for i in range(GPUS)})
        source.set_trainer_processes({1000 + i: ("target" if i < 6 else "drafter", str(i)) for i in range(GPUS)})
    source.start()
    while source.status().polls_total < 5:  # warm-up: GPM needs two samples
        time.sleep(0.005)
    thread = next(t for t in threading.enumerate() if t.name == "nvml-poller")
    durations: list[float] = []
    calls: list[int] = []
    seen = source.latest()
    cpu0, fake0 = _thread_cpu_s(thread), control.call_count()
    polls0 = source.status().polls_total
    while len(durations) < polls:
        time.sleep(interval_s / 5)
        snapshot = source.latest()
        if snapshot is not seen and snapshot is not None:
            seen = snapshot
            durations.append(snapshot.poll_duration_s)
            calls.append(snapshot.nvml_calls)
    done = source.status().polls_total - polls0
    cpu_per_poll = (_thread_cpu_s(thread) - cpu0) / done
    fake_per_poll = (control.call_count() - fake0) / done
    source.shutdown()
    return durations, statistics.mean(calls), fake_per_poll, cpu_per_poll


def bench_naive(polls: int) -> tuple[list[float], float]:
    """The same values with one call per value, on this thread. Returns (durations s, calls/poll)."""
    driver = NvmlDriver(logging.getLogger("bench"))
    driver.load(None)  # the fake is already loaded in this process
    handles = [driver.try_call("nvmlDeviceGetHandleByIndex", i)[1] for i in range(GPUS)]
    calls: list[Callable[[Any], tuple[Outcome, Any]]] = [
        lambda h: driver.try_call("nvmlDeviceGetUtilizationRates", h),
        lambda h: driver.try_call("nvmlDeviceGetMemoryInfo", h),
        lambda h: driver.try_call("nvmlDeviceGetTemperature", h, 0),
        lambda h: driver.try_call("nvmlDeviceGetClockInfo", h, 1),
        lambda h: driver.try_call("nvmlDeviceGetClockInfo", h, 2),
        lambda h: driver.try_call("nvmlDeviceGetCurrentClocksEventReasons", h),
        lambda h: driver.try_call("nvmlDeviceGetPowerUsage", h),
        lambda h: driver.try_call("nvmlDeviceGetEnforcedPowerLimit", h),
        lambda h: driver.try_call("nvmlDeviceGetTotalEnergyConsumption", h),
        *[lambda h, f=f: driver.field_values(h, [f], 0) for f in (82, 197, 198, 3, 4)],
    ]
    durations = []
    for _ in range(polls):
        before, started = driver.calls, time.perf_counter()
        for handle in handles:
            for call in calls:
                outcome = call(handle)
                assert outcome[0] is Outcome.OK
        durations.append(time.perf_counter() - started)
    per_poll = (driver.calls - before)
    driver.shutdown()
    return durations, float(per_poll)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=500)
    parser.add_argument("--interval", type=float, default=0.01, help="poll interval for the poller runs (s)")
    args = parser.parse_args()
    library = build_fake_nvml("full")
    workdir = Path(tempfile.mkdtemp(prefix="bench-nvml-"))
    control = FakeNvml(workdir / "control.txt", library, {"devices": GPUS})
    os.environ["FAKE_NVML_CONTROL"] = str(control.path)

    rows = []
    durations, calls, fake_calls, cpu = bench_source(library, control, args.polls, args.interval, trainer=False)
    rows.append(("sidecar poller", durations, calls, fake_calls, cpu))
    durations, calls, fake_calls, cpu = bench_source(library, control, args.polls, args.interval, trainer=True)
    rows.append(("sidecar poller + 8 trainer pids", durations, calls, fake_calls, cpu))
    durations, calls = bench_naive(args.polls)
    rows.append(("naive: one call per value", durations, calls, calls, float("nan")))

    print(f"NVML poll cost, {GPUS} fake GPUs, {args.polls} polls per row, Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs")
    print(f"{'scenario':34} {'median ms':>9} {'p99 ms':>8} {'max ms':>8} {'CPU ms/poll':>11} {'calls/poll':>10} "
          f"{'driver saw':>10}")
    for name, durations, calls, fake_calls, cpu in rows:
        print(f"{name:34} {statistics.median(durations) * 1e3:9.3f} {_percentile(durations, 0.99) * 1e3:8.3f} "
              f"{max(durations) * 1e3:8.3f} {cpu * 1e3:11.3f} {calls:10.1f} {fake_calls:10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
