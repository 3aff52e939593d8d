"""Cost of a shim call inside a ``torch.compile``d function, side by side in one run::

    python bench/bench_compile_calls.py --calls 8 --rounds 15 --steps 300

Three compiled functions (inductor, CPU) run alternately, each round ``--steps`` steps:
``plain`` (a small tensor op only), ``shim`` (the same plus ``--calls`` shim calls, which dynamo
turns into shim operators) and ``reorderable`` (the same calls to a plain function registered in
``torch._dynamo.config.reorderable_logging_functions``, which dynamo replays after the graph: the
mechanism the shim falls back to). Prints the median step time of each and the median extra cost
per call against ``plain``. The shim publishes to an endpoint nobody listens on (dropped and
counted as ``no_receiver``), so only the trainer side is measured.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from typing import Any

import torch
import torch._dynamo

from trainer_shim import telemetry

_sink: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=100_000)


def reorderable(name: str, value: float) -> None:
    """What a shim call does, as a plain function dynamo replays after the graph."""
    _sink.append((1, name, value))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=8, help="shim calls per step")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=300, help="steps per function per round")
    args = parser.parse_args()
    telemetry.configure(endpoint="ipc:///nonexistent-dir/bench.sock")
    torch._dynamo.config.reorderable_logging_functions.add(reorderable)  # type: ignore[arg-type]
    n = args.calls

    def plain(x: torch.Tensor) -> torch.Tensor:
        return x.sin()

    def shim(x: torch.Tensor) -> torch.Tensor:
        for _ in range(n):
            telemetry.gauge("bench_value", 1.5)
        return x.sin()

    def replayed(x: torch.Tensor) -> torch.Tensor:
        for _ in range(n):
            reorderable("bench_value", 1.5)
        return x.sin()

    fns = {name: torch.compile(fn, backend="inductor")
           for name, fn in (("plain", plain), ("shim", shim), ("reorderable", replayed))}
    x = torch.randn(16)
    for fn in fns.values():
        for _ in range(3):
            fn(x)
    per_step: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            start = time.perf_counter_ns()
            for _ in range(args.steps):
                fn(x)
            per_step[name].append((time.perf_counter_ns() - start) / args.steps / 1000)
        _sink.clear()
    medians = {name: statistics.median(v) for name, v in per_step.items()}
    print(f"torch {torch.__version__}, {n} calls per step, {args.rounds} rounds x {args.steps} steps")
    for name, med in medians.items():
        extra = (med - medians["plain"]) / n if name != "plain" else 0.0
        print(f"  {name:12s} median {med:8.2f} us/step   extra per call {extra:6.2f} us")
    telemetry.close()


if __name__ == "__main__":
    main()
