"""Daemon-side benchmark (issue 3, SPEC §7): ingest throughput, cost at a realistic rate, scrape latency.

Run from the repository root with the project's virtual environment (Python 3.11)::

    PYTHONPATH=. python bench/bench_daemon.py            # everything (about 15 minutes)
    PYTHONPATH=. python bench/bench_daemon.py --quick    # shorter runs, fewer repeats (~4 min)
    PYTHONPATH=. python bench/bench_daemon.py --only inproc,scrape

The daemon and the load processes run the ``sidecar`` this process imports, so pointing
PYTHONPATH at another checkout benchmarks that code with this script (before/after).

What it measures, each repeated and reported as the median of the runs:

1. Ingest throughput on one core, every loss counted.
   (a) ``inproc``: ``IngestLoop.handle_frame`` on pre-encoded frames (a realistic mix of timings,
       counters, gauges, categories and profile dicts, 20 names, 8 senders, 1 record in 1000
       invalid), this process pinned to one core; beside it the floor (msgspec decode only) and
       what a user would otherwise write (``prometheus_client`` children, one per series).
   (b) ``e2e``: a real daemon process (``python -m sidecar run``, the console script's entry
       point) pinned to core 0, two publisher processes on core 1 firing pre-encoded batches
       through XPUB sockets as fast as they can; ``sent == accepted + dropped (by reason)`` is
       checked exactly from ``/metrics``; records/s from the daemon's own per-window lines, CPU
       per record from /proc/<pid>/stat (all its threads).
2. ``paced``: daemon CPU share and RSS while the real ``trainer_shim`` (8 channels, one process)
   publishes 5,000 records/s, side by side (runs interleaved): with ``--no-gpu-metrics``, and
   with NVML at the default 1 s interval on 8 GPUs of the fake driver (tests/fake_nvml; GPM on,
   the shim's process the one compute process on every GPU, so the per-process memory queries
   run), the poll cost read from the daemon's own ``dflash_nvml_poll_duration_seconds``.
4. ``mapping``: what a 50-pattern user mapping (``[[mapping]]`` rules, half globs, half regexes
   with captures, none matching the workload's names, so each new name tries all 50) adds per
   record to ``inproc`` ingest: two loops, with and without it, ingest the same frames
   interleaved 20 frames at a time (paired, so a loaded box weighs on both alike); and the cost
   of resolving one new series name against those rules.
3. ``scrape``: ``GET /metrics`` latency with 10,000 series (50 workers x 200 names), the first
   scrape after each window roll (cold) and a second one (warm), plain and with Prometheus's
   headers; ``promtool check metrics`` on the exposition; render CPU in process.

The load processes are in ``daemon_load.py``, the process plumbing in ``daemon_proc.py``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import select
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from typing import Any

import msgspec
from daemon_load import make_records, make_senders, series_workload
from daemon_proc import (
    DAEMON_CORE,
    accounting,
    code_root,
    cpu_seconds,
    memory_bytes,
    pctl,
    pin,
    read_json_line,
    running_daemon,
    sample_values,
    spawn,
    train_on_every_gpu,
    wait_accounted,
    window_rates,
)

# -- 1a: in-process ingest -----------------------------------------------------------------------

class _NoReceiver:
    """A receiver with no endpoint, for an ``IngestLoop`` fed frames in process (``stats``: what
    an ingest loop before ``Receiver.received`` read)."""

    endpoints: list[str] = []
    stats: Any = None

    def received(self) -> Any:
        from sidecar.model.handoff import Received

        return Received()


def make_frames(batch: int, n_records: int, seed: int = 1) -> tuple[list[bytes], int]:
    rng = random.Random(seed)
    senders = make_senders(rng, 8, "w")
    enc = msgspec.msgpack.Encoder()
    frames = []
    for i in range(max(1, n_records // batch)):
        records = make_records(rng, batch, i * batch)
        frames.append(senders[i % len(senders)].frame(enc, records, batch))
    return frames, sum(s.records_total for s in senders)


def run_handle_frame(frames: list[bytes], mapper: Any = None) -> tuple[float, dict[str, Any]]:
    """CPU seconds to ingest ``frames`` into a fresh ``IngestLoop`` (plus one window roll), and
    its accounting. ``mapper``: the mapping stage to use (default: the presets only)."""
    from sidecar.core.ingest import IngestLoop
    from sidecar.core.pipeline import Pipeline

    loop = IngestLoop(_NoReceiver(), 10.0, Pipeline(mapper=mapper))  # type: ignore[arg-type]
    handle = loop.handle_frame
    t0 = time.thread_time()
    for frame in frames:
        handle(frame)
    loop.pipeline.aggregator.roll(time.monotonic(), time.time(), 1.0)
    cpu = time.thread_time() - t0
    totals = loop.pipeline.registry.totals.values()
    dropped: dict[str, int] = {}
    for t in totals:
        for reason, n in t.dropped.items():
            dropped[reason] = dropped.get(reason, 0) + n
    return cpu, {"accepted": sum(t.accepted for t in totals), "dropped": dropped,
                 "messages_dropped": dict(loop.pipeline.registry.messages_dropped)}


def run_decode_only(frames: list[bytes]) -> float:
    dec = msgspec.msgpack.Decoder()
    t0 = time.thread_time()
    for frame in frames:
        dec.decode(frame)
    return time.thread_time() - t0


def run_prometheus_client(frames: list[bytes]) -> float:
    """What a user would otherwise write: decode, then one prometheus_client child per series
    (Summary for timings, Counter, Gauge, a Counter per category key), children cached."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Summary

    reg = CollectorRegistry()
    labels = ["role", "worker"]
    fams: dict[tuple[int, str], Any] = {}
    children: dict[tuple[Any, ...], Any] = {}
    dec = msgspec.msgpack.Decoder()

    def child(kind: int, name: str, role: str, worker: str, key: Any = None) -> Any:
        fam = fams.get((kind, name))
        if fam is None:
            token = "bench_" + name
            if kind == 1:
                fam = Summary(token + "_seconds", name, labels, registry=reg)
            elif kind == 2:
                fam = Counter(token, name, labels, registry=reg)
            elif kind == 4:
                fam = Counter(token + "_samples", name, labels + ["key"], registry=reg)
            else:
                fam = Gauge(token, name, labels, registry=reg)
            fams[kind, name] = fam
        return fam.labels(role, worker, str(key)) if kind == 4 else fam.labels(role, worker)

    t0 = time.thread_time()
    for frame in frames:
        msg = dec.decode(frame)
        role, worker = msg[4], msg[5]
        for kind, name, value in msg[9]:
            if kind == 6:
                for k, v in value.items():
                    kk = 1 if k.endswith("_ms") else 3
                    key = (kk, k, role, worker)
                    c = children.get(key) or children.setdefault(key, child(kk, k, role, worker))
                    c.observe(v / 1000) if kk == 1 else c.set(v)
                continue
            key = (kind, name, role, worker, value if kind == 4 else None)
            c = children.get(key)
            if c is None:
                c = children[key] = child(kind, name, role, worker, value)
            if kind == 1:
                c.observe(value / 1000)
            elif kind == 2:
                c.inc(value)
            elif kind == 4:
                c.inc()
            elif value == value:
                c.set(value)
    return time.thread_time() - t0


