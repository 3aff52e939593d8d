"""What the GPU-scalar resolver costs a trainer's thread on CPU, before and after, in one run.

    python bench/bench_scalar.py --old cf69852 --rounds 5      # this checkout against commit cf69852
    python bench/bench_scalar.py --versus . /tmp/other-tree     # any shim trees

A ``ScalarResolver`` from each tree runs over a fake CUDA backend whose events complete 20 ms
after they are recorded (32 ms in the third loop: the GPU lagging behind the host, so many
scalars are in flight). The "trainer" is the main thread: each step does a fixed amount of pure
Python (calibrated once here to 1 ms or 0.12 ms: it needs the GIL the whole time, as a launch
thread does) and then publishes two scalars through a channel's ``scalar`` (what
``telemetry.scalar`` calls: the whole call a trainer pays, the channel's part included), the
tree's resolver being the one over the fake backend. A "flusher" thread wakes every 0.1 s as the
shim's does, takes the resolver's turn where that tree's publisher does (this one's), and drains
the channel. Each run is a
fresh interpreter with one tree first on ``PYTHONPATH``, started from a scratch directory (it
checks which ``cuda_scalar`` it imported); each round runs every loop with every tree, the
trees' order alternating.

Within each run, blocks of steps with and without the scalars alternate (``--block`` seconds
each, after the resolver drained: the blocks without scalars see an idle resolver), so load on a
shared machine hits both sides of a pair alike. Reported per loop and tree, over every pair of
every round: steps/s with scalars as a share of without (median and interquartile range; goal:
>= 99 %), the caller's two calls in the loop (steps timed one by one, each step with the calls
paired with the step before it: the median of the pairs' differences is their cost, and the
share is a step's median over the step plus that cost; the VM's drift, which moves the medians of
whole blocks, cancels within a pair), one call's cost to the caller (500 back to back, no
resolver thread running, median of 30), the resolver thread's CPU time as a share of the wall
time (it holds the GIL while it runs: its share of the GIL), the same for the flusher (which
takes this tree's turns), the resolver thread's context switches per second (wake-ups and GIL
hand-offs, from /proc), the median number of scalars in flight, and the scalars dropped (``scalar_backlog``,
all runs).
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# (label, step_ms, event delay ms): the two loops, and one with ~64 scalars in flight.
CONFIGS = (("1 ms step", 1.0, 20.0), ("0.12 ms step", 0.12, 20.0), ("1 ms step, 64 in flight", 1.0, 32.0))

CONTROL = "#control"
"""Suffix of the control run's key: this checkout with the scalars in both blocks of a pair, whose
share of "without" would be 100 % on a quiet machine; its median and spread are the method's own
resolution here."""

CHILD = r"""
import json, os, statistics, sys, threading, time

spins, delay_s, seconds, block_s = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
control = sys.argv[5] == "1"  # scalars in both blocks of a pair: the method's own floor


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

    def dim(self):
        return 0

    def reshape(self, shape):
        return self

    def record_stream(self, stream):
        pass


class Backend:
    # The old resolver's protocol and the new one's.
    def __init__(self):
        self.slots = [Slot() for _ in range(2048)]
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

    def top_up(self):
        pass

    def copy_after(self, slot, src, stream):
        slot.copy_(src)
        return STREAM


def work(n):
    x = 0
    for i in range(n):
        x += i
    return x


def switches(native_id):
    with open(f"/proc/self/task/{native_id}/status") as f:
        return sum(int(line.split()[-1]) for line in f if "ctxt_switches" in line)


from trainer_shim import cuda_scalar
from trainer_shim.channel import Channel


def quiet_channel():
    # A channel whose scalars go to a resolver over the fake backend with no thread running:
    # the trainer's call (``Channel.scalar``, what ``telemetry.scalar`` calls) and nothing else.
    quiet = cuda_scalar.ScalarResolver(Backend(), max_in_flight=10**9, autostart=False)
    if hasattr(quiet, "setup"):
        quiet.setup(None)
    cuda_scalar._resolver = quiet
    return Channel("bench", "w0", 10**6, [0]), quiet


