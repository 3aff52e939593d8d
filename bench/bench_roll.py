"""What closing a window costs the aggregator: ``Aggregator.roll`` with 2,002 timing series of one
sender (ten profile dicts of 200 per-layer timings, a bare ``train/time`` read as the step with its
certainty lowered, a data time), every series refilled each window, as the window's own rules
(a phase's parts, an episode's time, a clock read as the step) see them.

    PYTHONPATH=. python bench/bench_roll.py [--windows 40] [--read]

With ``--read`` the 2,000 timings are named as phases the reader reads (``m3/part17/forward_ms``),
so that every one is watched by the window's rules for names read (a running total). Prints the
median milliseconds per roll over the windows after the first ten. To compare two trees, run it
in each, alternating processes (the machine's noise is larger than the change)."""

from __future__ import annotations

import argparse
import statistics
import time

from sidecar.aggregation.aggregator import Aggregator
from sidecar.core.pipeline import ingest_records
from sidecar.model.window import PROFILE
from sidecar.processing.mapping import Mapper

SERIES = 2002


def roll_ms(windows: int, read: bool = False) -> float:
    """Median ms of ``Aggregator.roll`` over ``windows`` 10-second windows (the first ten left out);
    ``read``: the per-layer timings named as phases read from their names."""
    agg, mapper = Aggregator(), Mapper()
    name = "m{j}/part{i}/forward_ms" if read else "l{j}_layer{i}_fwd_ms"
    profiles = [{name.format(j=j, i=i): 1.0 + i % 7 for i in range(200)} for j in range(10)]
    out = []
    for k in range(windows):
        clock = {"train/time": 3600.0 + 10.0 * k, "train/data_time": 0.1}
        ingest_records(agg, "trainer", "0", [[PROFILE, k, p] for p in (*profiles, clock)], mapper)
        start = time.perf_counter()
        report = agg.roll(10.0 * k, 10.0 * k, 10.0)
        out.append((time.perf_counter() - start) * 1e3)
    if len(report.series) != SERIES:
        raise SystemExit(f"expected {SERIES} series, got {len(report.series)}")
    return statistics.median(out[10:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, default=40)
    ap.add_argument("--read", action="store_true", help="the 2,000 timings named as phases the reader reads")
    args = ap.parse_args(argv)
    print(f"Aggregator.roll, {SERIES} timing series{' read as phases' if args.read else ''}: "
          f"{roll_ms(args.windows, args.read):.3f} ms (median)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
