"""A load publisher process: ``threads`` worker threads, each with its own
``telemetry.channel(role, worker)``, calling the shim at a steady rate and timing every call.

Run as ``python -m tests.soak.publisher '<json spec>'``. Controlled over stdin, one command a
line, each answered by one JSON line on stdout:

- ``pause``: every worker parks between two calls, the shim is flushed, and the answer is sent
  once every channel's own identity holds (``calls == records_total + sum(dropped)``, nothing
  pending): the per-channel figures are then final until ``resume``.
- ``resume``: workers carry on.
- ``stop``: as ``pause``, then the shim is closed and the process exits. The answer carries
  ``telemetry.stats()`` per channel and every worker's call timings.

Spec keys: ``endpoint``, ``role``, ``name`` (worker labels are ``<name>-<thread>``), ``threads``,
``rate`` (records per second for the whole process), ``bad_every`` (every n-th call is a bad
argument the daemon must reject and count; 0 for none), ``flush_interval_s``, ``wandb_run_id``.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from typing import Any

from trainer_shim import telemetry

BURST_S = 0.02
"""Each worker makes its calls in bursts of about this many seconds' worth, then sleeps."""


class Gate:
    """Pause/stop requests from the main thread to the workers."""

    def __init__(self) -> None:
        self.pause_requested = False
        self.stopping = False
        self.resumed = threading.Event()


class Worker(threading.Thread):
    """Calls the shim ``rate`` times a second; keeps its own count and call-time histogram."""

    def __init__(self, role: str, worker: str, rate: float, bad_every: int, gate: Gate) -> None:
        super().__init__(name=f"soak-{worker}", daemon=True)
        self.role, self.worker, self.rate, self.bad_every, self.gate = role, worker, rate, bad_every, gate
        self.calls = 0
        self.worst_ns = 0
        self.hist = [0] * 64
        """hist[k]: calls that took [2**(k-1), 2**k) ns."""
        self.ready = threading.Event()
        self.parked = threading.Event()
        self.active_s = 0.0

    def run(self) -> None:
        ch = telemetry.channel(self.role, self.worker)  # created on this thread: one channel per thread
        cycle = [
            (ch.count, ("tokens", 10)), (ch.timing, ("forward_ms", 3.5)), (ch.gauge, ("queue_depth", 4)),
            (ch.category, ("bucket", 2)), (ch.timing, ("backward_ms", 7.25)), (ch.count, ("batches", 1)),
            (ch.gauge, ("prefetch_fill_ratio", 0.5)), (ch.scalar, ("loss", 0.25)),
            (ch.category, ("bucket", 4)), (ch.publish, (0, {"step_ms": 12.0, "loss_token_fraction": 0.3})),
        ]
        bad = [(ch.timing, ("bad_ms", math.nan)), (ch.gauge, ("", 1.0)), (ch.count, ("neg", -1))]
        burst = max(1, round(self.rate * BURST_S))
        period = burst / self.rate
        perf = time.perf_counter_ns
        hist = self.hist
        worst = 0
        i = step = 0
        self.ready.set()
        self.gate.resumed.wait()
        next_t = started = time.monotonic()
        while not self.gate.stopping:
            if self.gate.pause_requested:
                self.active_s += time.monotonic() - started
                self.parked.set()
                self.gate.resumed.wait()
                self.parked.clear()
                next_t = started = time.monotonic()
                continue
            for _ in range(burst):
                i += 1
                if self.bad_every and i % self.bad_every == 0:
                    fn, args = bad[i // self.bad_every % len(bad)]
                else:
                    k = i % 10
                    fn, args = cycle[k]
                    if k == 9:  # the profile snapshot of a new step
                        step += 1
                        args = (step, args[1])
                t0 = perf()
                fn(*args)
                dt = perf() - t0
                hist[dt.bit_length()] += 1
                if dt > worst:
                    worst = dt
            self.calls = i
            self.worst_ns = worst
            next_t += period
            delay = next_t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            elif delay < -1.0:
                next_t = time.monotonic()  # fell far behind (CPU starved): do not burst to catch up
        self.active_s += time.monotonic() - started
        self.parked.set()


def settle(workers: list[Worker], timeout_s: float = 10.0) -> tuple[bool, dict[tuple[str, str], dict[str, Any]]]:
    """Flush until every channel's identity holds; returns (settled, stats)."""
    calls = {(w.role, w.worker): w.calls for w in workers}
    deadline = time.monotonic() + timeout_s
    while True:
        telemetry.flush()
        stats = telemetry.stats()
        ok = all(st["pending"] == 0 and st["records_total"] + sum(st["dropped"].values()) == calls.get(key, 0)
                 for key, st in stats.items())
        if ok or time.monotonic() > deadline:
            return ok, stats
        time.sleep(0.01)


def report(event: str, workers: list[Worker], settled: bool, stats: dict[tuple[str, str], dict[str, Any]]) -> None:
    calls = {w.worker: w.calls for w in workers}
    channels = {worker: {"calls": calls.get(worker, 0), **st} for (_, worker), st in stats.items()}
    hist = [sum(w.hist[k] for w in workers) for k in range(64)]
    out = {"event": event, "unix_s": time.time(), "settled": settled, "channels": channels,
           "calls": sum(calls.values()), "active_s": max((w.active_s for w in workers), default=0.0),
           "worst_call_ns": max((w.worst_ns for w in workers), default=0),
           "worst_call_ns_by_worker": {w.worker: w.worst_ns for w in workers}, "call_ns_log2_hist": hist}
    print(json.dumps(out), flush=True)


def main() -> int:
    spec = json.loads(sys.argv[1])
    role, name = spec["role"], spec["name"]
    telemetry.configure(endpoint=spec["endpoint"], role=role, worker=f"{name}-main",
                        flush_interval_s=spec.get("flush_interval_s", 0.02), allocator_interval_s=0,
                        wandb_run_id=spec.get("wandb_run_id"))
    gate = Gate()
    n = spec["threads"]
    workers = [Worker(role, f"{name}-{t}", spec["rate"] / n, spec.get("bad_every", 0), gate) for t in range(n)]
    for w in workers:
        w.start()
    for w in workers:
        w.ready.wait(10)
    print(json.dumps({"event": "ready", "channels": [w.worker for w in workers]}), flush=True)
    gate.resumed.set()
    for line in sys.stdin:
        command = line.strip()
        if command in ("pause", "stop"):
            gate.resumed.clear()
            gate.pause_requested = True
            gate.stopping = command == "stop"
            for w in workers:
                w.parked.wait(10)
            settled, stats = settle(workers)
            if command == "stop":
                telemetry.close()
                report("stopped", workers, settled, stats)
                return 0
            report("paused", workers, settled, stats)
        elif command == "resume":
            gate.pause_requested = False
            gate.resumed.set()
            print(json.dumps({"event": "resumed"}), flush=True)
    gate.stopping = True
    gate.resumed.set()
    telemetry.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
