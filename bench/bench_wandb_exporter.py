"""What the W&B exporter costs the thread that hands it rows, against calling ``run.log``.

Usage: ``python bench/bench_wandb_exporter.py [--rows N] [--keys K]``

Side by side, in one process, with wandb in offline mode in a temporary directory:
1. ``WandbExporter.submit(row, step)`` while the exporter thread logs into an offline run;
2. ``WandbExporter.submit`` with the wandb service stopped (SIGSTOP): the queue fills and
   rows are dropped (the daemon's worst case);
3. ``run.log(row)`` called directly, what an exporter without its own thread would cost.
Per call: median, p99 and worst, in microseconds. Not a timed test: record results by hand.

Recorded on the 2-core development machine (Python 3.11, wandb 0.31.0), 200 keys per row:

    submit(), exporter logging        median   5.4 µs  p99 14.1 µs  worst  8.5 ms
    submit(), wandb service stopped   median   3.9 µs  p99 14.4 µs  worst 11.1 ms  (1989 dropped)
    run.log() directly                median 1325 µs  p99 7643 µs  worst 38.5 ms

The worst submit() cases are waits for the GIL while the exporter thread serializes a row inside
wandb (Python's 5 ms switch interval), not blocking: submit() takes no lock that a wandb call
holds.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _summary(name: str, samples_s: list[float]) -> str:
    us = sorted(s * 1e6 for s in samples_s)
    p99 = us[min(len(us) - 1, int(len(us) * 0.99))]
    return f"{name:<44} median {statistics.median(us):8.1f} µs  p99 {p99:8.1f} µs  " \
           f"worst {us[-1]:9.1f} µs  (n={len(us)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--keys", type=int, default=200, help="keys per row (a window's row)")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-wandb-")
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=tmp)

    from sidecar.exporters.wandb.exporter import WandbConfig, WandbExporter, wandb_core_children

    row = {f"gpu/{i % 8}/metric_{i}": float(i) for i in range(args.keys)}
    ex = WandbExporter(WandbConfig(run="bench-run", queue_size=args.rows * 2), host="bench")
    ex.start()
    deadline = time.monotonic() + 60
    while ex.stats().state.value != "offline" and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = [f"wandb offline, {args.keys} keys per row, {args.rows} rows per case"]

    samples = []
    for step in range(args.rows):
        t0 = time.perf_counter()
        ex.submit(row, step)
        samples.append(time.perf_counter() - t0)
    lines.append(_summary("submit(), exporter logging", samples))
    while ex.stats().queue_depth and time.monotonic() < deadline + 60:
        time.sleep(0.05)

    pids = wandb_core_children()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        samples = []
        for step in range(args.rows * 3):  # enough to fill the queue and drop
            t0 = time.perf_counter()
            ex.submit(row, step)
            samples.append(time.perf_counter() - t0)
        lines.append(_summary("submit(), wandb service stopped", samples))
        lines.append(f"{'':<44} dropped {dict(ex.stats().rows_dropped)}")
        ex.shutdown(timeout_s=2)
    finally:
        for pid in pids:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass

    import wandb
    run = wandb.init(project="bench", settings=wandb.Settings(mode="offline", console="off",
                                                             x_disable_stats=True))
    prefixed = {f"sidecar/{k}": v for k, v in row.items()}
    samples = []
    for step in range(args.rows):
        t0 = time.perf_counter()
        run.log(prefixed)
        samples.append(time.perf_counter() - t0)
    lines.append(_summary("run.log() directly", samples))
    run.finish()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
