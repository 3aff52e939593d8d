"""What the GPU-scalar resolver costs a trainer's thread on CPU, before and after, in one run.

    python bench/bench_scalar.py --old cf69852 --rounds 5      # this checkout against commit cf69852
    python bench/bench_scalar.py --versus . /tmp/other-tree     # any shim trees

A ``ScalarResolver`` from each tree runs over a fake CUDA backend whose events complete
``--event-delay-ms`` (20) after they are recorded (the GPU lagging behind the host, so many
scalars are in flight). The "trainer" is the main thread: each step does a fixed amount of pure
Python (calibrated once here to ``step_ms``: it needs the GIL the whole time, as a launch thread
does) and then submits two scalars. Each run is a fresh interpreter with that tree first on
``PYTHONPATH``, started from a scratch directory (it checks which ``cuda_scalar`` it imported);
every round runs, per configuration, the same loop without scalars and with each tree's
resolver, in rotating order.

Reported per configuration and tree, medians over rounds: steps/s as a share of the same loop
without scalars (goal: >= 99 %), the resolver thread's wake-ups per second (its context
switches, from /proc), its CPU time as a share of the wall time (it holds the GIL while it
runs: its share of the GIL), and the median number of scalars in flight.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (label, step_ms, event delay ms): the two loops, and one with ~64 scalars in flight.
CONFIGS = (("1 ms step", 1.0, 20.0), ("0.12 ms step", 0.12, 20.0), ("1 ms step, 64 in flight", 1.0, 32.0))

CHILD = r"""
import json, os, statistics, sys, threading, time

spins, n_scalars, delay_s, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])


class Stream:
    device = "cuda:0"


STREAM = Stream()


class Event:
    due = None

    def record(self, stream=None):
        self.due = time.monotonic() + delay_s

    def query(self):
        return self.due is not None and time.monotonic() >= self.due


class Slot:
    dtype = "float32"
    value = None

    def copy_(self, src, non_blocking=False):
        self.value = src.value

    def item(self):
        return self.value


class Tensor:
    is_cuda = True
    device = "cuda:0"
    dtype = "float32"

    def __init__(self, value):
        self.value = value

    def numel(self):
        return 1

    def detach(self):
        return self

    def reshape(self, shape):
        return self

    def record_stream(self, stream):
        pass


class Backend:
    # The old resolver's protocol and the new one's.
    def __init__(self):
        self.slots = [Slot() for _ in range(1024)]
        self.events = []

    def setup(self, device):
        pass

    def current_stream(self, tensor):
        return STREAM

    def capturing(self, tensor):
        return False

    def pinned_slot(self, dtype):
        return self.slots.pop() if self.slots else None

    def release_slot(self, slot):
        self.slots.append(slot)

    def new_event(self, stream):
        return self.events.pop() if self.events else Event()

    def release_event(self, event):
        event.due = None
        self.events.append(event)

    def copy_after(self, slot, src, stream):
        slot.copy_(src)
        return STREAM


class Sink:
    def __init__(self):
        self.values, self.dropped = 0, {}

    def _append_resolved(self, name, value):
        self.values += 1

    def _count_dropped(self, reason):
        self.dropped[reason] = self.dropped.get(reason, 0) + 1


def work(n):
    x = 0
    for i in range(n):
        x += i
    return x


def switches(native_id):
    with open(f"/proc/self/task/{native_id}/status") as f:
        return sum(int(line.split()[-1]) for line in f if "ctxt_switches" in line)


out = {}
resolver = None
if n_scalars:
    from trainer_shim import cuda_scalar
    out["imported"] = cuda_scalar.__file__
    sink = Sink()
    resolver = cuda_scalar.ScalarResolver(Backend())
    for _ in range(3):  # the resolver thread exists and is set up before the timing starts
        resolver.submit(sink, "warm", Tensor(0.0))
    time.sleep(0.1)
thread = next((t for t in threading.enumerate() if t.name == "trainer-shim-scalars"), None)
if n_scalars and thread is None:
    raise SystemExit("no resolver thread")
work(spins)
steps, in_flight = 0, []
if thread is not None:
    clock = time.pthread_getcpuclockid(thread.ident)
    cpu0, sw0 = time.clock_gettime(clock), switches(thread.native_id)
start = time.perf_counter()
end = start + seconds
loss, norm = Tensor(1.0), Tensor(2.0)
while time.perf_counter() < end:
    work(spins)
    if n_scalars:
        resolver.submit(sink, "loss", loss)
        resolver.submit(sink, "grad_norm", norm)
        in_flight.append(resolver.in_flight())
    steps += 1