def bench_inproc(quick: bool, repeats: int) -> list[dict[str, Any]]:
    n_records = 200_000 if quick else 1_000_000
    rows = []
    saved = os.sched_getaffinity(0)
    pinning = pin(0, DAEMON_CORE)
    try:
        for batch in (20, 500, 4096):
            frames, sent = make_frames(batch, n_records)
            ours, floor, prom, checks = [], [], [], []
            for _ in range(repeats):
                cpu, acct = run_handle_frame(frames)
                ours.append(cpu)
                checks.append(acct)
                floor.append(run_decode_only(frames))
                prom.append(run_prometheus_client(frames))
            acct = checks[-1]
            balanced = all(c["accepted"] + sum(c["dropped"].values()) == sent and not c["messages_dropped"]
                           for c in checks)
            rows.append({"batch": batch, "records": sent, "pinning": pinning,
                         "sidecar_ns": statistics.median(ours) / sent * 1e9,
                         "sidecar_rps": sent / statistics.median(ours),
                         "decode_ns": statistics.median(floor) / sent * 1e9,
                         "prom_ns": statistics.median(prom) / sent * 1e9,
                         "accepted": acct["accepted"], "dropped": acct["dropped"], "balanced": balanced,
                         "runs": repeats})
    finally:
        os.sched_setaffinity(0, saved)
    return rows


