"""Daemon-side benchmark (issue 3, SPEC §7): ingest throughput, cost at a realistic rate, scrape latency.

Run from the repository root (Python 3.11, the project's virtual environment)::

    PYTHONPATH=. python bench/bench_daemon.py            # full run (about 10 minutes)
    PYTHONPATH=. python bench/bench_daemon.py --quick    # a shorter run of everything
    PYTHONPATH=. python bench/bench_daemon.py --only inproc,scrape

What it measures, each repeated and reported as the median of the runs:

1. Ingest throughput on one core, every loss counted.
   (a) ``inproc``: ``IngestLoop.handle_frame`` on pre-encoded frames (a realistic mix of timings,
       counters, gauges, categories and profile dicts, 20 names, 8 senders, 1 record in 1000
       invalid), in this process pinned to one core; next to it the floor (msgspec decode only)
       and what a user would otherwise write (``prometheus_client`` children, one per series).
   (b) ``e2e``: a real daemon process (``python -m sidecar run``, the console script's entry
       point) pinned to core 0, real publisher processes on core 1 firing pre-encoded batches
       through an XPUB socket as fast as they can; then ``sent == accepted + dropped (by reason)``
       is checked exactly from ``/metrics``, and records/s and daemon CPU per record reported.
2. ``paced``: daemon CPU share and RSS while the real ``trainer_shim`` (8 channels, one process)
   publishes 5,000 records/s, with ``--no-gpu-metrics`` (NVML lives on another branch).
3. ``scrape``: ``GET /metrics`` latency with 10,000 series (50 workers x 200 names), plain and
   gzip, and ``promtool check metrics`` on the exposition.

Hidden subcommands ``_publish``, ``_shim`` and ``_series`` are the publisher processes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from trainer_shim import wire

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
DAEMON_CORE, CLIENT_CORE = 0, 1

# -- the workload: a realistic record mix ----------------------------------------------------------

TIMINGS = ["step_ms", "forward_ms", "backward_ms", "optimizer_ms", "data_wait_ms", "queue_wait_ms"]
COUNTERS = ["tokens", "batches", "samples", "loss_tokens"]
GAUGES = ["queue_fill", "lr", "batch_tokens", "prefetch_fill", "ready_deficit"]
CATEGORIES = ["bucket", "seq_len_bin"]
PROFILE = {"step_ms": 41.0, "forward_ms": 12.0, "backward_ms": 24.0, "data_ms": 0.4,
           "loss": 2.1, "grad_norm": 0.9, "tokens_per_s": 14000.0, "lr": 1e-4}
"""20 distinct names in all (profile keys overlap the timings/gauges above)."""
INVALID_EVERY = 1000
"""One record in this many is a NaN gauge: the daemon must reject it as ``invalid_value``."""


def make_records(rng: random.Random, n: int, offset: int = 0) -> list[list[Any]]:
    """``n`` records: 40 % timings, 20 % counters, 20 % gauges, 15 % categories, 5 % profile dicts.
    Record number ``offset + i`` is invalid when divisible by ``INVALID_EVERY``."""
    out: list[list[Any]] = []
    for i in range(n):
        if (offset + i) % INVALID_EVERY == INVALID_EVERY - 1:
            out.append([3, "queue_fill", float("nan")])
            continue
        r = rng.random()
        if r < 0.40:
            out.append([1, rng.choice(TIMINGS), rng.lognormvariate(2.0, 0.8)])
        elif r < 0.60:
            out.append([2, rng.choice(COUNTERS), rng.randint(1, 4096)])
        elif r < 0.80:
            out.append([3, rng.choice(GAUGES), rng.random()])
        elif r < 0.95:
            out.append([4, rng.choice(CATEGORIES), rng.randint(0, 15)])
        else:
            out.append([6, rng.randint(0, 1 << 20), {k: v * rng.uniform(0.8, 1.2) for k, v in PROFILE.items()}])
    return out


@dataclass
class Sender:
    """One simulated sender: its identity and wire counters."""

    sender: int
    role: str
    worker: str
    seq: int = 0
    records_total: int = 0

    def frame(self, enc: msgspec.msgpack.Encoder, payload: Any, n: int) -> bytes:
        """Encode one BATCH of ``n`` records (``payload``: a list or a pre-encoded ``msgspec.Raw``)."""
        self.records_total += n
        frame = wire.encode_batch(enc, self.sender, self.seq, self.role, self.worker, None,
                                  self.records_total, {}, payload)
        self.seq += 1
        return frame


def make_senders(rng: random.Random, n: int, tag: str) -> list[Sender]:
    return [Sender(rng.getrandbits(62), "target" if i % 4 else "drafter", f"{tag}{i}") for i in range(n)]


# -- process helpers -----------------------------------------------------------------------------

def pin(pid: int, core: int) -> str:
    """Pin ``pid`` to ``core`` when the machine has two cores or more; returns what was done."""
    if (os.cpu_count() or 1) < 2:
        return "not pinned (one core)"
    os.sched_setaffinity(pid, {core})
    return f"core {core}"


def proc_cpu_s(pid: int) -> float:
    """utime + stime of every thread of ``pid`` (seconds), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def proc_rss(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in bytes."""
    rss = hwm = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    return rss, hwm


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def code_root() -> str:
    """The checkout whose ``sidecar`` this process imports (PYTHONPATH picks it): the daemon and
    the publishers run the same code, so a before/after comparison needs only PYTHONPATH."""
    import sidecar

    return os.path.dirname(os.path.dirname(os.path.abspath(sidecar.__file__)))


def env_with_root() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([code_root(), ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def http_get(url: str, gz: bool = False, timeout: float = 10.0) -> bytes:
    req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"} if gz else {})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body = resp.read()
        if resp.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    return body


class Daemon:
    """A real daemon process, pinned to ``DAEMON_CORE``."""

    def __init__(self, workdir: str, interval: float, extra: list[str] | None = None) -> None:
        self.endpoint = f"ipc://{workdir}/sidecar.sock"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        cmd = [sys.executable, "-m", "sidecar", "run", "--no-gpu-metrics", "--interval", str(interval),
               "--endpoint", self.endpoint, "--prometheus-addr", f"127.0.0.1:{self.port}",
               "--log-level", "warning", *(extra or [])]
        self.log = open(os.path.join(workdir, "daemon.log"), "w")
        self.proc = subprocess.Popen(cmd, env=env_with_root(), stdout=self.log, stderr=subprocess.STDOUT, cwd=workdir)
        self.pinning = pin(self.proc.pid, DAEMON_CORE)
        deadline = time.monotonic() + 20
        while True:
            try:
                http_get(self.url, timeout=1.0)
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"daemon did not start (see {self.log.name})") from None
                time.sleep(0.05)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def metrics(self) -> str:
        return http_get(self.url).decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@contextmanager
def running_daemon(interval: float, extra: list[str] | None = None) -> Iterator[Daemon]:
    workdir = tempfile.mkdtemp(prefix="dbench-")
    daemon = Daemon(workdir, interval, extra)
    try:
        yield daemon
    finally:
        daemon.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def accounting(text: str) -> dict[str, Any]:
    """Accepted and dropped-by-reason totals (all roles/workers) from an exposition."""
    accepted = 0.0
    dropped: dict[str, float] = {}
    messages: dict[str, float] = {}
    series = 0.0
    for line in text.splitlines():
        if line.startswith("dflash_sidecar_records_accepted_total{"):
            accepted += float(line.rsplit(" ", 1)[1])
        elif line.startswith("dflash_sidecar_records_dropped_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            dropped[reason] = dropped.get(reason, 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith("dflash_sidecar_messages_dropped_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            messages[reason] = messages.get(reason, 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith("dflash_sidecar_series{"):
            series = float(line.rsplit(" ", 1)[1])
    return {"accepted": int(accepted), "dropped": {k: int(v) for k, v in dropped.items()},
            "messages_dropped": {k: int(v) for k, v in messages.items()}, "series": int(series)}


def wait_accounted(daemon: Daemon, sent: int, timeout_s: float) -> dict[str, Any]:
    """Poll /metrics until accepted + dropped == sent (or the timeout); returns the last figures."""
    deadline = time.monotonic() + timeout_s
    while True:
        acct = accounting(daemon.metrics())
        if acct["accepted"] + sum(acct["dropped"].values()) >= sent or time.monotonic() > deadline:
            return acct
        time.sleep(0.5)


def spawn(role: str, args: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), role, *args], env=env_with_root(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    pin(proc.pid, CLIENT_CORE)
    return proc


def read_json_line(proc: subprocess.Popen[str], timeout_s: float = 60.0) -> dict[str, Any]:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    line = proc.stdout.readline() if ready else ""
    if not line:
        raise RuntimeError(f"{proc.args[2]} process gave no answer (rc {proc.poll()})")
    return json.loads(line)


def pctl(values: list[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0..100) of ``values``."""
    s = sorted(values)
    return s[max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))]


