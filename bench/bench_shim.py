"""Per-record cost of the trainer shim against what a trainer would otherwise use, in one run.

    python bench/bench_shim.py            # full run, a few minutes on 2 cores
    python bench/bench_shim.py --quick    # smoke run, ~30 s
    python bench/bench_shim.py --versus . /tmp/first-build --rounds 7   # hot path, interleaved

Contenders, each record kind as its users call it:

* the shim (``trainer_shim.telemetry``): timing, count, gauge, category, publish of a 20-key dict
  (one call = one record), timer (a ``with`` block);
* the ``statsd`` client (UDP to a local port): timing, incr, gauge;
* DogStatsD (``datadog`` 0.56): default (one UDP send per call), buffered
  (``disable_buffering=False``) and aggregation (``disable_aggregation=False``, buffered,
  ``max_metric_samples_per_context=1000`` so timings are aggregated too): timing, increment, gauge;
* in-process ``prometheus_client``: ``Gauge.set`` without and with labels, ``Histogram.observe``;
* ``wandb.log`` of a 20-key dict, offline mode (fewer calls);
* taps (``--only taps``, ``bench/bench_taps.py``): W&B, TensorBoard and MLflow calls with and
  without the tap, alternating, and the tap alone; printed as their own table.

Receiver states (socket clients only): **up** (a separate process draining), **absent** (nothing
bound), **stalled** (bound and never read: for the shim a SUB that is never polled, so it never
subscribes; for UDP a socket never read), and for the shim also **hung** (subscribed, then never
read again: the shim keeps encoding and sending until ZeroMQ's queues are full and it drops).
Modes: **b2b** (calls back to back) and **spaced** (100 us of busy work
between calls, about 10,000 records/s).

Each call is timed with ``perf_counter_ns()`` before and after; the overhead of that pair with
nothing between, measured in the same loop shape, is subtracted from every statistic. Latency:
median, p99, p99.9 and the worst call. CPU per record: the calls themselves (sum of measured call
times) plus every background thread of this process (process CPU minus main-thread CPU over the
run, through the final flush), divided by the number of calls; the receiving process is not
counted (that is the daemon's cost). Results print as Markdown tables; ``--json`` saves them.
"""

from __future__ import annotations

import argparse
import array
import gc
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from shim_helpers import ReceiverProcess  # noqa: E402

from tests.daemon_harness import free_port  # noqa: E402 - the tests' harness, shared
from trainer_shim import telemetry  # noqa: E402

SPACING_NS = 100_000
STATES = ("up", "absent", "stalled")
SHIM_STATES = STATES + ("hung",)
PROFILE = {f"stage{i}_ms" if i < 10 else f"value{i}": float(i) * 1.25 for i in range(20)}


@dataclass
class Row:
    lib: str
    kind: str
    state: str
    mode: str
    n: int
    median_ns: float
    p99_ns: float
    p999_ns: float
    worst_ns: float
    call_cpu_ns: float  # per record, the calls themselves
    bg_cpu_ns: float  # per record, background threads of this process
    note: str = ""

    @property
    def cpu_ns(self) -> float:
        return self.call_cpu_ns + self.bg_cpu_ns


# -- the measurement loop --------------------------------------------------------------------------

_LOOP = '''
def loop(n, out, spaced_ns, pc, c, d):
    for i in range(n):
        if spaced_ns:
            end = pc() + spaced_ns
            while pc() < end:
                pass
        t0 = pc()
        {stmt}
        t1 = pc()
        out[i] = t1 - t0
'''


def make_loop(stmt: str) -> Callable[..., None]:
    """A loop with ``stmt`` inlined between the two clock reads (``c``: the client, ``d``: the
    20-key dict, ``i``: the call index)."""
    namespace: dict[str, Any] = {}
    exec(_LOOP.format(stmt=stmt.replace("\n", "\n        ")), namespace)  # noqa: S102
    return namespace["loop"]