wall = time.perf_counter() - start
out["steps_per_s"] = steps / wall
if thread is not None:
    out["resolver_cpu_share"] = (time.clock_gettime(clock) - cpu0) / wall
    out["wakeups_per_s"] = (switches(thread.native_id) - sw0) / wall
    out["in_flight_median"] = statistics.median(in_flight)
    out["dropped"] = sink.dropped
print(json.dumps(out))
"""


def calibrate(step_ms: float) -> int:
    """Iterations of the child's ``work`` loop that take ``step_ms`` here (median of 5)."""
    n = 20_000
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        x = 0
        for i in range(n):
            x += i
        samples.append(time.perf_counter() - t0)
    return max(1, int(n * step_ms / 1000 / statistics.median(samples)))


def run(tree: str | None, spins: int, delay_ms: float, seconds: float, workdir: str) -> dict[str, object]:
    """One run in a fresh interpreter: ``tree``'s resolver (None: the loop without scalars)."""
    root = os.path.abspath(tree) if tree else str(ROOT)
    env = {**os.environ, "PYTHONPATH": root}
    args = [str(spins), "2" if tree else "0", str(delay_ms / 1000), str(seconds)]
    proc = subprocess.run([sys.executable, "-c", CHILD, *args], env=env, cwd=workdir, capture_output=True,
                          text=True, check=True, timeout=120)
    out: dict[str, object] = json.loads(proc.stdout)
    imported = str(out.pop("imported", ""))
    if tree and not os.path.abspath(imported).startswith(root + os.sep):
        raise SystemExit(f"the run for {tree} imported {imported}, not that tree's resolver")
    return out


def old_tree(commit: str, workdir: str) -> str:
    """The shim of ``commit``, from ``git archive`` into a scratch directory."""
    dest = os.path.join(workdir, f"tree-{commit}")
    os.makedirs(dest)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "trainer_shim"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", metavar="COMMIT", help="compare this checkout with the shim of COMMIT")
    parser.add_argument("--versus", nargs="+", metavar="TREE", help="shim trees to compare (default: this checkout)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one run")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dfs-scalar-", dir="/tmp") as workdir:
        trees = list(args.versus or [str(ROOT)])
        names = {t: t for t in trees}
        if args.old:
            trees.insert(0, old_tree(args.old, workdir))
            names[trees[0]] = args.old
        print(f"load average at start: {os.getloadavg()}", flush=True)
        spins = {label: calibrate(step) for label, step, _ in CONFIGS}
        results: dict[tuple[str, str | None], list[dict[str, object]]] = {}
        for r in range(args.rounds):
            for label, _, delay in CONFIGS:
                order: list[str | None] = [None, *trees]
                order = order[r % len(order):] + order[:r % len(order)]
                for tree in order:
                    results.setdefault((label, tree), []).append(run(tree, spins[label], delay, args.seconds,
                                                                     workdir))
            print(f"round {r + 1}/{args.rounds} done, load {os.getloadavg()}", flush=True)
        print(f"load average at end: {os.getloadavg()}\n")
        report(results, trees, names)
    return 0


def report(results: dict[tuple[str, str | None], list[dict[str, object]]], trees: list[str],
           names: dict[str, str]) -> None:
    """The Markdown table: medians over rounds; ranges of the per-round ratios."""
    print("| loop | shim | steps/s (no scalars) | with 2 scalars/step | ratio, median (range) "
          "| resolver wake-ups/s | resolver CPU (GIL) share | in flight |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, _, _ in CONFIGS:
        base_runs = [float(str(r["steps_per_s"])) for r in results[(label, None)]]
        for tree in trees:
            runs = results[(label, tree)]
            rates = [float(str(r["steps_per_s"])) for r in runs]
            ratios = [a / b for a, b in zip(rates, base_runs)]

            def med(key: str) -> float:
                return statistics.median(float(str(r[key])) for r in runs)

            print(f"| {label} | `{names[tree]}` | {statistics.median(base_runs):.0f} | {statistics.median(rates):.0f} "
                  f"| {statistics.median(ratios) * 100:.1f} % ({min(ratios) * 100:.1f}-{max(ratios) * 100:.1f}) "
                  f"| {med('wakeups_per_s'):.0f} | {med('resolver_cpu_share') * 100:.2f} % "
                  f"| {med('in_flight_median'):.0f} |")


if __name__ == "__main__":
    raise SystemExit(main())