# -- 1a: in-process ingest -----------------------------------------------------------------------

class _NoReceiver:
    stats = None


def make_frames(batch: int, n_records: int, seed: int = 1) -> tuple[list[bytes], int]:
    rng = random.Random(seed)
    senders = make_senders(rng, 8, "w")
    enc = msgspec.msgpack.Encoder()
    frames = []
    for i in range(max(1, n_records // batch)):
        records = make_records(rng, batch, i * batch)
        frames.append(senders[i % len(senders)].frame(enc, records, batch))
    return frames, sum(s.records_total for s in senders)


def run_handle_frame(frames: list[bytes]) -> tuple[float, dict[str, Any]]:
    """CPU seconds to ingest ``frames`` into a fresh ``IngestLoop`` (plus one window roll), and
    its accounting."""
    from sidecar.ingest import IngestLoop

    loop = IngestLoop(_NoReceiver(), 10.0, lambda report: None)  # type: ignore[arg-type]
    handle = loop.handle_frame
    t0 = time.thread_time()
    for frame in frames:
        handle(frame)
    loop.aggregator.roll(time.monotonic(), time.time(), 1.0)
    cpu = time.thread_time() - t0
    totals = loop.registry.totals.values()
    dropped: dict[str, int] = {}
    for t in totals:
        for reason, n in t.dropped.items():
            dropped[reason] = dropped.get(reason, 0) + n
    return cpu, {"accepted": sum(t.accepted for t in totals), "dropped": dropped,
                 "messages_dropped": dict(loop.registry.messages_dropped)}


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
                    c = children.get((kk, k, role, worker)) or children.setdefault((kk, k, role, worker), child(kk, k, role, worker))
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


# -- 1b: end to end, flooded ---------------------------------------------------------------------

def publisher_main(args: argparse.Namespace) -> int:
    """Connect an XPUB socket, wait for the daemon's subscription and for ``go`` on stdin, then
    send ``records`` records in pre-encoded batches as fast as possible; then keep sending empty
    heartbeat batches (carrying the final ``records_total``) until stdin closes. With ``--nodrop``
    the socket refuses (EAGAIN) at its high-water mark and the publisher retries, so nothing is
    lost; without, ZeroMQ drops at the mark, as it does for the shim."""
    rng = random.Random(args.seed)
    senders = make_senders(rng, args.senders, f"p{args.seed}-")
    enc = msgspec.msgpack.Encoder()
    payloads = [msgspec.Raw(enc.encode(make_records(rng, args.batch, i * args.batch))) for i in range(16)]
    ctx = zmq.Context(io_threads=1)
    sock = ctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.SNDHWM, args.hwm)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.XPUB_NODROP, int(args.nodrop))
    sock.connect(args.endpoint)
    if not sock.poll(20_000):
        print(json.dumps({"error": "no subscriber"}), flush=True)
        return 1
    sock.recv()
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()
    waits = 0
    t0 = time.time()
    for i in range(max(1, args.records // args.batch)):
        frame = senders[i % len(senders)].frame(enc, payloads[i % len(payloads)], args.batch)
        while True:
            try:
                sock.send(frame, zmq.NOBLOCK)
                break
            except zmq.Again:  # only with --nodrop: wait for room, never lose the frame
                waits += 1
                time.sleep(0.0005)
    t1 = time.time()
    print(json.dumps({"t0": t0, "t1": t1, "hwm_waits": waits,
                      "sent": sum(s.records_total for s in senders)}), flush=True)
    while not select.select([sys.stdin], [], [], 0.2)[0]:
        for s in senders:
            try:
                sock.send(s.frame(enc, [], 0), zmq.NOBLOCK)
            except zmq.Again:
                pass
    sock.close(0)
    ctx.term()
    return 0


_WINDOW_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) .*window ([\d.]+)s \| \d+ senders \| ([\d,]+) rec/s")


def window_rates(log_path: str) -> list[tuple[float, float, float]]:
    """(start, end, records/s) of each window from the daemon's console lines (wall clock)."""
    out = []
    with open(log_path) as f:
        for line in f:
            m = _WINDOW_LINE.match(line)
            if m:
                end = time.mktime(time.strptime(m[1], "%Y-%m-%d %H:%M:%S")) + int(m[2]) / 1000
                out.append((end - float(m[3]), end, float(m[4].replace(",", ""))))
    return out


def bench_e2e_once(batch: int, records: int, publishers: int, nodrop: bool) -> dict[str, Any]:
    """One flood: ``publishers`` processes send ``records`` records in all; the daemon's own
    per-window console lines give the records/s it aggregated; /proc gives its CPU time."""
    with running_daemon(1.0, ["--log-level", "info"]) as daemon:
        procs = [spawn("_publish", ["--endpoint", daemon.endpoint, "--seed", str(100 + i), "--senders", "4",
                                    "--batch", str(batch), "--records", str(records // publishers), "--hwm", "1000"]
                       + (["--nodrop"] if nodrop else []))
                 for i in range(publishers)]
        try:
            for p in procs:
                read_json_line(p)
            cpu = [(time.time(), proc_cpu_s(daemon.pid))]
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            done: list[dict[str, Any]] = []
            acct: dict[str, Any] = {}
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                time.sleep(0.1)
                cpu.append((time.time(), proc_cpu_s(daemon.pid)))
                for p in procs[len(done):len(done) + 1]:
                    assert p.stdout is not None
                    if select.select([p.stdout], [], [], 0)[0]:
                        done.append(read_json_line(p))
                if len(done) == len(procs) and len(cpu) % 5 == 0:
                    sent = sum(d["sent"] for d in done)
                    acct = accounting(daemon.metrics())
                    if acct["accepted"] + sum(acct["dropped"].values()) >= sent:
                        break
            _, peak = proc_rss(daemon.pid)
        finally:
            for p in procs:
                if p.stdin:
                    p.stdin.close()
                p.wait(10)
        windows = [w for w in window_rates(daemon.log.name) if w[0] >= cpu[0][0] and w[2] > 0]
    t_go = cpu[0][0]
    full = windows[:-1]  # the last active window is partial: its records ran out mid-window
    rates = [r for _, _, r in full]
    busy_until = windows[-1][1] if windows else t_go
    used = next((c for t, c in cpu if t >= busy_until), cpu[-1][1]) - cpu[0][1]
    sent_s = max(d["t1"] for d in done) - t_go
    return {"batch": batch, "mode": "nodrop" if nodrop else "drop", "sent": sent, "accepted": acct["accepted"],
            "dropped": acct["dropped"], "messages_dropped": acct["messages_dropped"],
            "balanced": acct["accepted"] + sum(acct["dropped"].values()) == sent and not acct["messages_dropped"],
            "windows": len(rates), "rps": statistics.median(rates) if rates else float("nan"),
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

def shim_main(args: argparse.Namespace) -> int:
    """The real trainer_shim: 8 channels (6 target, 2 drafter workers) publishing ``rate``
    records/s in 10 ms ticks for ``seconds``; prints the shim's stats at the end."""
    from trainer_shim import telemetry

    telemetry.configure(endpoint=args.endpoint, role="target", worker="0", allocator_interval_s=0)
    channels = [telemetry.channel("target" if w < 6 else "drafter", str(w)) for w in range(8)]
    rng = random.Random(7)
    per_tick = args.rate / 100
    print(json.dumps({"ready": True}), flush=True)
    start = time.monotonic()
    due = 0.0
    tick = 0
    step = 0
    while True:
        now = time.monotonic() - start
        if now >= args.seconds:
            break
        due += per_tick
        while due >= 1:
            due -= 1
            ch = channels[rng.randrange(8)]
            r = rng.random()
            if r < 0.40:
                ch.timing(rng.choice(TIMINGS), rng.lognormvariate(2.0, 0.8))
            elif r < 0.60:
                ch.count(rng.choice(COUNTERS), rng.randint(1, 4096))
            elif r < 0.80:
                ch.gauge(rng.choice(GAUGES), rng.random())
            elif r < 0.95:
                ch.category(rng.choice(CATEGORIES), rng.randint(0, 15))
            else:
                step += 1
                ch.publish(step, {k: v * rng.uniform(0.8, 1.2) for k, v in PROFILE.items()})
        tick += 1
        time.sleep(max(0.0, tick * 0.01 - (time.monotonic() - start)))
    telemetry.close()  # flushes what is queued: the counts below are final
    stats = telemetry.stats()
    print(json.dumps({"records_total": sum(s["records_total"] for s in stats.values()),
                      "dropped": {r: sum(s["dropped"].get(r, 0) for s in stats.values())
                                  for r in {r for s in stats.values() for r in s["dropped"]}}}), flush=True)
    return 0


def bench_paced_once(seconds: float, idle_s: float, rate: int, interval: float) -> dict[str, Any]:
    with running_daemon(interval) as daemon:
        time.sleep(1.0)
        c0, t0 = proc_cpu_s(daemon.pid), time.monotonic()
        time.sleep(idle_s)
        idle_share = (proc_cpu_s(daemon.pid) - c0) / (time.monotonic() - t0)
        shim = spawn("_shim", ["--endpoint", daemon.endpoint, "--rate", str(rate), "--seconds", str(seconds)])
        read_json_line(shim)
        warmup = min(3.0, seconds / 5)
        time.sleep(warmup)
        c0, t0 = proc_cpu_s(daemon.pid), time.monotonic()
        rss_samples = []
        next_scrape = t0 + 15.0  # Prometheus's default scrape interval
        while time.monotonic() - t0 < seconds - warmup - 1.0:
            time.sleep(0.5)
            rss_samples.append(proc_rss(daemon.pid)[0])
            if time.monotonic() >= next_scrape:
                daemon.metrics()
                next_scrape += 15.0
        share = (proc_cpu_s(daemon.pid) - c0) / (time.monotonic() - t0)
        result = read_json_line(shim, seconds + 30)
        shim.wait(10)
        sent = result["records_total"]
        acct = wait_accounted(daemon, sent, interval * 2 + 5)
        transit = {k: v for k, v in acct["dropped"].items() if not k.startswith("sender_")}
        _, peak = proc_rss(daemon.pid)
    return {"rate": rate, "seconds": seconds, "interval": interval, "cpu_share": share, "idle_share": idle_share,
            "rss_mb": statistics.median(rss_samples) / 2**20, "peak_rss_mb": peak / 2**20,
            "sent": sent, "accepted": acct["accepted"], "dropped": acct["dropped"],
            "shim_dropped": result["dropped"],
            "balanced": acct["accepted"] + sum(transit.values()) == sent}


def bench_paced(quick: bool, repeats: int) -> list[dict[str, Any]]:
    seconds, idle_s = (15.0, 5.0) if quick else (60.0, 10.0)
    runs = [bench_paced_once(seconds, idle_s, 5000, 10.0) for _ in range(repeats)]
    med = sorted(runs, key=lambda r: r["cpu_share"])[len(runs) // 2]
    return [dict(med, runs=len(runs), shares=[round(r["cpu_share"] * 100, 3) for r in runs],
                 rss_median_mb=statistics.median(r["rss_mb"] for r in runs),
                 all_balanced=all(r["balanced"] for r in runs))]


# -- 3: scrape latency with 10,000 series --------------------------------------------------------

SERIES_KINDS = [1] * 50 + [2] * 50 + [3] * 80 + [4] * 20
"""200 names per worker: 50 timings, 50 counters, 80 gauges, 20 categories (4 keys each)."""


def series_workload(workers: int, names: int) -> tuple[list[Sender], Any]:
    """``workers`` senders and a function giving one batch of ``names`` names (two records each)."""
    rng = random.Random(3)
    senders = [Sender(rng.getrandbits(62), "target" if w < 38 else "drafter", f"w{w:02d}") for w in range(workers)]
    kinds = [(k, f"metric_{i:03d}" + ("_ms" if k == 1 else "")) for i, k in enumerate(SERIES_KINDS[:names])]

    def batch() -> list[list[Any]]:
        return [[k, n, (rng.randint(0, 3) if k == 4 else rng.uniform(0.1, 100.0))] for k, n in kinds for _ in range(2)]

    return senders, batch


def series_main(args: argparse.Namespace) -> int:
    """50 senders x 200 names, one batch per sender every ``period`` seconds until stdin closes."""
    senders, batch = series_workload(args.workers, args.names)
    enc = msgspec.msgpack.Encoder()
    ctx = zmq.Context(io_threads=1)
    sock = ctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(args.endpoint)
    if not sock.poll(20_000):
        return 1
    sock.recv()
    print(json.dumps({"ready": True}), flush=True)
    rounds = 0
    while True:
        for s in senders:
            records = batch()
            sock.send(s.frame(enc, records, len(records)))
        rounds += 1
        if select.select([sys.stdin], [], [], args.period)[0]:
            break
    sock.close(0)
    ctx.term()
    return 0


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
    Prometheus-like), the first since the window rolled (cold: a new report to render), then
    one more plain scrape at once (warm: same report)."""
    with running_daemon(interval) as daemon:
        proc = spawn("_series", ["--endpoint", daemon.endpoint, "--workers", "50", "--names", "200",
                                 "--period", str(interval / 2)])
        try:
            read_json_line(proc)
            deadline = time.monotonic() + 60
            while accounting(daemon.metrics())["series"] < 10_000 and time.monotonic() < deadline:
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
    series costs to render and compress, by the served page when this code has one, and by
    prometheus_client from the same collector (what the daemon served before)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

    from sidecar.exporters import prometheus as prom
    from sidecar.ingest import IngestLoop

    class _Stats:
        frames = bytes = disconnects = 0

    receiver = _NoReceiver()
    receiver.stats = _Stats()  # type: ignore[assignment]
    reports: list[Any] = []
    loop = IngestLoop(receiver, 1.0, reports.append)  # type: ignore[arg-type]
    senders, batch = series_workload(50, 200)
    enc = msgspec.msgpack.Encoder()
    for s in senders:
        records = batch()
        loop.handle_frame(s.frame(enc, records, len(records)))
    loop._roll(time.monotonic(), 1.0)
    state = prom.ExportState(host="bench", started_unix_s=time.time(), report=reports[-1])
    collector = prom.SidecarCollector(state)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    cases = {"prometheus_client text": lambda: generate_latest(registry),
             "prometheus_client OpenMetrics + gzip 9": lambda: gzip.compress(openmetrics_latest(registry))}
    if hasattr(prom, "MetricsPage"):
        level = getattr(prom, "GZIP_LEVEL", 9)
        cases["served page, cold"] = lambda: prom.MetricsPage(collector).render()
        cases[f"served page, cold + gzip {level}"] = lambda: gzip.compress(prom.MetricsPage(collector).render(), level)
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
            out.append(f"| {r['batch']} | {'wait' if r['mode'] == 'nodrop' else 'drop'} | {r['rps']:,.0f} "
                       f"| {r['cpu_ns_median']:.0f} | {r['sent']:,} | {r['accepted']:,} | {r['dropped']} "
                       f"| {r['all_balanced']} | {r['send_s']:.1f} / {r['busy_s']:.1f} | {r['peak_rss_max']:.0f} "
                       f"| {r['rps_all']} |")
    if "paced" in results:
        out.append("\n## 2. 5,000 records/s through the real trainer_shim (--no-gpu-metrics)\n")
        out.append("| seconds | window | daemon CPU (% of a core) | idle CPU % | RSS MB (median / peak) "
                   "| sent | accepted | dropped | balanced | runs (CPU %) |")
        out.append("|---|---|---|---|---|---|---|---|---|---|")
        for r in results["paced"]:
            out.append(f"| {r['seconds']:.0f} | {r['interval']:.0f} s | {r['cpu_share'] * 100:.2f} "
                       f"| {r['idle_share'] * 100:.2f} | {r['rss_median_mb']:.0f} / {r['peak_rss_mb']:.0f} "
                       f"| {r['sent']:,} | {r['accepted']:,} | {r['dropped']} | {r['all_balanced']} | {r['shares']} |")
    if "scrape" in results:
        out.append("\n## 3. GET /metrics with 10,000 series (ms, until the whole body is read)\n")
        out.append("| series | samples | bytes | cold plain median / p99 (n) | cold Prometheus-like median / p99 (n) "
                   "| warm median / p99 (n) | promtool clean | runs |")
        out.append("|---|---|---|---|---|---|---|---|")
        for r in results["scrape"]:
            cells = " | ".join(f"{r[m + '_median']:.1f} / {r[m + '_p99']:.1f} ({r[m + '_n']})"
                               for m in ("plain", "prometheus", "warm"))
            out.append(f"| {r['series']:,} | {r['samples']:,} | {r['bytes']:,} | {cells} "
                       f"| {r['promtool_all_clean']} | {r['runs']} |")
            out.append("\nRender CPU of one cold scrape, in process (ms, median): "
                       + "; ".join(f"{k} {v:.1f}" for k, v in r["render_cpu_ms"].items()))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0].startswith("_"):
        sub = argparse.ArgumentParser()
        for flag, kind in (("--endpoint", str), ("--seed", int), ("--senders", int), ("--batch", int),
                           ("--records", int), ("--hwm", int), ("--rate", int), ("--seconds", float),
                           ("--workers", int), ("--names", int), ("--period", float)):
            sub.add_argument(flag, type=kind)
        sub.add_argument("--nodrop", action="store_true")
        args = sub.parse_args(argv[1:])
        return {"_publish": publisher_main, "_shim": shim_main, "_series": series_main}[argv[0]](args)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs, fewer repeats")
    parser.add_argument("--only", default="inproc,e2e,paced,scrape", help="comma-separated benchmarks")
    parser.add_argument("--repeats", type=int, default=None, help="runs per benchmark (default 5, quick 2)")
    parser.add_argument("--json", default=None, help="also write the raw results here")
    args = parser.parse_args(argv)
    repeats = args.repeats or (2 if args.quick else 5)
    benches = {"inproc": bench_inproc, "e2e": bench_e2e, "paced": bench_paced, "scrape": bench_scrape}
    results: dict[str, list[dict[str, Any]]] = {}
    for name in args.only.split(","):
        reps = repeats if name in ("inproc", "e2e") else max(1, (repeats + 1) // 2) if not args.quick else 1
        t = time.monotonic()
        results[name] = benches[name](args.quick, reps)
        print(f"[{name}: {time.monotonic() - t:.0f} s]", file=sys.stderr, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    rev = subprocess.run(["git", "-C", code_root(), "describe", "--always", "--dirty"], capture_output=True,
                         text=True).stdout.strip() or "not a git checkout"
    print(f"<!-- {time.strftime('%Y-%m-%d %H:%M')} | {os.uname().nodename} | {os.cpu_count()} cores | "
          f"Python {sys.version.split()[0]} | code {code_root()} ({rev}) | {'quick' if args.quick else 'full'} "
          f"| repeats {repeats} -->")
    print(report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
