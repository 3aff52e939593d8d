"""Cost of a shim call inside a ``torch.compile``d function, side by side in one run::

    python bench/bench_compile_calls.py --calls 8 --rounds 15 --steps 300

Compiled functions (inductor, CPU, one torch thread) run alternately, each round ``--steps``
steps:

* ``plain``: a small tensor op only;
* ``shim``: the same plus ``--calls`` shim calls as a trainer writes them (``--kinds`` in turn,
  by default ``telemetry.gauge`` of a constant, ``count``, ``timing``, ``scalar`` of a tensor
  the graph computes), which the shim defers to the end of the graph
  (``trainer_shim.compile_deferred``);
* ``operators``: the same calls traced as shim operators, one graph node each (what the shim
  did before, and still does where deferring is unavailable);
* ``reorderable``: the same number of calls to a plain function registered in
  ``torch._dynamo.config.reorderable_logging_functions``, which dynamo replays after the graph;
* ``timer``: the ``plain`` op inside ``with telemetry.timer(...)``, ``--calls`` / 4 blocks (a
  timer is two shim operators: it reads the clock when the graph runs; inductor's wrapper calls
  their Python bodies directly);
* ``timer_dispatcher``: the same function compiled with inductor's default code for the two
  operators, a dispatcher call into each Python body (what the shim did before; with
  ``--backend eager`` or ``aot_eager`` both timer conditions are that).

Prints the median step time of each and the median extra cost per call (per timer block)
against ``plain``. The
shim publishes to an endpoint nobody listens on (dropped and counted as ``no_receiver``), so
only the trainer side is measured. ``--json`` also writes the figures to a file.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo
import torch._functorch.config
import torch._inductor.config

from trainer_shim import compile_ops, telemetry

_sink: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=100_000)


def reorderable(name: str, value: Any) -> None:
    """What a shim call does, as a plain function dynamo replays after the graph."""
    _sink.append((1, name, value))


KINDS = ("gauge", "count", "timing", "scalar")


def functions(n: int, kinds: list[str], backend: str) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """The compiled functions of the run, by condition; call ``i`` is of ``kinds[i % len]``."""
    as_ops = {kind: compile_ops.in_graph(kind, getattr(telemetry, kind)) for kind in KINDS}

    def plain(x: torch.Tensor) -> torch.Tensor:
        return x.sin()

    def calls(rec: dict[str, Callable[..., None]], x: torch.Tensor) -> torch.Tensor:
        y = x.sin()
        for i in range(n):  # unrolled by dynamo: n calls in the graph
            kind = kinds[i % len(kinds)]
            if kind == "gauge":
                rec["gauge"]("bench_value", 1.5)
            elif kind == "count":
                rec["count"]("bench_steps")
            elif kind == "timing":
                rec["timing"]("bench_ms", 0.25)
            else:
                rec["scalar"]("bench_loss", y.sum())
        return y

    shim_fns = {kind: getattr(telemetry, kind) for kind in as_ops}

    def shim(x: torch.Tensor) -> torch.Tensor:
        return calls(shim_fns, x)

    def operators(x: torch.Tensor) -> torch.Tensor:
        return calls(as_ops, x)

    def replay(x: torch.Tensor) -> torch.Tensor:
        y = x.sin()
        for i in range(n):  # the same argument kinds, in the compiled frame itself
            reorderable("bench_value", y.sum() if kinds[i % len(kinds)] == "scalar" else 1.5)
        return y

    def timer(x: torch.Tensor) -> torch.Tensor:
        for _ in range(max(1, n // 4)):
            with telemetry.timer("bench_block_ms"):
                x = x.sin()
        return x

    def timer_dispatcher(x: torch.Tensor) -> torch.Tensor:
        return timer(x)

    fns: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "plain": plain, "shim": shim, "operators": operators, "reorderable": replay, "timer": timer,
        "timer_dispatcher": timer_dispatcher}
    return {name: torch.compile(fn, backend=backend, fullgraph=True) for name, fn in fns.items()}


def warm_up_with_dispatcher_calls(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> None:
    """Compile ``fn`` (its first calls) with inductor's default code for the shim operators, and
    without the compile caches, which would hand back the graph compiled with direct calls."""
    try:
        from torch._inductor.codegen.custom_extern_kernel_codegen import CUSTOM_EXTERN_KERNEL_CODEGEN
    except ImportError:
        CUSTOM_EXTERN_KERNEL_CODEGEN = {}
    compile_ops.register_direct_calls()  # now, not from the first trace of fn
    saved = {key: CUSTOM_EXTERN_KERNEL_CODEGEN.pop(key)
             for key in list(CUSTOM_EXTERN_KERNEL_CODEGEN) if "dflash_sidecar" in key}
    try:
        with torch._inductor.config.patch(fx_graph_cache=False), \
                torch._functorch.config.patch(enable_autograd_cache=False):
            for _ in range(3):
                fn(x)
    finally:
        CUSTOM_EXTERN_KERNEL_CODEGEN.update(saved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=8, help="shim calls per step")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=300, help="steps per function per round")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS),
                        help="the shim calls' kinds, in turn (scalar: of a tensor the graph computes)")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    telemetry.configure(endpoint="ipc:///nonexistent-dir/bench.sock")
    torch._dynamo.config.reorderable_logging_functions.add(reorderable)  # type: ignore[arg-type]
    n = args.calls
    fns = functions(n, args.kinds, args.backend)
    x = torch.randn(16)
    warm_up_with_dispatcher_calls(fns["timer_dispatcher"], x)
    for fn in fns.values():
        for _ in range(3):
            fn(x)
    load_start = os.getloadavg()
    per_step: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(args.rounds):
        for name, fn in (fns.items() if r % 2 == 0 else reversed(fns.items())):
            start = time.perf_counter_ns()
            for _ in range(args.steps):
                fn(x)
            per_step[name].append((time.perf_counter_ns() - start) / args.steps / 1000)
        _sink.clear()
        telemetry.flush(1.0)
    medians = {name: statistics.median(v) for name, v in per_step.items()}
    calls = {"plain": 1, "timer": max(1, n // 4), "timer_dispatcher": max(1, n // 4)}
    extra = {name: (med - medians["plain"]) / calls.get(name, n)
             for name, med in medians.items() if name != "plain"}
    print(f"torch {torch.__version__}, {args.backend}, {n} calls per step ({' '.join(args.kinds)}), "
          f"{args.rounds} rounds x {args.steps} steps, load average {load_start[0]:.2f} at start, "
          f"{os.getloadavg()[0]:.2f} at end")
    for name, med in medians.items():
        unit = "per timer block" if name.startswith("timer") else "per call"
        more = f"   extra {unit} {extra[name]:6.2f} us" if name in extra else ""
        print(f"  {name:16s} median {med:8.2f} us/step{more}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"medians_us": medians, "extra_per_call_us": extra,
                       "load": [load_start, os.getloadavg()]}, f, indent=1)
    telemetry.close()


if __name__ == "__main__":
    main()