# -- 4: a user mapping's cost -------------------------------------------------------------------

def fifty_rules() -> Any:
    """50 validated user rules: 25 globs and 25 regexes with captures, none matching the
    workload's names (``daemon_load`` names), so every new name is tried against all of them."""
    from sidecar.processing.mapping import Mapper, parse_rules

    tables: list[dict[str, str]] = []
    for i in range(25):
        tables.append({"match": f"loader{i}.*.fetch_ms", "worker": "$1", "phase": "data_wait"})
        tables.append({"regex": rf"(?P<role>gen{i}|critic{i})_rank(\d+)_(fwd|bwd)_ms", "role": "${role}",
                       "worker": "$2", "name": "$3_ms"})
    return Mapper(parse_rules(tables))


def paired_ingest(frames: list[bytes], mapper_a: Any, mapper_b: Any, chunk: int = 20) -> tuple[float, float]:
    """CPU seconds of two fresh ``IngestLoop``s (mappers a and b) ingesting the same frames,
    interleaved ``chunk`` frames at a time in alternating order, so that whatever else the box
    runs at a given moment weighs on both alike (runs of a few seconds each, one after the other,
    differed by up to 300 ns per record on a loaded 2-core box)."""
    from sidecar.core.ingest import IngestLoop
    from sidecar.core.pipeline import Pipeline

    loops = [IngestLoop(_NoReceiver(), 10.0, Pipeline(mapper=m))  # type: ignore[arg-type]
             for m in (mapper_a, mapper_b)]
    cpu = [0.0, 0.0]
    for n, start in enumerate(range(0, len(frames), chunk)):
        part = frames[start:start + chunk]
        for which in ((0, 1) if n % 2 == 0 else (1, 0)):
            handle = loops[which].handle_frame
            t0 = time.thread_time()
            for frame in part:
                handle(frame)
            cpu[which] += time.thread_time() - t0
    return cpu[0], cpu[1]


def bench_mapping(quick: bool, repeats: int) -> list[dict[str, Any]]:
    from sidecar.processing.mapping import Mapper

    n_records = 200_000 if quick else 1_000_000
    rows = []
    saved = os.sched_getaffinity(0)
    pinning = pin(0, DAEMON_CORE)
    try:
        for batch in (20, 500):
            frames, sent = make_frames(batch, n_records)
            plain, mapped = [], []
            for _ in range(repeats):
                a, b = paired_ingest(frames, Mapper(), fifty_rules())
                plain.append(a)
                mapped.append(b)
            rows.append({"batch": batch, "records": sent, "pinning": pinning, "runs": repeats,
                         "none_ns": statistics.median(plain) / sent * 1e9,
                         "fifty_ns": statistics.median(mapped) / sent * 1e9,
                         "added_ns": statistics.median([(m - p) for p, m in zip(plain, mapped)]) / sent * 1e9,
                         "pairs_added_ns": [round((m - p) / sent * 1e9, 1) for p, m in zip(plain, mapped)]})
        mapper = fifty_rules()
        names = [f"series_{i}_ms" for i in range(20_000)]
        t0 = time.thread_time()
        for name in names:
            mapper.resolve(1, name, "w", "0")
        rows.append({"resolve_us": (time.thread_time() - t0) / len(names) * 1e6, "names": len(names)})
    finally:
        os.sched_setaffinity(0, saved)
    return rows


# -- 1b: end to end, flooded ---------------------------------------------------------------------

