"""What ``--dcgm-compat`` adds to a scrape at 8 GPUs, measured side by side in one run.

The real NVML source polls 8 GPUs of the fake NVML driver (tests/fake_nvml: GPM, XID events,
violation counters, 8 trainer processes and a foreign one per GPU); the served page
(``MetricsPage.render`` and gzip at the server's level, what ``/metrics`` answers Prometheus) is
made alternately with compat off and on, over the same snapshot, in two cases: no trainer
series (the GPU families are the whole page: the worst case for the share), and a window report
of 8 workers x 20 names (rendered once per window and cached, as the daemon does). Reported:
median CPU time per scrape (thread CPU time, so other load on the box weighs less), wall p99,
bytes per page, and the compat share: the median over pairs (each scrape with compat against the
one without just before it) of on / off - 1. Then the scrape as Prometheus times it: a
real ``/metrics`` server in this process, GET with Prometheus's headers (gzip), wall time until
the body is read, alternating. Target (issue 24): <= 10 %.

    python bench/bench_dcgm_scrape.py [--scrapes 400]
"""

from __future__ import annotations

import argparse
import gzip
import os
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from sidecar.aggregation.gpu_groups import GpuAggregates, GpuGroups  # noqa: E402
from sidecar.core.scrape_state import ScrapeState  # noqa: E402
from sidecar.exporters.prometheus.collector import ExportState, SidecarCollector  # noqa: E402
from sidecar.exporters.prometheus.page import MetricsPage  # noqa: E402
from sidecar.exporters.prometheus.server import GZIP_LEVEL, serve  # noqa: E402
from sidecar.sources.nvml import NvmlSource  # noqa: E402
from tests.fake_nvml import FakeNvml, build_fake_nvml  # noqa: E402

GPUS = 8


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def trainer_report(workers: int, names: int) -> object:
    """A window report of ``workers`` x ``names`` trainer series, as ingest builds it."""
    import msgspec
    from daemon_load import series_workload

    from sidecar.core.ingest import IngestLoop
    from sidecar.core.pipeline import OnWindow, Pipeline
    from sidecar.sources.receiver import ReceiverStats

    class _NoReceiver:
        endpoints: list[str] = []
        stats = ReceiverStats()

        def received(self) -> object:
            from sidecar.model.handoff import Received

            return Received()

    reports: list[object] = []
    loop = IngestLoop(_NoReceiver(), 1.0, Pipeline(listeners=[OnWindow(reports.append)]))  # type: ignore[arg-type]
    senders, batch = series_workload(workers, names)
    encoder = msgspec.msgpack.Encoder()
    for sender in senders:
        records = batch()
        loop.handle_frame(sender.frame(encoder, records, len(records)))
    loop._roll(time.monotonic(), 1.0)
    return reports[-1]


def measure(state: ExportState, page: MetricsPage, scrapes: int) -> dict[bool, tuple[list[float], list[float], int]]:
    """Alternating scrapes: {compat: (CPU s per scrape, wall s per scrape, gzipped bytes)}."""
    out: dict[bool, tuple[list[float], list[float], int]] = {False: ([], [], 0), True: ([], [], 0)}
    for _ in range(20):  # warm-up (and the report's text is rendered once, as after a window roll)
        gzip.compress(page.render(), GZIP_LEVEL)
    for i in range(2 * scrapes):
        compat = i % 2 == 1  # alternate, so drift and noise fall on both settings alike
        state.dcgm_compat = compat
        cpu, wall = time.thread_time(), time.perf_counter()
        body = gzip.compress(page.render(), GZIP_LEVEL)
        cpus, walls, _ = out[compat]
        cpus.append(time.thread_time() - cpu)
        walls.append(time.perf_counter() - wall)
        out[compat] = (cpus, walls, len(body))
    return out


def measure_http(state: ExportState, scrapes: int) -> dict[bool, list[float]]:
    """Alternating GETs of a real server: {compat: wall s per scrape}."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    server, _ = serve(state, f"127.0.0.1:{port}")
    url = f"http://127.0.0.1:{port}/metrics"
    headers = {"Accept": "text/plain;version=0.0.4;q=0.5,*/*;q=0.1", "Accept-Encoding": "gzip"}
    out: dict[bool, list[float]] = {False: [], True: []}
    try:
        for i in range(2 * scrapes + 20):
            compat = i % 2 == 1
            state.dcgm_compat = compat
            started = time.perf_counter()
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as resp:
                resp.read()
            if i >= 20:  # after a warm-up
                out[compat].append(time.perf_counter() - started)
    finally:
        server.shutdown()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=400, help="scrapes per setting and case")
    args = parser.parse_args()
    library = build_fake_nvml("full")
    workdir = Path(tempfile.mkdtemp(prefix="bench-dcgm-"))
    control = FakeNvml(workdir / "control.txt", library, {"devices": GPUS})
    control.set({f"gpu.{i}.processes": {1000 + i: 2**30, 5000 + i: 2**29} for i in range(GPUS)})
    control.gpu("*", violation_power=0.2, xids=[])
    os.environ["FAKE_NVML_CONTROL"] = str(control.path)
    source = NvmlSource(interval_s=3600.0, library_path=str(library))  # one snapshot, the same for every scrape
    source.set_trainer_processes({1000 + i: ("target" if i < 6 else "drafter", str(i)) for i in range(GPUS)})
    source.start()
    deadline = time.monotonic() + 10
    while source.latest() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    groups = GpuAggregates(GpuGroups.parse(["target=0-5", "drafter=6,7"]), source.latest, source.status)
    cases = []
    for name, report in (("no trainer series", None), ("8 workers x 20 names", trainer_report(8, 20))):
        state = ExportState(host="bench", started_unix_s=time.time(), scrape_state=ScrapeState(gpus=groups),
                            report=report)  # type: ignore[arg-type]
        cases.append((name, measure(state, MetricsPage(SidecarCollector(state)), args.scrapes)))
    http_state = ExportState(host="bench", started_unix_s=time.time(), scrape_state=ScrapeState(gpus=groups),
                             report=trainer_report(8, 20))  # type: ignore[arg-type]
    http = measure_http(http_state, args.scrapes)
    source.shutdown()

    load = os.getloadavg()
    print(f"Scrape cost (render + gzip {GZIP_LEVEL}), {GPUS} fake GPUs, {args.scrapes} scrapes per setting "
          f"(alternating), Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average after the run "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'case':22} {'dcgm-compat':11} {'CPU ms median':>13} {'wall ms p99':>11} {'gzip bytes':>10} "
          f"{'compat adds':>11}")
    for name, result in cases:
        # each on-scrape against the off-scrape just before it: paired, so drift cancels
        paired = statistics.median(on / off for off, on in zip(result[False][0], result[True][0]) if off > 0)
        for compat in (False, True):
            cpus, walls, size = result[compat]
            share = f"{(paired - 1) * 100:10.1f}%" if compat else ""
            print(f"{name:22} {'on' if compat else 'off':11} {statistics.median(cpus) * 1e3:13.3f} "
                  f"{_percentile(walls, 0.99) * 1e3:11.3f} {size:10d} {share:>11}")
    off, on = statistics.median(http[False]), statistics.median(http[True])
    print(f"HTTP scrape with Prometheus's headers, 8 workers x 20 names: median {off * 1e3:.3f} ms off, "
          f"{on * 1e3:.3f} ms on: compat adds {(on / off - 1) * 100:.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
