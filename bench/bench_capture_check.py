"""What the capture-on-request check costs a trainer per step while nobody asks.

    python bench/bench_capture_check.py --rounds 9

``publish(step, profile)`` reads one flag (``trainer_shim.capture.armed``) at every step
boundary. Measured two ways, in one process, the two sides of each pair alternating:

- the shipped ``telemetry.publish`` against the same function without the check: its source with
  the two lines of the check removed, compiled in the module's own namespace (the same globals,
  the same queue), so the pair differs by the check alone;
- the bare check: a loop whose body is ``if capture.armed: ...`` against the same loop with
  ``pass``.

Each side runs ``--n`` calls back to back (the flusher sleeps through the run, its queue emptied
between blocks, so no other thread takes the GIL);
a pair's difference divided by ``--n`` is the per-step cost; reported: the median over
``--rounds`` pairs, and the interquartile range. Goal: < 50 ns a step. Needs no daemon (the
records are dropped as ``no_receiver`` by the flusher, off the measured thread).
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import textwrap
import time
from collections.abc import Callable
from typing import Any

from trainer_shim import capture, telemetry


def without_check() -> Callable[[int, dict[str, float]], None]:
    """``telemetry.publish`` with the capture check's two lines taken out."""
    source = textwrap.dedent(inspect.getsource(telemetry.publish))
    lines = source.splitlines()
    kept = [ln for i, ln in enumerate(lines) if "capture.armed" not in ln
            and not (i > 0 and "capture.armed" in lines[i - 1] and "capture.at_step" in ln)]
    assert len(kept) == len(lines) - 2, "the check is no longer two lines: update this bench"
    namespace: dict[str, Any] = {}
    exec(compile("\n".join(kept), "publish_without_check", "exec"), vars(telemetry), namespace)  # noqa: S102
    return namespace["publish"]  # type: ignore[no-any-return]


def block(fn: Callable[[int, dict[str, float]], None], n: int) -> float:
    profile = {"step_ms": 1.0, "data_wait_ms": 0.2}
    telemetry._pq.clear()  # the flusher sleeps through the run (see main): no thread competes for the GIL
    t0 = time.perf_counter_ns()
    for i in range(n):
        fn(i, profile)
    return (time.perf_counter_ns() - t0) / n


def bare(n: int, check: bool) -> float:
    cap = capture
    t0 = time.perf_counter_ns()
    if check:
        for _ in range(n):
            if cap.armed:
                pass
    else:
        for _ in range(n):
            pass
    return (time.perf_counter_ns() - t0) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--n", type=int, default=20_000)
    args = parser.parse_args()
    telemetry.configure(endpoint="ipc:///nonexistent/bench.sock", role="bench", worker="0", max_pending=10**6,
                        flush_interval_s=3600.0)
    plain = without_check()
    diffs, with_ns, without_ns, bare_diffs = [], [], [], []
    for r in range(args.rounds):
        pair = [(telemetry.publish, with_ns), (plain, without_ns)]
        for fn, sink in (pair if r % 2 == 0 else pair[::-1]):
            sink.append(block(fn, args.n))
        diffs.append(with_ns[-1] - without_ns[-1])
        first, second = (True, False) if r % 2 == 0 else (False, True)
        a, b = bare(args.n * 10, first), bare(args.n * 10, second)
        bare_diffs.append(a - b if first else b - a)
    telemetry.close()

    def iqr(xs: list[float]) -> str:
        q = statistics.quantiles(xs, n=4)
        return f"{q[0]:.1f} to {q[2]:.1f}"

    print(f"publish() with the check: median {statistics.median(with_ns):.1f} ns a call; "
          f"without: {statistics.median(without_ns):.1f} ns")
    print(f"the check inside publish(): median {statistics.median(diffs):.1f} ns a step (IQR {iqr(diffs)}), "
          f"{args.rounds} alternating pairs of {args.n} calls")
    print(f"the bare check (if capture.armed): median {statistics.median(bare_diffs):.1f} ns a step "
          f"(IQR {iqr(bare_diffs)})")


if __name__ == "__main__":
    main()