def bench_e2e_once(batch: int, records: int, publishers: int, nodrop: bool) -> dict[str, Any]:
    """One flood: ``publishers`` processes send ``records`` records in all; the daemon's own
    per-window console lines give the records/s it aggregated; /proc gives its CPU time."""
    with running_daemon(1.0, ["--log-level", "info"]) as daemon:
        procs = [spawn("publish", ["--endpoint", daemon.endpoint, "--seed", str(100 + i), "--senders", "4",
                                    "--batch", str(batch), "--records", str(records // publishers), "--hwm", "1000"]
                       + (["--nodrop"] if nodrop else []))
                 for i in range(publishers)]
        try:
            for p in procs:
                read_json_line(p)
            cpu = [(time.time(), cpu_seconds(daemon.pid))]
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            done: list[dict[str, Any]] = []
            acct: dict[str, Any] = {}
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                time.sleep(0.1)
                cpu.append((time.time(), cpu_seconds(daemon.pid)))
                for p in procs[len(done):len(done) + 1]:
                    assert p.stdout is not None
                    if select.select([p.stdout], [], [], 0)[0]:
                        done.append(read_json_line(p))
                if len(done) == len(procs) and len(cpu) % 5 == 0:
                    sent = sum(d["sent"] for d in done)
                    acct = accounting(daemon.text())
                    if acct["accepted"] + sum(acct["dropped"].values()) >= sent:
                        break
            _, peak = memory_bytes(daemon.pid)
        finally:
            for p in procs:
                if p.stdin:
                    p.stdin.close()
                p.wait(10)
        windows = [w for w in window_rates(daemon.log_path) if w[1] > cpu[0][0] and w[2] > 0]
    t_go = cpu[0][0]
    # full windows: begun after "go", and not the last active one (its records ran out mid-window)
    rates = [r for start, _, r in windows[:-1] if start >= t_go]
    busy_until = windows[-1][1] if windows else time.time()
    used = next((c for t, c in cpu if t >= busy_until), cpu[-1][1]) - cpu[0][1]
    sent_s = max(d["t1"] for d in done) - t_go
    return {"batch": batch, "mode": "nodrop" if nodrop else "drop", "sent": sent, "accepted": acct["accepted"],
            "dropped": acct["dropped"], "messages_dropped": acct["messages_dropped"],
            "balanced": acct["accepted"] + sum(acct["dropped"].values()) == sent and not acct["messages_dropped"],
            "windows": len(rates),
            # too short a run for a full window: records over the whole busy time (pessimistic)
            "rps": statistics.median(rates) if rates else acct["accepted"] / max(busy_until - t_go, 1e-9),
            "busy_s": busy_until - t_go, "send_s": sent_s, "cpu_s": used,
            "cpu_ns": used / max(acct["accepted"], 1) * 1e9,
            "peak_rss_mb": peak / 2**20, "hwm_waits": sum(d["hwm_waits"] for d in done), "pinning": daemon.pinning}


def bench_e2e(quick: bool, repeats: int) -> list[dict[str, Any]]:
    rows = []
    for batch, nodrop, records in ((500, True, 10_000_000), (20, True, 4_000_000), (500, False, 10_000_000)):
        records = records // (2 if quick else 1)
        runs = [bench_e2e_once(batch, records, 2, nodrop) for _ in range(repeats)]
        med = sorted(runs, key=lambda r: r["rps"])[len(runs) // 2]
        rows.append(dict(med, runs=len(runs), all_balanced=all(r["balanced"] for r in runs),
                         rps_all=[round(r["rps"]) for r in runs],
                         cpu_ns_median=statistics.median(r["cpu_ns"] for r in runs),
                         peak_rss_max=max(r["peak_rss_mb"] for r in runs)))
    return rows


# -- 2: a realistic rate through the real shim ---------------------------------------------------

NVML_FAMILIES = ("dflash_nvml_poll_duration_seconds", "dflash_nvml_poll_calls", "dflash_nvml_polls_total",
                 "dflash_gpu_up", "dflash_gpu_process_memory_bytes", "dflash_gpu_sm_activity_ratio",
                 "dflash_nvml_errors_total")


def _nvml_readings(text: str) -> dict[str, list[float]]:
    return {name: sample_values(text, name) for name in NVML_FAMILIES}


def bench_paced_once(seconds: float, idle_s: float, rate: int, interval: float, gpus: int) -> dict[str, Any]:
    """One run at ``rate`` records/s; ``gpus`` > 0: NVML on that many fake GPUs (default
    ``--nvml-interval``), the shim's process the one compute process on each, else
    ``--no-gpu-metrics``. The daemon's own ``dflash_nvml_*`` gauges are read at every scrape."""
    with running_daemon(interval, fake_gpus=gpus) as daemon:
        time.sleep(1.0)
        c0, t0 = cpu_seconds(daemon.pid), time.monotonic()
        time.sleep(idle_s)
        idle_share = (cpu_seconds(daemon.pid) - c0) / (time.monotonic() - t0)
        shim = spawn("shim", ["--endpoint", daemon.endpoint, "--rate", str(rate), "--seconds", str(seconds)])
        if gpus:
            train_on_every_gpu(daemon.fake, gpus, shim.pid)
        read_json_line(shim)
        warmup = min(3.0, seconds / 5)
        time.sleep(warmup)
        c0, t0 = cpu_seconds(daemon.pid), time.monotonic()
        rss_samples = []
        poll_ms: list[float] = []
        next_scrape = t0 + 15.0  # Prometheus's default scrape interval
        while time.monotonic() - t0 < seconds - warmup - 1.0:
            time.sleep(0.5)
            rss_samples.append(memory_bytes(daemon.pid)[0])
            if time.monotonic() >= next_scrape:
                poll_ms += [v * 1000 for v in sample_values(daemon.text(), "dflash_nvml_poll_duration_seconds")]
                next_scrape += 15.0
        share = (cpu_seconds(daemon.pid) - c0) / (time.monotonic() - t0)
        nvml = _nvml_readings(daemon.text())
        poll_ms += [v * 1000 for v in nvml["dflash_nvml_poll_duration_seconds"]]
        result = read_json_line(shim, seconds + 30)
        shim.wait(10)
        sent = result["records_total"]
        acct = wait_accounted(daemon, sent, interval * 2 + 5)
        transit = {k: v for k, v in acct["dropped"].items() if not k.startswith("sender_")}
        _, peak = memory_bytes(daemon.pid)
    return {"gpus": gpus, "rate": rate, "seconds": seconds, "interval": interval, "cpu_share": share,
            "idle_share": idle_share, "rss_mb": statistics.median(rss_samples) / 2**20, "peak_rss_mb": peak / 2**20,
            "sent": sent, "accepted": acct["accepted"], "dropped": acct["dropped"],
            "shim_dropped": result["dropped"],
            "balanced": acct["accepted"] + sum(transit.values()) == sent,
            "poll_ms": poll_ms,
            "poll_calls": (nvml["dflash_nvml_poll_calls"] or [None])[0],
            "polls_total": (nvml["dflash_nvml_polls_total"] or [0])[0],
            "gpus_up": sum(nvml["dflash_gpu_up"]),
            "gpus_with_gpm": len(nvml["dflash_gpu_sm_activity_ratio"]),
            "process_series": len(nvml["dflash_gpu_process_memory_bytes"]),
            "nvml_errors": sum(nvml["dflash_nvml_errors_total"])}


def bench_paced(quick: bool, repeats: int, gpus: int = 8) -> list[dict[str, Any]]:
    """Side by side: ``--no-gpu-metrics`` and NVML on ``gpus`` fake GPUs (0: the first only),
    interleaved run by run so that both see the same background load."""
    seconds, idle_s = (15.0, 5.0) if quick else (60.0, 10.0)
    variants = [0] + ([gpus] if gpus else [])
    runs: dict[int, list[dict[str, Any]]] = {g: [] for g in variants}
    for _ in range(repeats):
        for g in variants:
            runs[g].append(bench_paced_once(seconds, idle_s, 5000, 10.0, g))
    rows = []
    for g in variants:
        med = sorted(runs[g], key=lambda r: r["cpu_share"])[len(runs[g]) // 2]
        poll_ms = [v for r in runs[g] for v in r["poll_ms"]]
        rows.append(dict(med, runs=len(runs[g]), shares=[round(r["cpu_share"] * 100, 3) for r in runs[g]],
                         rss_median_mb=statistics.median(r["rss_mb"] for r in runs[g]),
                         peak_rss_max_mb=max(r["peak_rss_mb"] for r in runs[g]),
                         all_balanced=all(r["balanced"] for r in runs[g]),
                         poll_ms_median=statistics.median(poll_ms) if poll_ms else None,
                         poll_ms_max=max(poll_ms) if poll_ms else None, poll_samples=len(poll_ms)))
    return rows


# -- 3: scrape latency with 10,000 series --------------------------------------------------------

PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
"""What Prometheus 2.42 (Debian 12) sends; with it, prometheus_client answers in OpenMetrics."""


def scrape(url: str, prometheus: bool) -> tuple[float, bytes]:
    """One GET: (seconds until the whole body was read, decompressed body). ``prometheus``: with
    Prometheus's Accept and Accept-Encoding: gzip headers; else a plain GET (like curl)."""
    headers = {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"} if prometheus else {}
    t = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as resp:
        body = resp.read()
        elapsed = time.perf_counter() - t
        if resp.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    return elapsed, body


def _frames_received(body: bytes) -> bytes:
    """The frames counter's line: it changes at every window (the publisher sends twice a window)."""
    i = body.rfind(b"dflash_sidecar_frames_received")
    return body[i:body.find(b"\n", i)]


def bench_scrape_once(scrapes: int, interval: float) -> dict[str, Any]:
    """A daemon holding 10,000 series. Each window: one scrape (alternately plain and
    Prometheus-like), the first since the window rolled (a new report, which the daemon may or
    may not have rendered ahead yet), then one more plain scrape at once (same report)."""
    with running_daemon(interval) as daemon:
        proc = spawn("series", ["--endpoint", daemon.endpoint, "--workers", "50", "--names", "200",
                                 "--period", str(interval / 2)])
        try:
            read_json_line(proc)
            deadline = time.monotonic() + 60
            while accounting(daemon.text())["series"] < 10_000 and time.monotonic() < deadline:
                time.sleep(0.5)
            time.sleep(interval * 1.5)  # a full window with data in every series
            timings: dict[str, list[float]] = {"plain": [], "prometheus": [], "warm": []}
            last = b""
            body = b""
            for i in range(2 * scrapes):
                time.sleep(interval * 1.05)
                mode = "plain" if i % 2 == 0 else "prometheus"
                elapsed, data = scrape(daemon.url, mode == "prometheus")
                frames = _frames_received(data)
                timings[mode if frames != last else "warm"].append(elapsed)
                last = frames
                body = data if mode == "plain" else body
                timings["warm"].append(scrape(daemon.url, False)[0])
        finally:
            if proc.stdin:
                proc.stdin.close()
            proc.wait(10)
    text = body.decode()
    acct = accounting(text)
    samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    promtool = shutil.which("promtool")
    if promtool:
        check = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True)
        lint = {"rc": check.returncode, "output": (check.stdout + check.stderr).decode().strip()}
    else:
        lint = {"rc": None, "output": "promtool not installed"}
    return {"series": acct["series"], "samples": samples, "bytes": len(body),
            **{f"{k}_ms": [t * 1000 for t in v] for k, v in timings.items()}, "promtool": lint}


def scrape_render_cpu(repeats: int) -> dict[str, float]:
    """In this process (CPU time, insensitive to other load): what one cold scrape of 10,000
    series costs to render and compress, by the served page, and by
    prometheus_client from the same collector (what the daemon served before)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

    try:
        from sidecar.exporters.prometheus.collector import ExportState, SidecarCollector
        from sidecar.exporters.prometheus.page import MetricsPage
        from sidecar.exporters.prometheus.server import GZIP_LEVEL
    except ImportError:  # a checkout from before the layout of issue 13, for before/after runs
        from sidecar.exporters.prometheus import (  # type: ignore[no-redef]
            GZIP_LEVEL,
            ExportState,
            MetricsPage,
            SidecarCollector,
        )
    from sidecar.core.ingest import IngestLoop
    from sidecar.core.pipeline import OnWindow, Pipeline
    from sidecar.sources.receiver import ReceiverStats

    receiver = _NoReceiver()
    receiver.stats = ReceiverStats()
    reports: list[Any] = []
    loop = IngestLoop(receiver, 1.0, Pipeline(listeners=[OnWindow(reports.append)]))  # type: ignore[arg-type]
    senders, batch = series_workload(50, 200)
    enc = msgspec.msgpack.Encoder()
    for s in senders:
        records = batch()
        loop.handle_frame(s.frame(enc, records, len(records)))
    loop._roll(time.monotonic(), 1.0)
    state = ExportState(host="bench", started_unix_s=time.time(), report=reports[-1])
    collector = SidecarCollector(state)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    cases = {"prometheus_client text": lambda: generate_latest(registry),
             "prometheus_client OpenMetrics + gzip 9": lambda: gzip.compress(openmetrics_latest(registry))}
    level = GZIP_LEVEL
    cases["served page, not prepared"] = lambda: MetricsPage(collector).render()
    cases[f"served page, not prepared + gzip {level}"] = lambda: gzip.compress(MetricsPage(collector).render(), level)
    prepared = MetricsPage(collector)
    prepared.render()
    cases[f"served page, prepared + gzip {level}"] = lambda: gzip.compress(prepared.render(), level)
    out = {}
    for name, fn in cases.items():
        times = []
        for _ in range(repeats):
            t = time.thread_time()
            fn()
            times.append(time.thread_time() - t)
        out[name] = statistics.median(times) * 1000
    return out


def bench_scrape(quick: bool, repeats: int) -> list[dict[str, Any]]:
    render = scrape_render_cpu(5 if quick else 15)
    runs = [bench_scrape_once(10 if quick else 25, 1.0) for _ in range(repeats)]
    row = dict(runs[-1], render_cpu_ms=render)
    for mode in ("plain", "prometheus", "warm"):
        values = [v for r in runs for v in r[f"{mode}_ms"]]
        row[f"{mode}_n"] = len(values)
        row[f"{mode}_median"] = statistics.median(values) if values else float("nan")
        row[f"{mode}_p99"] = pctl(values, 99) if values else float("nan")
        row[f"{mode}_over_50ms"] = sum(v > 50 for v in values)
        row.pop(f"{mode}_ms")
    row["runs"] = len(runs)
    row["promtool_all_clean"] = all(r["promtool"]["rc"] == 0 and not r["promtool"]["output"] for r in runs)
    return [row]


# -- report --------------------------------------------------------------------------------------

def report(results: dict[str, list[dict[str, Any]]]) -> str:
    out = []
    if "inproc" in results:
        out.append("## 1a. In-process ingest, one core (ns per record, median)\n")
        out.append("| batch | records | sidecar handle_frame | = records/s | decode only (floor) "
                   "| prometheus_client children | accounting balanced | dropped |")
        out.append("|---|---|---|---|---|---|---|---|")
        for r in results["inproc"]:
            out.append(f"| {r['batch']} | {r['records']:,} | {r['sidecar_ns']:.0f} | {r['sidecar_rps']:,.0f} "
                       f"| {r['decode_ns']:.0f} | {r['prom_ns']:.0f} | {r['balanced']} | {r['dropped']} |")
    if "e2e" in results:
        out.append("\n## 1b. End to end: daemon process on one core, flooded by 2 publisher processes\n")
        out.append("| batch | at HWM | records/s aggregated (median window) | daemon CPU ns/rec (all threads) "
                   "| sent | accepted | dropped (reason) | balanced | send / busy s | peak RSS MB | runs (rec/s) |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in results["e2e"]:
            rate = f"{r['rps']:,.0f}" if r["windows"] else "n/a (under one window)"
            out.append(f"| {r['batch']} | {'wait' if r['mode'] == 'nodrop' else 'drop'} | {rate} "
                       f"| {r['cpu_ns_median']:.0f} | {r['sent']:,} | {r['accepted']:,} | {r['dropped']} "
                       f"| {r['all_balanced']} | {r['send_s']:.1f} / {r['busy_s']:.1f} | {r['peak_rss_max']:.0f} "
                       f"| {r['rps_all']} |")
    if "paced" in results:
        out.append("\n## 2. 5,000 records/s through the real trainer_shim, without and with NVML\n")
        out.append("| NVML | daemon CPU (% of a core) | runs (CPU %) | idle CPU % | RSS MB (median / peak) "
                   "| NVML poll ms (median / max, n) | calls/poll | GPUs up / GPM / process series "
                   "| sent | accepted | dropped | balanced |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in results["paced"]:
            nvml = f"{r['gpus']} fake GPUs, 1 s" if r["gpus"] else "--no-gpu-metrics"
            poll = (f"{r['poll_ms_median']:.2f} / {r['poll_ms_max']:.2f} ({r['poll_samples']})"
                    if r["poll_ms_median"] is not None else "-")
            gpus = f"{r['gpus_up']:.0f} / {r['gpus_with_gpm']} / {r['process_series']}" if r["gpus"] else "-"
            calls = f"{r['poll_calls']:.0f}" if r["poll_calls"] is not None else "-"
            out.append(f"| {nvml} | {r['cpu_share'] * 100:.2f} | {r['shares']} | {r['idle_share'] * 100:.2f} "
                       f"| {r['rss_median_mb']:.0f} / {r['peak_rss_max_mb']:.0f} | {poll} | {calls} | {gpus} "
                       f"| {r['sent']:,} | {r['accepted']:,} | {r['dropped']} | {r['all_balanced']} |")
    if "mapping" in results:
        out.append("\n## 4. A 50-pattern user mapping on in-process ingest (ns per record, median)\n")
        out.append("| batch | records | presets only | + 50 user patterns | added (median of the paired runs) "
                   "| added, run by run | runs |")
        out.append("|---|---|---|---|---|---|---|")
        for r in results["mapping"]:
            if "resolve_us" in r:
                continue
            out.append(f"| {r['batch']} | {r['records']:,} | {r['none_ns']:.0f} | {r['fifty_ns']:.0f} "
                       f"| {r['added_ns']:+.1f} | {r['pairs_added_ns']} | {r['runs']} |")
        for r in results["mapping"]:
            if "resolve_us" in r:
                out.append(f"\nResolving one new series name against the 50 patterns (none matching, then the "
                           f"key grammar and presets): {r['resolve_us']:.1f} µs ({r['names']:,} names); paid once "
                           "per sender and name, never per record.")
    if "scrape" in results:
        out.append("\n## 3. GET /metrics with 10,000 series (ms, until the whole body is read)\n")
        out.append("| series | samples | bytes | first of a window, plain: median / p99 (n, over 50 ms) "
                   "| first of a window, Prometheus-like | second in the window, plain | promtool clean | runs |")
        out.append("|---|---|---|---|---|---|---|---|")
        for r in results["scrape"]:
            cells = " | ".join(f"{r[m + '_median']:.1f} / {r[m + '_p99']:.1f} ({r[m + '_n']}, "
                               f"{r[m + '_over_50ms']} over 50 ms)" for m in ("plain", "prometheus", "warm"))
            out.append(f"| {r['series']:,} | {r['samples']:,} | {r['bytes']:,} | {cells} "
                       f"| {r['promtool_all_clean']} | {r['runs']} |")
            out.append("\nRender CPU of one scrape of a new report, in process (ms, median): "
                       + "; ".join(f"{k} {v:.1f}" for k, v in r["render_cpu_ms"].items()))
    return "\n".join(out)


DEFAULT_REPEATS = {"inproc": 5, "e2e": 3, "paced": 3, "scrape": 3, "mapping": 7}
QUICK_REPEATS = {"inproc": 2, "e2e": 1, "paced": 1, "scrape": 1, "mapping": 5}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs, fewer repeats")
    parser.add_argument("--only", default="inproc,e2e,paced,scrape,mapping", help="comma-separated benchmarks")
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"runs per benchmark (default {DEFAULT_REPEATS}, quick {QUICK_REPEATS})")
    parser.add_argument("--json", default=None, help="also write the raw results here")
    parser.add_argument("--gpus", type=int, default=8,
                        help="paced: fake GPUs for the NVML variant beside --no-gpu-metrics (0: without it)")
    args = parser.parse_args(argv)
    benches = {"inproc": bench_inproc, "e2e": bench_e2e, "paced": bench_paced, "scrape": bench_scrape,
               "mapping": bench_mapping}
    results: dict[str, list[dict[str, Any]]] = {}
    for name in args.only.split(","):
        reps = args.repeats or (QUICK_REPEATS if args.quick else DEFAULT_REPEATS)[name]
        t = time.monotonic()
        results[name] = (bench_paced(args.quick, reps, args.gpus) if name == "paced"
                         else benches[name](args.quick, reps))
        print(f"[{name}: {reps} runs, {time.monotonic() - t:.0f} s]", file=sys.stderr, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    rev = subprocess.run(["git", "-C", code_root(), "describe", "--always", "--dirty"], capture_output=True,
                         text=True).stdout.strip() or "not a git checkout"
    print(f"<!-- {time.strftime('%Y-%m-%d %H:%M')} | {os.uname().nodename} | {os.cpu_count()} cores | "
          f"Python {sys.version.split()[0]} | code {code_root()} ({rev}) | {'quick' if args.quick else 'full'} -->")
    print(report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
