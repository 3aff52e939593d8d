"""The 100,000-distinct-timing-names flood of ``tests/soak/floods.py`` (10,000 series kept by the
budget), alone on a fresh daemon: its RSS cost, and the CPU of the window roll and of a cold
render of the served page with its 10,000 series. Figures in ``bench/RESULTS_SOAK.md``.

    PYTHONPATH=. python bench/timing_flood.py --rounds 4      # RSS: a fresh daemon per round
    PYTHONPATH=. python bench/timing_flood.py --cpu 11        # roll and render, median of 11

The daemon runs the ``sidecar`` this process imports: pointing PYTHONPATH at another checkout
measures that code (before/after; alternate the two, the box's load moves the figures).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemon_harness import DaemonProc, NoSocket  # noqa: E402
from tests.soak.floods import FLOODS, _timing_names, run_flood  # noqa: E402

MiB = 1 << 20


def rss_round() -> str:
    """The flood on a fresh daemon: RSS added at its peak and after it (MiB)."""
    flood = next(f for f in FLOODS if f.name == "distinct timing names")
    with tempfile.TemporaryDirectory() as tmp:
        d = DaemonProc(Path(tmp))
        try:
            r = run_flood(d, flood)
        finally:
            d.stop()
    before, peak, after = (float(str(r[k])) for k in ("rss_before", "rss_peak", "rss_after"))
    return f"peak +{(peak - before) / MiB:.1f} MiB, after +{(after - before) / MiB:.1f} MiB"


def cpu(n: int) -> str:
    """CPU time (ms, median of ``n``) of the window roll and of a cold render of the served page,
    the flood's 10,000 timing series in process (each round gives every series a value)."""
    import msgspec

    from sidecar.core.ingest import IngestLoop
    from sidecar.core.pipeline import OnWindow, Pipeline
    from sidecar.exporters.prometheus.collector import ExportState, SidecarCollector
    from sidecar.exporters.prometheus.page import MetricsPage
    from sidecar.model.window import IngestReport

    latest: list[IngestReport] = []

    def keep(report: IngestReport) -> None:  # the latest report only, as the daemon holds it
        latest[:] = [report]

    loop = IngestLoop(NoSocket(), 1.0, Pipeline(listeners=[OnWindow(keep)]))  # type: ignore[arg-type]
    for frame in _timing_names(100_000):
        loop.handle_frame(frame)
    enc = msgspec.msgpack.Encoder()
    rolls, renders = [], []
    for k in range(n):
        for i in range(0, 10_000, 1000):  # the kept names once more (a window with data)
            loop.handle_frame(enc.encode([1, 2, 24, 100 + k * 10 + i // 1000, "flood", "t", None,
                                          100_000 + k * 10_000 + i + 1000, {},
                                          [[1, f"name_{j}_ms", 2.0] for j in range(i, i + 1000)]]))
        started = time.thread_time()
        loop._roll(time.monotonic(), 1.0)
        rolls.append(time.thread_time() - started)
        page = MetricsPage(SidecarCollector(ExportState(host="bench", started_unix_s=0.0, report=latest[-1])))
        render = getattr(page, "render_parts", page.render)  # what a scrape makes (before: render)
        started = time.thread_time()
        render()
        renders.append(time.thread_time() - started)
    return (f"{len(latest[-1].window.series)} series: roll {statistics.median(rolls) * 1000:.1f} ms, "
            f"cold render {statistics.median(renders) * 1000:.1f} ms (median of {n})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=0, help="fresh daemons to flood, one after the other")
    parser.add_argument("--cpu", type=int, default=0, help="rolls and cold renders to time in process")
    args = parser.parse_args()
    for i in range(args.rounds):
        print(f"round {i + 1}: {rss_round()}", flush=True)
    if args.cpu:
        print(cpu(args.cpu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
