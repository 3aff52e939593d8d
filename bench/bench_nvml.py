"""NVML's cost on the fake NVML driver (no GPU needed): one poll cycle, and the daemon's CPU at a
real driver's per-call costs.

Default: runs the real ``NvmlSource`` poller thread against the fake driver (tests/fake_nvml)
and reads each poll's own duration and call count from its snapshots, plus the poller thread's
CPU time. Side by side: the same poller with 8 trainer pids to match (adds the process queries),
and a naive loop that reads the same values with one NVML call per value (no field batching).
The fake answers a call in about a microsecond. Target (SPEC §7): <= 5 ms per poll of 8 GPUs.

``--daemon``: real ``dflash-sidecar run`` daemons on 8 fake GPUs that charge each call an H200's
CPU cost (``tests.fake_nvml.H200_COSTS_US``: the field batch 5 ms, the energy counter 3.1 ms,
GPM 5.3 ms, the rest 12 µs), default settings, side by side in alternating rounds: the
cost-aware poller, ``--nvml-cadence every-poll`` (every value every poll, as before), optionally
another checkout (``--baseline-tree``, e.g. a ``git archive`` of an older commit), and
``--no-gpu-metrics``. Per run: the daemon's CPU share of a core (/proc) over ``--seconds`` after
``--warmup``, the poller's own CPU and its NVML calls per kind (from the daemon's telemetry), and
how long a new utilization value takes to reach /metrics. Goal (issue 38): the cost-aware
daemon at <= 1.5 % of a core, utilization fresh every second.

    python bench/bench_nvml.py [--polls 500] [--interval 0.01]
    python bench/bench_nvml.py --daemon [--rounds 3] [--warmup 20] [--seconds 40] [--baseline-tree DIR]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
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


CONFIGS: dict[str, list[str]] = {
    "cost-aware (default)": [],
    "every-poll": ["--nvml-cadence", "every-poll"],
    "no GPU metrics": [],
}
"""Daemon runs of ``--daemon``: name -> extra ``run`` options (``no GPU metrics`` runs without NVML)."""
BASELINE = "baseline tree"


def run_daemon(name: str, tree: Path | None, gpus: int, warmup_s: float, seconds: float) -> dict[str, Any]:
    """One daemon run on ``gpus`` fake GPUs at an H200's per-call costs: its CPU over ``seconds``
    after ``warmup_s``, the poller's telemetry over the same window, then utilization freshness."""
    from bench.daemon_proc import fake_nvml
    from tests.fake_nvml import H200_COSTS_US
    from tests.launcher import DaemonProc, cpu_seconds

    workdir = Path(tempfile.mkdtemp(prefix="bench-nvml-daemon-"))
    fake = fake_nvml(str(workdir), gpus)
    fake.cost(H200_COSTS_US)
    gpu = name != "no GPU metrics"
    extra_env = {"LD_LIBRARY_PATH": str(fake.library.parent), "FAKE_NVML_CONTROL": str(fake.path)}
    if tree is not None:
        extra_env["PYTHONPATH"] = str(tree)
    daemon = DaemonProc(workdir, "--log-level", "warning", *CONFIGS.get(name, []), interval=None, gpu=gpu,
                        extra_env=extra_env)
    try:
        time.sleep(warmup_s)
        before, cpu0, t0 = daemon.samples(), cpu_seconds(daemon.pid), time.monotonic()
        time.sleep(seconds)
        cpu1, t1, after = cpu_seconds(daemon.pid), time.monotonic(), daemon.samples()
        out: dict[str, Any] = {"cpu_share": (cpu1 - cpu0) / (t1 - t0), **_telemetry(before, after, t1 - t0)}
        if gpu:
            out["fresh_s"] = [_freshness(daemon, fake, gpus, value) for value in (11, 22, 33)]
        return out
    finally:
        daemon.stop()


def _total(samples: Any, name: str, **labels: str) -> float:
    return sum(v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))