def run_loop(stmt: str, client: Any, n: int, spaced: bool, settle: Callable[[], None]) -> tuple[array.array, int, int]:
    """Returns (per-call ns, process CPU ns, main-thread CPU ns) over the loop plus ``settle``."""
    loop = make_loop(stmt)
    out = array.array("q", bytes(8 * n))
    loop(min(n, 1000), out, 0, time.perf_counter_ns, client, PROFILE)  # warm-up
    settle()
    p0, m0 = time.process_time_ns(), time.thread_time_ns()
    loop(n, out, SPACING_NS if spaced else 0, time.perf_counter_ns, client, PROFILE)
    settle()
    return out, time.process_time_ns() - p0, time.thread_time_ns() - m0


_overhead: dict[tuple[bool, int], tuple[float, float]] = {}


def timer_overhead(spaced: bool, n: int) -> tuple[float, float]:
    """(median ns, main-thread CPU ns per iteration) of the same loop with nothing between the
    two clock reads."""
    key = (spaced, n)
    if key not in _overhead:
        out, _, main_cpu = run_loop("pass", None, n, spaced, lambda: None)
        _overhead[key] = (float(sorted(out)[len(out) // 2]), main_cpu / n)
    return _overhead[key]


_caller_cpu: dict[tuple[str, str, str], float] = {}


def measure(lib: str, kind: str, state: str, mode: str, stmt: str, client: Any, n: int,
            repeats: int, settle: Callable[[], None] = lambda: None, note: str = "") -> Row:
    """Median over ``repeats`` runs of each statistic (the worst call: the worst of all runs).

    CPU per record = the caller's own CPU (main-thread CPU time of the back-to-back run minus
    that of the empty loop, per call; busy work makes the spaced run's main-thread CPU useless
    for this) + background CPU of this run (process minus main thread: flusher and ZeroMQ or
    client threads, through the final flush), per call."""
    spaced = mode == "spaced"
    overhead, overhead_cpu = timer_overhead(spaced, n)
    runs = []
    for _ in range(repeats):
        gc.collect()
        out, proc_cpu, main_cpu = run_loop(stmt, client, n, spaced, settle)
        ns = sorted(out)

        def pct(q: float, ns: list[int] = ns) -> float:
            return max(ns[min(len(ns) - 1, int(q * len(ns)))] - overhead, 0.0)

        if not spaced:
            _caller_cpu[(lib, kind, state)] = max(main_cpu / n - overhead_cpu, 0.0)
        runs.append((pct(0.5), pct(0.99), pct(0.999), max(ns[-1] - overhead, 0.0),
                     max(proc_cpu - main_cpu, 0) / n))
    med = [statistics.median(col) for col in zip(*runs)]
    row = Row(lib, kind, state, mode, n, med[0], med[1], med[2], max(r[3] for r in runs),
              _caller_cpu.get((lib, kind, state), float("nan")), med[4], note)
    print(f"  {lib:<22} {kind:<16} {state:<8} {mode:<6} median {row.median_ns:8.0f} ns  "
          f"p99 {row.p99_ns:8.0f}  p99.9 {row.p999_ns:9.0f}  worst {row.worst_ns:10.0f}  "
          f"cpu {row.call_cpu_ns:6.0f} + {row.bg_cpu_ns:6.0f} ns/rec {note}", flush=True)
    return row


# -- receivers ---------------------------------------------------------------------------------------


_UDP_SERVER = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", int(sys.argv[1])))
print("ready", flush=True)
if sys.argv[2] == "up":
    while True:
        s.recv(65536)
else:
    time.sleep(3600)
"""


@contextmanager
def udp_receiver(state: str) -> Iterator[int]:
    port = free_port(socket.SOCK_DGRAM)
    proc = None
    if state != "absent":
        proc = subprocess.Popen([sys.executable, "-c", _UDP_SERVER, str(port), state],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    try:
        yield port
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


@contextmanager
def zmq_receiver(state: str, workdir: str) -> Iterator[tuple[str, ReceiverProcess | None]]:
    endpoint = f"ipc://{workdir}/{state}.sock"
    rx = None if state == "absent" else ReceiverProcess(endpoint, None, stalled=state == "stalled")
    if rx is not None:  # as a daemon does once bound: the shim then keeps its tally there
        os.makedirs(f"{workdir}/{state}.sock.tallies", exist_ok=True)
    try:
        yield endpoint, rx
    finally:
        if rx is not None:
            rx.stop()


# -- contenders ----------------------------------------------------------------------------------------

SHIM_KINDS = {
    "timing": 'c.timing("step_ms", 12.5)',
    "count": 'c.count("tokens", 4096)',
    "gauge": 'c.gauge("queue_depth", 3.0)',
    "category": 'c.category("bucket", 3)',
    "publish(20 keys)": "c.publish(i, d)",
    "timer": 'with c.timer("data_wait"):\n    pass',
}
STATSD_KINDS = {"timing": 'c.timing("step_ms", 12.5)', "count": 'c.incr("tokens", 4096)',
                "gauge": 'c.gauge("queue_depth", 3.0)'}
DOGSTATSD_KINDS = {"timing": 'c.timing("step_ms", 12.5)', "count": 'c.increment("tokens", 4096)',
                   "gauge": 'c.gauge("queue_depth", 3.0)'}


def bench_shim(states: tuple[str, ...], n_b2b: int, n_spaced: int, workdir: str, repeats: int) -> list[Row]:
    rows = []
    for state in states:
        with zmq_receiver(state, workdir) as (endpoint, rx):
            for kind, stmt in SHIM_KINDS.items():
                for mode, n in (("b2b", n_b2b), ("spaced", n_spaced)):
                    if state == "hung" and rx is not None:
                        rx.resume()
                    telemetry.configure(endpoint=endpoint, role="bench", worker="0", allocator_interval_s=0)
                    telemetry.count("warmup")
                    telemetry.flush(wait_s=5)  # connected, subscribed (up) before timing
                    if state == "hung" and rx is not None:
                        rx.stall()  # subscribed, then stops reading: ZeroMQ's queues fill up
                    rows.append(measure("shim", kind, state, mode, stmt, telemetry, n, repeats,
                                        settle=lambda: telemetry.flush(wait_s=30)))
                    (st,) = telemetry.stats().values()
                    full = st["dropped"].get("buffer_full", 0)
                    if full:
                        rows[-1].note = f"{full} buffer_full"
            telemetry.close()
    return rows


def bench_statsd(states: tuple[str, ...], n_b2b: int, n_spaced: int, repeats: int) -> list[Row]:
    import statsd

    rows = []
    for state in states:
        with udp_receiver(state) as port:
            client = statsd.StatsClient("127.0.0.1", port)
            for kind, stmt in STATSD_KINDS.items():
                for mode, n in (("b2b", n_b2b), ("spaced", n_spaced)):
                    rows.append(measure("statsd", kind, state, mode, stmt, client, n, repeats))
            client.close()
    return rows


def bench_dogstatsd(states: tuple[str, ...], n_b2b: int, n_spaced: int, repeats: int) -> list[Row]:
    from datadog.dogstatsd import DogStatsd

    configs = {
        "dogstatsd default": {},
        "dogstatsd buffered": {"disable_buffering": False},
        "dogstatsd aggregation": {"disable_aggregation": False, "disable_buffering": False,
                                  "max_metric_samples_per_context": 1000},
    }
    rows = []
    for state in states:
        with udp_receiver(state) as port:
            for lib, kwargs in configs.items():
                for kind, stmt in DOGSTATSD_KINDS.items():
                    for mode, n in (("b2b", n_b2b), ("spaced", n_spaced)):
                        client = DogStatsd(host="127.0.0.1", port=port, **kwargs)
                        rows.append(measure(lib, kind, state, mode, stmt, client, n, repeats,
                                            settle=client.flush))
                        close_dogstatsd(client)
    return rows


def close_dogstatsd(client: Any) -> None:
    """Stop a client and its flush thread. ``stop()`` alone leaves the flush thread running
    (datadog 0.56 sets the flags without the setters that stop it), which would bill its
    wake-ups to every later measurement as background CPU."""
    client.disable_aggregation()
    client.disable_buffering = True  # stops the flush thread once both are off
    client.stop(timeout=2)


def bench_prometheus(n_b2b: int, n_spaced: int, repeats: int) -> list[Row]:
    import prometheus_client as prom

    registry = prom.CollectorRegistry()
    gauge = prom.Gauge("queue_depth", "h", registry=registry)
    labelled = prom.Gauge("queue_depth_l", "h", ["role", "worker"], registry=registry)
    hist = prom.Histogram("step_seconds", "h", registry=registry)
    kinds = {
        "gauge": ("c[0].set(3.0)", (gauge,)),
        "gauge labels()": ('c[0].labels("drafter", "0").set(3.0)', (labelled,)),
        "timing (histogram)": ("c[0].observe(0.0125)", (hist,)),
    }
    rows = []
    for kind, (stmt, client) in kinds.items():
        for mode, n in (("b2b", n_b2b), ("spaced", n_spaced)):
            rows.append(measure("prometheus_client", kind, "n/a", mode, stmt, client, n, repeats,
                                note="in-process, no transport"))
    return rows


def bench_taps_section(rounds: int, reports: list[str]) -> list[Row]:
    """The taps' own benchmark (``bench/bench_taps.py``): its table goes to ``reports``."""
    import bench_taps

    reports.append(bench_taps.run(rounds))
    return []


def bench_wandb(n: int, workdir: str) -> list[Row]:
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    run = wandb.init(mode="offline", dir=workdir, project="dflash-bench",
                     settings=wandb.Settings(console="off", x_disable_stats=True))
    rows = []
    try:
        for mode in ("b2b", "spaced"):
            rows.append(measure("wandb offline", "log(20 keys)", "n/a", mode, "c.log(d)", run, n, 1,
                                note="its service process's CPU not counted"))
    finally:
        run.finish()
    return rows


# -- report ----------------------------------------------------------------------------------------------


def fmt(ns: float) -> str:
    if ns >= 1e6:
        return f"{ns / 1e6:.1f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} µs"
    return f"{ns:.0f} ns"


def table(rows: list[Row]) -> str:
    lines = ["| library | record | receiver | calls | n | median | p99 | p99.9 | worst "
             "| CPU/record (calls + background) | note |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r.lib} | {r.kind} | {r.state} | {r.mode} | {r.n} | {fmt(r.median_ns)} | "
                     f"{fmt(r.p99_ns)} | {fmt(r.p999_ns)} | {fmt(r.worst_ns)} | {fmt(r.cpu_ns)} "
                     f"({fmt(r.call_cpu_ns)} + {fmt(r.bg_cpu_ns)}) | {r.note} |")
    return "\n".join(lines)


TARGETS = {"median": 300.0, "p99": 2000.0, "p99.9": 20000.0, "cpu": 1000.0}


def summary(rows: list[Row]) -> str:
    """Per shim record kind: the worst value over receiver states and modes, against SPEC §7, and
    the ratio to DogStatsD's aggregation mode (same kind, same state and mode) where it exists."""
    agg = {(r.kind, r.state, r.mode): r for r in rows if r.lib == "dogstatsd aggregation"}
    lines = ["| shim record | worst median | worst p99 | worst p99.9 | worst call | worst CPU/record | "
             "median ÷ DogStatsD aggregation | CPU ÷ DogStatsD aggregation | targets met |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for kind in SHIM_KINDS:
        mine = [r for r in rows if r.lib == "shim" and r.kind == kind]
        if not mine:
            continue
        worst = {"median": max(r.median_ns for r in mine), "p99": max(r.p99_ns for r in mine),
                 "p99.9": max(r.p999_ns for r in mine), "cpu": max(r.cpu_ns for r in mine)}
        ratios = [(r.median_ns / agg[(kind, r.state, r.mode)].median_ns,
                   r.cpu_ns / agg[(kind, r.state, r.mode)].cpu_ns)
                  for r in mine if (kind, r.state, r.mode) in agg]
        med_ratio = f"{min(x for x, _ in ratios):.2f}–{max(x for x, _ in ratios):.2f}" if ratios else "—"
        cpu_ratio = f"{min(y for _, y in ratios):.2f}–{max(y for _, y in ratios):.2f}" if ratios else "—"
        met = [k for k, limit in TARGETS.items() if worst[k] <= limit]
        missed = [k for k in TARGETS if k not in met]
        verdict = "all" if not missed else "missed: " + ", ".join(missed)
        lines.append(f"| {kind} | {fmt(worst['median'])} | {fmt(worst['p99'])} | {fmt(worst['p99.9'])} | "
                     f"{fmt(max(r.worst_ns for r in mine))} | {fmt(worst['cpu'])} | {med_ratio} | "
                     f"{cpu_ratio} | {verdict} |")
    return "\n".join(lines)


HOT_PATH = """
import json, statistics, sys, time
from time import perf_counter_ns
from trainer_shim import telemetry
ch = telemetry.configure(endpoint=sys.argv[1])
telemetry.count("warmup")
time.sleep(0.7)  # past the connect grace: every flush drains (no_receiver)
N, SAMPLES = 2000, 25
profile = {f"k{i}_ms": float(i) for i in range(20)}

def flush():
    try:
        telemetry.flush(0.5)
    except TypeError:  # an early shim: flush() without a wait
        telemetry.flush()
        time.sleep(0.12)

class Empty:
    __slots__ = ()
    def __enter__(self): pass
    def __exit__(self, *exc): pass

empty = Empty()

def floor():  # a with block on a Python context manager and two clock reads
    with empty:
        perf_counter_ns()
        perf_counter_ns()

def t_timer():
    with telemetry.timer("b"):
        pass

def c_timer():
    with ch.timer("b"):
        pass

CALLS = {
    "telemetry.count": lambda: telemetry.count("n"),
    "telemetry.timing": lambda: telemetry.timing("t", 1.5),
    "telemetry.gauge": lambda: telemetry.gauge("g", 1.5),
    "telemetry.publish": lambda: telemetry.publish(1, profile),
    "ch.count": lambda: ch.count("n"),
    "ch.timing": lambda: ch.timing("t", 1.5),
    "ch.gauge": lambda: ch.gauge("g", 1.5),
    "ch.publish": lambda: ch.publish(1, profile),
    "telemetry.timer": t_timer,
    "ch.timer": c_timer,
    "floor: with + 2 clock reads": floor,
}

def per_call(fn):
    out = []
    for _ in range(SAMPLES):
        t0 = perf_counter_ns()
        for _ in range(N):
            fn()
        out.append((perf_counter_ns() - t0) / N)
        flush()
    return statistics.median(out)

base = per_call(lambda: None)
print(json.dumps({"__file__": telemetry.__file__, **{name: per_call(fn) - base for name, fn in CALLS.items()}}))
"""


def versus(trees: list[str], rounds: int) -> int:
    """Interleaved hot-path comparison: each round runs every shim tree once, in a fresh
    interpreter with that tree first on ``PYTHONPATH`` (no receiver: only the trainer side is
    measured). Prints per call kind the median over rounds of each tree's per-call cost (ns,
    mean over batches of 2,000 calls, median of 25 batches, empty-call loop subtracted) and the
    ratio of every tree to the first."""
    results: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
    print(f"load average at start: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="dfs-vs-", dir="/tmp") as workdir:
        for r in range(rounds):
            for tree in trees if r % 2 == 0 else trees[::-1]:
                # Run from the scratch directory: ``python -c`` puts its working directory ahead
                # of PYTHONPATH, so from a checkout every tree would import that checkout's shim.
                root = os.path.abspath(tree)
                env = {**os.environ, "PYTHONPATH": root}
                env.pop("DFLASH_SIDECAR_ENDPOINT", None)
                out = subprocess.run([sys.executable, "-c", HOT_PATH, f"ipc://{workdir}/nobody.sock"],
                                     env=env, cwd=workdir, capture_output=True, text=True, check=True,
                                     timeout=600)
                costs = json.loads(out.stdout)
                imported = costs.pop("__file__")
                if not os.path.abspath(imported).startswith(root + os.sep):
                    raise SystemExit(f"the run for {tree} imported {imported}, not that tree's shim "
                                     "(an installed trainer_shim shadows PYTHONPATH?)")
                results[tree].append(costs)
            print(f"round {r + 1}/{rounds} done, load {os.getloadavg()}", flush=True)
    print(f"load average at end: {os.getloadavg()}")
    head = " | ".join(f"`{t}`" for t in trees)
    print(f"\n| call | {head} | ratios to the first |\n| --- |{' --- |' * len(trees)} --- |")
    for kind in results[trees[0]][0]:
        med = [statistics.median(run[kind] for run in results[t]) for t in trees]
        ratios = ", ".join(f"{m / med[0]:.2f}" for m in med[1:])
        print(f"| {kind} | " + " | ".join(f"{m:.0f} ns" for m in med) + f" | {ratios} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10x fewer calls: a smoke run")
    parser.add_argument("--repeats", type=int, default=None,
                        help="runs per configuration, medians reported (default 3, 1 with --quick)")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--only", nargs="*", default=None,
                        choices=["shim", "statsd", "dogstatsd", "prometheus", "wandb", "taps"])
    parser.add_argument("--states", nargs="*", default=None, choices=list(SHIM_STATES),
                        help="receiver states to run (default: all)")
    parser.add_argument("--versus", nargs="+", metavar="TREE",
                        help="instead: interleaved hot-path costs of these source trees' shims "
                             "(e.g. this checkout and a scratch worktree of the first build)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of --versus")
    args = parser.parse_args(argv)
    if args.versus:
        return versus(args.versus, args.rounds)
    scale = 10 if args.quick else 1
    repeats = args.repeats or (1 if args.quick else 3)
    n_b2b, n_spaced = 90_000 // scale, 20_000 // scale  # b2b below max_pending: no overflow
    n_other_b2b, n_other_spaced, n_wandb = 50_000 // scale, 5_000 // scale, 300 // scale
    only = set(args.only or ["shim", "statsd", "dogstatsd", "prometheus", "wandb", "taps"])
    print(f"# bench_shim {'--quick ' if args.quick else ''}on {platform.node()}: Python "
          f"{platform.python_version()}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"load average at start: {os.getloadavg()}; {repeats} run(s) per configuration, medians")
    print(f"timer overhead subtracted: b2b {timer_overhead(False, n_b2b)[0]:.0f} ns, "
          f"spaced {timer_overhead(True, n_spaced)[0]:.0f} ns", flush=True)
    rows: list[Row] = []
    reports: list[str] = []
    states = tuple(x for x in args.states or STATES if x in STATES)
    with tempfile.TemporaryDirectory(prefix="dfs-bench-", dir="/tmp") as workdir:
        sections: list[tuple[str, Callable[[], list[Row]]]] = [
            ("shim", lambda: bench_shim(tuple(args.states or SHIM_STATES), n_b2b, n_spaced, workdir, repeats)),
            ("dogstatsd", lambda: bench_dogstatsd(states, n_other_b2b, n_other_spaced, repeats)),
            ("statsd", lambda: bench_statsd(states, n_other_b2b, n_other_spaced, repeats)),
            ("prometheus", lambda: bench_prometheus(n_other_b2b, n_other_spaced, repeats)),
            ("wandb", lambda: bench_wandb(n_wandb, workdir)),
            ("taps", lambda: bench_taps_section(1 if args.quick else 5, reports)),
        ]
        for name, section in sections:
            if name not in only:
                continue
            before = {t.ident for t in threading.enumerate()}
            rows += section()
            time.sleep(0.5)
            left = [t.name for t in threading.enumerate() if t.ident not in before]
            if left:  # they would count as background CPU in every later row
                print(f"WARNING: {name} left threads running: {left}", flush=True)
    print(f"load average at end: {os.getloadavg()}")
    print()
    print(summary(rows))
    print()
    print(table(rows))
    for report in reports:
        print()
        print(report)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
