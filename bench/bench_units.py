"""What units read from the name cost (issue 32): per record, a series whose name says another unit
than its own (``step_s``: one multiply through a wrapper) against one that does not (``step_ms``);
per new series, the mapping stage's resolution of a name with a unit against a plain one.

    PYTHONPATH=. python bench/bench_units.py [--records 200000] [--rounds 5]

Both variants of a row run in the same process, alternating round by round (so a loaded box weighs
on both alike); each cell is the median of the rounds, ns per record (or per name)."""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from sidecar.aggregation.aggregator import Aggregator
from sidecar.core.pipeline import ingest_records
from sidecar.model.window import GAUGE, PROFILE, TIMING
from sidecar.processing.mapping import Mapper

ROWS: dict[str, tuple[Any, Any]] = {
    "timing() record": ([TIMING, "step_ms", 41.0], [TIMING, "step_s", 0.041]),
    "gauge() record": ([GAUGE, "mfu_ratio", 0.41], [GAUGE, "mfu(%)", 41.0]),
    "publish() dict of 4 keys, per key": (
        [PROFILE, 1, {"step_ms": 41.0, "data_wait_ms": 4.0, "forward_ms": 12.0, "mfu_ratio": 0.41}],
        [PROFILE, 1, {"step(s)": 0.041, "data_wait(s)": 0.004, "forward_s": 0.012, "mfu(%)": 41.0}]),
}
"""Row -> (record in the series' own unit, the same record in another unit)."""


def ingest_ns(record: list[Any], n: int, batch: int = 500) -> float:
    """ns per record (dict keys counted one each) to aggregate ``n`` copies, names already known."""
    agg, mapper = Aggregator(), Mapper()
    ingest_records(agg, "trainer", "0", [record], mapper)  # resolves the names once
    records = [record] * batch
    per = len(record[2]) if record[0] == PROFILE else 1
    t0 = time.perf_counter_ns()
    for _ in range(n // batch):
        ingest_records(agg, "trainer", "0", records, mapper)
    return (time.perf_counter_ns() - t0) / ((n // batch) * batch * per)


def resolve_ns(name: str, n: int = 20000) -> float:
    mapper = Mapper()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        mapper._map(PROFILE, name, "trainer", "0")  # the mapping itself, not its cache
    return (time.perf_counter_ns() - t0) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print("| row | own unit, ns | another unit, ns | ratio |\n|---|---|---|---|")
    for row, (own, other) in ROWS.items():
        a: list[float] = []
        b: list[float] = []
        for _ in range(args.rounds):
            a.append(ingest_ns(own, args.records))
            b.append(ingest_ns(other, args.records))
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"| {row} | {ma:.0f} | {mb:.0f} | {mb / ma:.2f} |")
    plain, united = [], []
    for _ in range(args.rounds):
        plain.append(resolve_ns("data_wait_ms"))
        united.append(resolve_ns("time_metrics/data_loading(s)"))
    mp, mu = statistics.median(plain), statistics.median(united)
    print(f"| mapping one new name (`data_wait_ms` / `time_metrics/data_loading(s)`) | {mp:.0f} | {mu:.0f} | "
          f"{mu / mp:.2f} |")


if __name__ == "__main__":
    main()