out = {"imported": cuda_scalar.__file__}
per_call = []
for _ in range(30):  # the caller's cost of one call, no resolver thread running
    ch, _quiet = quiet_channel()
    one = Tensor(1.0)
    t0 = time.perf_counter_ns()
    for _ in range(500):
        ch.scalar("x", one)
    per_call.append((time.perf_counter_ns() - t0) / 500)
out["submit_ns"] = statistics.median(per_call)


def in_loop_share():
    # Steps timed one by one, the caller's two calls on every other step, the resolver quiet
    # (nothing resolves): the calls' own cost, in place, with the caches cold after a step's
    # work. Each step with the calls is paired with the step just before it, and the median of
    # the pairs' differences is the calls' cost: neighbouring steps see the same machine, so the
    # VM's drift between blocks (which moves the median of a whole column) cancels.
    ch, quiet = quiet_channel()
    a, b = Tensor(1.0), Tensor(2.0)
    diffs, without = [], []
    for _ in range(min(1000, len(quiet.backend.slots) // 2)):
        t0 = time.perf_counter_ns()
        work(spins)
        t1 = time.perf_counter_ns()
        work(spins)
        ch.scalar("loss", a)
        ch.scalar("grad_norm", b)
        t2 = time.perf_counter_ns()
        without.append(t1 - t0)
        diffs.append((t2 - t1) - (t1 - t0))
    step, cost = statistics.median(without), statistics.median(diffs)
    return step / (step + cost), cost


out["in_loop_share"], out["in_loop_cost_ns"] = in_loop_share()
resolver = cuda_scalar.ScalarResolver(Backend())
cuda_scalar._resolver = resolver
sink = Channel("bench", "w0", 10**6, [0])
for _ in range(3):  # the resolver thread exists and is set up before the timing starts
    sink.scalar("warm", Tensor(0.0))
time.sleep(0.1)
thread = next(t for t in threading.enumerate() if t.name == "trainer-shim-scalars")
turns = getattr(resolver, "turn", None)  # this tree's publisher has its flusher take the turns


def flusher():
    # The shim's flusher wakes every 0.1 s whatever the trainer does; here it also takes the
    # resolver's turn where the tree's publisher does.
    while True:
        time.sleep(0.1)
        if turns is not None:
            turns()
        sink.drain()


flusher_thread = threading.Thread(target=flusher, name="flusher", daemon=True)
flusher_thread.start()
flusher_clock = time.pthread_getcpuclockid(flusher_thread.ident)
clock = time.pthread_getcpuclockid(thread.ident)
loss, norm = Tensor(1.0), Tensor(2.0)


def block(scalars):
    # One block of steps: its steps/s, the resolver's CPU share and switches.
    while resolver.in_flight():  # the previous block's scalars resolved: an idle resolver
        time.sleep(0.005)
    work(spins)
    steps, in_flight = 0, []
    cpu0, sw0, fl0 = time.clock_gettime(clock), switches(thread.native_id), time.clock_gettime(flusher_clock)
    start = time.perf_counter()
    end = start + block_s
    while time.perf_counter() < end:
        work(spins)
        if scalars or control:
            sink.scalar("loss", loss)
            sink.scalar("grad_norm", norm)
            in_flight.append(resolver.in_flight())
        steps += 1
    wall = time.perf_counter() - start
    return {"rate": steps / wall, "flusher_cpu_share": (time.clock_gettime(flusher_clock) - fl0) / wall,
            "resolver_cpu_share": (time.clock_gettime(clock) - cpu0) / wall,
            "switches_per_s": (switches(thread.native_id) - sw0) / wall,
            "in_flight": statistics.median(in_flight) if in_flight else 0}


pairs = []
for i in range(max(1, int(seconds / (2 * block_s)))):
    first = i % 2 == 0  # alternate which goes first
    a = block(first)
    b = block(not first)
    with_, without = (a, b) if first else (b, a)
    pairs.append({"ratio": with_["rate"] / without["rate"], "with": with_, "without": without})
out["pairs"] = pairs
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


def run(tree: str, spins: int, delay_ms: float, seconds: float, block_s: float, workdir: str,
        control: bool = False) -> list[dict[str, Any]]:
    """One run of ``tree``'s resolver in a fresh interpreter: its block pairs (``control``: with
    the scalars in both blocks of each pair)."""
    root = os.path.abspath(tree)
    env = {**os.environ, "PYTHONPATH": root}
    args = [str(spins), str(delay_ms / 1000), str(seconds), str(block_s), "1" if control else "0"]
    proc = subprocess.run([sys.executable, "-c", CHILD, *args], env=env, cwd=workdir, capture_output=True,
                          text=True, check=True, timeout=120)
    out = json.loads(proc.stdout)
    if not os.path.abspath(out["imported"]).startswith(root + os.sep):
        raise SystemExit(f"the run for {tree} imported {out['imported']}, not that tree's resolver")
    pairs: list[dict[str, Any]] = out["pairs"]
    for pair in pairs:
        pair["submit_ns"] = out["submit_ns"]
        pair["in_loop_share"] = out["in_loop_share"]
        pair["in_loop_cost_ns"] = out["in_loop_cost_ns"]
        pair["dropped"] = sum(out["dropped"].values()) / len(pairs)
    return pairs


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
    parser.add_argument("--block", type=float, default=0.25, help="length of one block of steps (s)")
    parser.add_argument("--no-control", dest="control", action="store_false",
                        help="leave out the control run (this checkout with scalars in both blocks)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dfs-scalar-", dir="/tmp") as workdir:
        trees = list(args.versus or [str(ROOT)])
        names = {t: t for t in trees}
        if args.old:
            trees.insert(0, old_tree(args.old, workdir))
            names[trees[0]] = args.old
        print(f"load average at start: {os.getloadavg()}", flush=True)
        spins = {label: calibrate(step) for label, step, _ in CONFIGS}
        results: dict[tuple[str, str], list[dict[str, Any]]] = {}
        # (tree, control): every tree, then the last (this checkout) with scalars on both sides
        setups = [(t, False) for t in trees] + ([(trees[-1], True)] if args.control else [])
        for r in range(args.rounds):
            for label, _, delay in CONFIGS:
                for tree, control in setups if r % 2 == 0 else setups[::-1]:
                    results.setdefault((label, tree + CONTROL * control), []).extend(
                        run(tree, spins[label], delay, args.seconds, args.block, workdir, control))
            print(f"round {r + 1}/{args.rounds} done, load {os.getloadavg()}", flush=True)
        print(f"load average at end: {os.getloadavg()}\n")
        if args.control:
            names[trees[-1] + CONTROL] = f"{names[trees[-1]]}, control: scalars on both sides"
        report(results, [t for t, control in setups if not control] + [trees[-1] + CONTROL] * args.control, names)
    return 0


def report(results: dict[tuple[str, str], list[dict[str, Any]]], trees: list[str], names: dict[str, str]) -> None:
    """The Markdown table: medians over every block pair of every round."""
    print("| loop | shim | steps/s with 2 scalars/step, share of without: median (IQR) | the caller's two calls in "
          "the loop: share of steps/s (their cost) | one call, no resolver running | resolver thread CPU (GIL) share "
          "| flusher CPU share | resolver switches/s | in flight | dropped |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, _, _ in CONFIGS:
        for tree in trees:
            pairs = results[(label, tree)]
            ratios = sorted(p["ratio"] for p in pairs)
            q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3

            def med(side: str, key: str) -> float:
                return statistics.median(float(p[side][key]) for p in pairs)

            print(f"| {label} | `{names[tree]}` | {statistics.median(ratios) * 100:.1f} % "
                  f"({q1 * 100:.1f}-{q3 * 100:.1f}, {len(ratios)} pairs) "
                  f"| {statistics.median(p['in_loop_share'] for p in pairs) * 100:.2f} % "
                  f"({statistics.median(p['in_loop_cost_ns'] for p in pairs) / 1000:.1f} us) "
                  f"| {statistics.median(p['submit_ns'] for p in pairs) / 1000:.2f} us "
                  f"| {med('with', 'resolver_cpu_share') * 100:.2f} % | {med('with', 'flusher_cpu_share') * 100:.2f} % "
                  f"| {med('with', 'switches_per_s'):.0f} "
                  f"| {med('with', 'in_flight'):.0f} | {sum(p['dropped'] for p in pairs):.0f} |")


if __name__ == "__main__":
    raise SystemExit(main())