def _telemetry(before: Any, after: Any, seconds: float) -> dict[str, Any]:
    """The poller's own figures over the window: its CPU share, polls, NVML CPU per call kind."""
    polls = _total(after, "dflash_nvml_polls_total") - _total(before, "dflash_nvml_polls_total")
    if not polls or "dflash_nvml_call_cpu_seconds_total" not in after:  # no NVML, or a tree without the telemetry
        return {"polls_per_s": polls / seconds} if polls else {}
    calls = {lab["call"]: v for lab, v in after.get("dflash_nvml_call_cpu_seconds_total", [])}
    per_kind = {call: (v - _total(before, "dflash_nvml_call_cpu_seconds_total", call=call)) / polls
                for call, v in calls.items()}
    out: dict[str, Any] = {"polls_per_s": polls / seconds,
                           "nvml_cpu_ms_per_poll": sum(per_kind.values()) * 1e3,
                           "by_call_ms_per_poll": {k: v * 1e3 for k, v in sorted(per_kind.items()) if v > 0}}
    if "dflash_nvml_cpu_seconds_total" in after:
        out["poller_share"] = (_total(after, "dflash_nvml_cpu_seconds_total")
                               - _total(before, "dflash_nvml_cpu_seconds_total")) / seconds
        out["intervals_s"] = {lab["values"]: v for lab, v in after.get("dflash_nvml_interval_seconds", [])}
    return out


def _freshness(daemon: Any, fake: FakeNvml, gpus: int, percent: int) -> float:
    """Seconds from a new utilization on the last GPU to /metrics showing it (scraped every 50 ms).
    The change comes at a random point of the poll period (else each would follow the poll that
    showed the one before, and always wait a whole period)."""
    time.sleep(random.uniform(0.0, 1.0))
    fake.gpu(gpus - 1, utilization_gpu=percent)
    started = time.monotonic()
    while time.monotonic() - started < 10.0:
        if daemon.value("dflash_gpu_utilization_ratio", gpu=str(gpus - 1)) == percent / 100:
            return time.monotonic() - started
        time.sleep(0.05)
    return float("inf")


def daemon_comparison(args: argparse.Namespace) -> int:
    """``--daemon``: the configurations in alternating rounds; medians and ratios."""
    names = [*CONFIGS] + ([BASELINE] if args.baseline_tree else [])
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        order = names[round_ % len(names):] + names[:round_ % len(names)]
        for name in order:
            tree = Path(args.baseline_tree) if name == BASELINE else None
            runs[name].append(run_daemon(name, tree, args.gpus, args.warmup, args.seconds))
            print(f"round {round_ + 1} {name}: {runs[name][-1]['cpu_share'] * 100:.2f} % of a core", flush=True)
    print(f"\n{args.gpus} fake GPUs at an H200's per-call costs, daemon defaults, {args.rounds} alternating rounds, "
          f"{args.seconds:g} s each after {args.warmup:g} s; load average {os.getloadavg()}")
    every = statistics.median(r["cpu_share"] for r in runs["every-poll"])
    for name, rows in runs.items():
        _print_row(name, rows, every)
    return 0


def _print_row(name: str, rows: list[dict[str, Any]], every: float) -> None:
    share = statistics.median(r["cpu_share"] for r in rows)
    each = ", ".join(f"{r['cpu_share'] * 100:.2f}" for r in rows)
    line = f"{name:22} daemon {share * 100:6.2f} % of a core (runs {each}; {share / every * 100:.0f} % of every-poll)"
    if rows[0].get("nvml_cpu_ms_per_poll") is not None:
        line += (f"; NVML CPU {statistics.median(r['nvml_cpu_ms_per_poll'] for r in rows):.2f} ms/poll, "
                 f"{statistics.median(r['polls_per_s'] for r in rows):.2f} polls/s")
    if rows[0].get("poller_share") is not None:
        line += f"; poller {statistics.median(r['poller_share'] for r in rows) * 100:.2f} %"
    if rows[0].get("fresh_s"):
        fresh = [f for r in rows for f in r["fresh_s"]]
        line += f"; utilization on /metrics after {statistics.median(fresh):.2f} s median, {max(fresh):.2f} s max"
    print(line)
    last = rows[-1]
    if last.get("by_call_ms_per_poll"):
        print("    NVML CPU per poll by call (ms, last run): " + ", ".join(
            f"{k} {v:.3f}" for k, v in sorted(last["by_call_ms_per_poll"].items(), key=lambda kv: -kv[1])[:6]))
    if last.get("intervals_s"):
        print("    intervals (s, last run): " + ", ".join(f"{k} {v:.3g}" for k, v in last["intervals_s"].items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=500)
    parser.add_argument("--interval", type=float, default=0.01, help="poll interval for the poller runs (s)")
    parser.add_argument("--daemon", action="store_true", help="the daemons' CPU at an H200's per-call costs")
    parser.add_argument("--gpus", type=int, default=GPUS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds before each measurement")
    parser.add_argument("--seconds", type=float, default=40.0, help="seconds measured per run")
    parser.add_argument("--baseline-tree", default=None, help="another checkout to run the same way (its defaults)")
    args = parser.parse_args()
    if args.daemon:
        return daemon_comparison(args)
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
