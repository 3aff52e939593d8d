"""What closing a window costs the aggregator: ``Aggregator.roll`` with 2,002 timing series of one
sender (ten profile dicts of 200 per-layer timings, a bare ``train/time`` read as the step with its
certainty lowered, a data time), every series refilled each window, as the window's own rules
(a phase's parts, an episode's time, a clock read as the step) see them.

    PYTHONPATH=. python bench/bench_roll.py [--windows 40] [--read]

With ``--read`` the 2,000 timings are named as phases the reader reads (``m3/part17/forward_ms``),
so that every one is watched by the window's rules for names read (a running total). With
``--siblings`` they are a review's attack on the rule for names read from their siblings: words
that take a phase beside others (``render``, ``unet``, a timer's ``step``) at 55 nested prefixes
(``x_render_ms``, ``x_x_render_ms``, ...: a name's 128 bytes allow that many), beside backwards
under the deepest prefix. With ``--steps`` they are 1,000 read as the step and 1,000 as
communication under four collectives (``m3/part17/iter_ms``, ``m3/part17/allgather_ms``), the
worst case for the rules that take a worker's shorter step timings as its step's parts and sum its
waits under different collectives. Prints the median milliseconds per roll, and per window's
insight, over the windows after the first ten. To compare two trees, run it in each, alternating
processes (the machine's noise is larger than the change)."""

from __future__ import annotations

import argparse
import statistics
import time

from sidecar.aggregation.aggregator import Aggregator
from sidecar.aggregation.insight import compute_insight
from sidecar.core.pipeline import ingest_records
from sidecar.model.window import PROFILE
from sidecar.processing.mapping import Mapper

SERIES = 2002


def sibling_chain(n: int, depth: int = 55) -> list[str]:
    """``n`` names: sibling words at ``depth`` nested prefixes, then backwards under the deepest."""
    words = ("render_ms", "rendering_ms", "rasterize_ms", "rasterization_ms", "unet_ms", "time_ms_step")
    keys = [f"{'x_' * d}{w}" for d in range(1, depth + 1) for w in words]
    keys = [k for k in keys if len(k) <= 128][:n]
    return keys + [f"{'x_' * depth}b{i}_backward_ms" for i in range(n - len(keys))]


COLLECTIVE_NAMES = ("allgather", "reduce_scatter", "all_to_all", "broadcast")
"""How ``--steps`` names its collectives' waits (four the insight sums as parts of one wait)."""


def steps_and_collectives(j: int) -> dict[str, float]:
    """Profile ``j`` of ``--steps``: 100 step timings of different lengths, 100 collectives' waits."""
    steps = {f"m{j}/part{i}/iter_ms": 5.0 + i for i in range(100)}
    return steps | {f"m{j}/part{i}/{COLLECTIVE_NAMES[i % 4]}_ms": 1.0 + i % 7 for i in range(100)}


def roll_ms(windows: int, read: bool = False, siblings: bool = False, steps: bool = False) -> tuple[float, float]:
    """Median ms of ``Aggregator.roll`` and of the window's insight (``compute_insight``: where a
    worker's series are grouped into its step's phases) over ``windows`` 10-second windows (the first
    ten left out);
    ``read``: the per-layer timings named as phases read from their names; ``siblings``: named as
    the sibling chain (``sibling_chain``); ``steps``: as ``steps_and_collectives``."""
    agg, mapper = Aggregator(), Mapper()
    name = "m{j}/part{i}/forward_ms" if read else "l{j}_layer{i}_fwd_ms"
    profiles = [{name.format(j=j, i=i): 1.0 + i % 7 for i in range(200)} for j in range(10)]
    if siblings:
        chain = sibling_chain(2000)
        profiles = [dict.fromkeys(chain[j * 200:(j + 1) * 200], 1.0) for j in range(10)]
    if steps:
        profiles = [steps_and_collectives(j) for j in range(10)]
    out, insight = [], []
    for k in range(windows):
        clock = {"train/time": 3600.0 + 10.0 * k, "train/data_time": 0.1}
        ingest_records(agg, "trainer", "0", [[PROFILE, k, p] for p in (*profiles, clock)], mapper)
        start = time.perf_counter()
        report = agg.roll(10.0 * k, 10.0 * k, 10.0)
        out.append((time.perf_counter() - start) * 1e3)
        start = time.perf_counter()
        compute_insight(report)
        insight.append((time.perf_counter() - start) * 1e3)
    if len(report.series) != SERIES:
        raise SystemExit(f"expected {SERIES} series, got {len(report.series)}")
    return statistics.median(out[10:]), statistics.median(insight[10:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, default=40)
    ap.add_argument("--read", action="store_true", help="the 2,000 timings named as phases the reader reads")
    ap.add_argument("--siblings", action="store_true", help="the 2,000 timings named as nested sibling words")
    ap.add_argument("--steps", action="store_true", help="1,000 timings read as the step, 1,000 as collectives")
    args = ap.parse_args(argv)
    what = (" read as phases" if args.read else " named as nested siblings" if args.siblings
            else " read as steps and collectives" if args.steps else "")
    roll, insight = roll_ms(args.windows, args.read, args.siblings, args.steps)
    print(f"Aggregator.roll, {SERIES} timing series{what}: {roll:.3f} ms (median); its insight {insight:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
