"""A capture on request in a real CPU training loop: how long it takes, and the step rate before
and after it.

    python bench/bench_capture_loop.py --rounds 5 --window 10

A real daemon and the tests' CPU loop (``tests/capture_loops.py plain``: forward, backward, SGD,
a DataLoader with 2 worker processes, ``publish`` per step) in a child process. Each round: the
loop's steps per second over ``--window`` seconds, then ``dflash-sidecar trace --steps 4`` from
another process (timed from its start to its exit: asking, the 4 steps, the export, the
breakdown, the copy), then the steps per second over the next ``--window`` seconds (starting 1 s
after the command returned) and over the ``--window`` seconds after those. Reported: per round and
the medians, the after/before ratios, and what the profiler's start and stop cost the trainer's
thread in each capture (the shim measures them and the command prints them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from tests.launcher import DaemonProc, env  # noqa: E402 - the tests' one launcher, pytest-free


def steps(progress: Path) -> int:
    try:
        return int(json.loads(progress.read_text())["steps"])
    except (OSError, ValueError, KeyError):
        return 0


def rate(progress: Path, window_s: float) -> float:
    """Steps per second over ``window_s``."""
    n0, t0 = steps(progress), time.monotonic()
    time.sleep(window_s)
    return (steps(progress) - n0) / (time.monotonic() - t0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--window", type=float, default=10.0)
    args = parser.parse_args()
    rows, costs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        daemon = DaemonProc(work)
        progress = work / "progress.json"
        loop = subprocess.Popen([sys.executable, "-m", "tests.capture_loops", "plain", str(progress)],
                                env=env(DFLASH_SIDECAR_ENDPOINT=daemon.endpoint, DFLASH_TRACE_MIN_GAP_S="0"),
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while steps(progress) < 20:
                time.sleep(0.2)
            for r in range(args.rounds):
                before = rate(progress, args.window)
                t0 = time.monotonic()
                out = subprocess.run([sys.executable, "-m", "sidecar", "trace", "--endpoint", daemon.endpoint,
                                      "--state-dir", str(work / "state"), "--steps", "4"], env=env(),
                                     capture_output=True, text=True, timeout=120)
                took = time.monotonic() - t0
                if out.returncode != 0:
                    print(out.stderr, file=sys.stderr)
                    return 1
                costs.append(next(ln for ln in out.stdout.splitlines() if "the profiler's start" in ln).strip())
                time.sleep(1.0)
                after = rate(progress, args.window)
                later = rate(progress, args.window)
                rows.append((before, took, after, later))
                print(f"round {r + 1}: {before:.1f} steps/s before, trace --steps 4 took {took:.2f} s, "
                      f"{after:.1f} steps/s after ({after / before:.3f}), {later:.1f} in the next window "
                      f"({later / before:.3f})", flush=True)
        finally:
            loop.kill()
            loop.wait()
            daemon.stop()
    b, t, a, z = (statistics.median(x) for x in zip(*rows, strict=True))
    ratios = [after / before for before, _, after, _ in rows]
    later = [last / before for before, _, _, last in rows]
    print(f"median: {b:.1f} steps/s before, {t:.2f} s for the capture, {a:.1f} steps/s after, {z:.1f} in the next "
          f"window; after/before median {statistics.median(ratios):.3f} (range {min(ratios):.3f} to "
          f"{max(ratios):.3f}), next window/before {statistics.median(later):.3f}")
    print("\n".join(costs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
