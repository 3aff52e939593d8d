"""Zero-synchronization proof of every trainer-shim call, eager and inside ``torch.compile``.

Part of ``python bench/gpu_check.py`` (which runs it with a per-part timeout); alone::

    python bench/gpu_check_shim.py [--json FILE] [--dry-run]

What it does, on the first CUDA device:

1. **Busy-GPU probe.** Queues a ~200 ms GPU spin kernel, then times every shim call on the host
   while the GPU is still busy. A call that synchronized would take the rest of those 200 ms;
   each must return in microseconds. The scalar published after the kernel must still be
   unresolved when the calls return (its copy waits behind the kernel) and resolve afterwards.
2. **Eager sync-debug loop.** A small bf16 (autocast) MLP trained with AdamW; every step
   calls every shim API (publish, timing, count, gauge, category, timer, ``scalar()`` on the
   loss and the grad norm, allocator sampling every 50 ms) inside
   ``torch.cuda.set_sync_debug_mode("error")``: any synchronizing CUDA call raises. The mode
   stays on until the resolver has published every scalar and the allocator sampler has sent
   a sample, so the shim's background threads run under it too. Their errors are swallowed by
   design, so the check also fails on any shim warning, internal error or scalar error.
3. **Compiled sync-debug loop.** The forward pass and loss in a ``torch.compile``'d function
   that itself calls every shim API (``scalar()`` on the loss included), compiled before the
   mode is switched on, then run under it. Dynamo's own counters give the graph breaks and
   the recompiles after warm-up (the spec's target: none; reported, not a failure here).
4. **Values.** The loss and grad-norm values the receiver got through ``scalar()`` equal the
   values read back after the loops.

A real receiver process (``tests/shim_helpers.py receive``) drains the shim's socket throughout.
``--dry-run`` (or no CUDA) runs the same loops on CPU tensors: every shim call and the compiled
step run, the CUDA-only parts (sync-debug mode, busy probe, CUDA scalars, allocator samples)
are skipped with their reason printed. Exit status: 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from gpu_check_common import write_json
from shim_helpers import ReceiverProcess, books_of, wait_until  # type: ignore[import-not-found]

from trainer_shim import telemetry
from trainer_shim.wire import RecordKind


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def build(dim: int, layers: int, device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    blocks: list[torch.nn.Module] = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim)]
    model = torch.nn.Sequential(*blocks).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, opt


def grad_norm(model: torch.nn.Module) -> torch.Tensor:
    """Total L2 norm of the gradients, on the device (no host read)."""
    norms = [torch.linalg.vector_norm(p.grad.float()) for p in model.parameters() if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(norms))


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
          steps: int, shim: bool, device: torch.device, keep: list[Any] | None = None,
          scalars_only: bool = False) -> None:
    """Run ``steps`` steps without any synchronization of its own: with every shim call each
    step (``shim``), or with only ``scalar()`` on the loss and the grad norm (``scalars_only``)."""
    amp = torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    for step in range(steps):
        t0 = time.perf_counter_ns()
        if shim and not scalars_only:
            with telemetry.timer("forward"), amp:
                out = model(x)
                loss = torch.nn.functional.mse_loss(out.float(), y)
        else:
            with amp:
                out = model(x)
                loss = torch.nn.functional.mse_loss(out.float(), y)
        loss.backward()
        gn = grad_norm(model)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if scalars_only:
            telemetry.scalar("loss", loss)
            telemetry.scalar("grad_norm", gn)
        elif shim:
            host_ms = (time.perf_counter_ns() - t0) * 1e-6
            telemetry.scalar("loss", loss)
            telemetry.scalar("grad_norm", gn)
            telemetry.timing("step_ms", host_ms)
            telemetry.count("tokens", x.shape[0])
            telemetry.gauge("lr", opt.param_groups[0]["lr"])
            telemetry.category("bucket", step % 8)
            telemetry.publish(step, {"host_step_ms": host_ms, "batch": float(x.shape[0])})
        if keep is not None:
            keep.append((loss.detach(), gn.detach()))


def timed(device: torch.device, model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
          y: torch.Tensor, steps: int, shim: bool, scalars_only: bool = False) -> float:
    """``train`` between two device synchronizations; returns the wall time in seconds."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    train(model, opt, x, y, steps, shim=shim, device=device, scalars_only=scalars_only)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def _sleep_cycles_per_ms() -> float:
    """Calibrate ``torch.cuda._sleep`` (a GPU spin of N clock cycles) with CUDA events."""
    n = 10_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(n)
    end.record()
    end.synchronize()
    return n / max(start.elapsed_time(end), 1e-3)


def busy_gpu_probe(device: torch.device) -> tuple[list[str], dict[str, float]]:
    """Shim calls while the GPU spins for ~200 ms; returns failures and each call's host time (µs).

    Every kernel the probe launches (the spin, the fill, the multiply) and the shim's scalar path
    run once before the spin is queued: under CUDA's lazy module loading the first launch of a
    kernel waits for the whole GPU and would drain the spin. An event after the spin shows that
    it still runs when the first timed call starts and after the last one returned; if not, the
    probe proved nothing and says so."""
    from trainer_shim import cuda_scalar

    failures: list[str] = []
    cycles = int(0.2 * 1000 * _sleep_cycles_per_ms())  # also warms the spin kernel and events
    probe = torch.ones((), device=device)
    telemetry.scalar("probe_warm", probe * 3)  # the multiply warm; the resolver set up
    torch.cuda.synchronize()
    wait_until(lambda: (r := cuda_scalar.current()) is not None and r.in_flight() == 0, 10)
    spin_done = torch.cuda.Event()
    torch.cuda._sleep(cycles)
    spin_done.record()
    value = probe * 3  # ready only after the spin
    running_at_first = not spin_done.query()
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    for name, call in [
        ("scalar", lambda: telemetry.scalar("probe", value)),
        ("publish", lambda: telemetry.publish(0, {"a_ms": 1.0})),
        ("timing", lambda: telemetry.timing("t", 1.0)),
        ("count", lambda: telemetry.count("c")),
        ("gauge", lambda: telemetry.gauge("g", 1.0)),
        ("category", lambda: telemetry.category("k", 1)),
    ]:
        c0 = time.perf_counter()
        call()
        timings[name] = time.perf_counter() - c0
    with telemetry.timer("timer"):
        pass
    timings["timer+all"] = time.perf_counter() - t0
    running_after_last = not spin_done.query()
    resolver = cuda_scalar.current()
    unresolved = resolver is not None and resolver.in_flight() > 0
    torch.cuda.synchronize()
    worst = max(timings.values())
    print(f"busy-GPU probe: spin running at the first call {running_at_first}, after the last {running_after_last}; "
          f"slowest call {worst * 1e6:.1f} us ({', '.join(f'{k} {v * 1e6:.1f}' for k, v in timings.items())} us)")
    if worst > 0.05:
        failures.append(f"a shim call took {worst * 1e3:.1f} ms while the GPU was busy (synchronized?)")
    if not running_at_first:
        failures.append("the spin had ended before the first timed call: a launch waited for the GPU "
                        "(a kernel not warmed under lazy module loading?); the probe proved nothing")
    if not running_after_last:
        failures.append("the spin ended before the last call returned: a call waited for the GPU, "
                        "or the spin was too short; the probe proved nothing")
    if not unresolved:
        failures.append("the probe scalar resolved before its copy could have run")
    wait_until(lambda: resolver is not None and resolver.in_flight() == 0, 10)
    return failures, {k: v * 1e6 for k, v in timings.items()}


FIRST_CALL = r"""
import json, sys, time
order = sys.argv[1]
if order == "configure, then import torch":
    from trainer_shim import telemetry
    telemetry.configure(endpoint=sys.argv[2], role="probe", worker="0")
import torch
from trainer_shim import telemetry
if order == "configure, then CUDA init":
    telemetry.configure(endpoint=sys.argv[2], role="probe", worker="0")
cuda = sys.argv[3] == "cuda"
x = torch.ones((), device=sys.argv[3])
y = x * 2  # CUDA up, the kernel loaded
if cuda:
    torch.cuda.synchronize()
if order == "CUDA init, then configure":
    telemetry.configure(endpoint=sys.argv[2], role="probe", worker="0")
telemetry.count("warm")  # the channel exists in every order: only scalar() is timed
time.sleep(0.2)  # a trainer's forward pass: the set-up, if started, runs meanwhile
costs = []
for i in range(21):
    t0 = time.perf_counter()
    telemetry.scalar("loss", y)
    costs.append((time.perf_counter() - t0) * 1e6)
    time.sleep(0.005)
if cuda:
    torch.cuda.synchronize()
print(json.dumps({"first_us": costs[0], "later_us": sorted(costs[1:])}))
"""
FIRST_CALL_ORDERS = ("configure, then CUDA init", "CUDA init, then configure", "configure, then import torch")


def first_call_costs(endpoint: str, device: torch.device) -> dict[str, dict[str, Any]]:
    """``scalar()``'s first call against the next 20, each order of set-up in a fresh process
    (on CPU the plumbing only: a CPU tensor is published at once)."""
    results: dict[str, dict[str, Any]] = {}
    for order in FIRST_CALL_ORDERS:
        proc = subprocess.run([sys.executable, "-c", FIRST_CALL, order, endpoint, device.type], capture_output=True,
                              text=True, timeout=60, check=False)
        if proc.returncode != 0:
            results[order] = {"error": proc.stderr.strip().splitlines()[-1][:300] if proc.stderr.strip() else "?"}
            continue
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        later = out["later_us"]
        results[order] = {"first_us": out["first_us"], "later_median_us": statistics.median(later),
                          "later_max_us": max(later)}
        print(f"first scalar() in a fresh process ({order}, {device.type}): {out['first_us']:.1f} us; "
              f"the next 20: median {statistics.median(later):.1f} us, max {max(later):.1f} us")
    return results


def compiled_step(model: torch.nn.Module, device: torch.device, backend: str, graphs: list[int],
                  timer_around_forward: bool = False) -> Any:
    """``torch.compile`` of a forward + loss that calls every shim API itself; returns the loss.
    ``graphs`` gets the number of operators of each graph dynamo hands to ``backend``, to show
    that the model really ran compiled (a frame dynamo gives up on runs eagerly).

    The shim calls follow the forward, in the same frame (each a call dynamo makes after the
    graph, a timer two shim operators in it, see docs/SHIM.md); a graph break is counted and
    reported. ``timer_around_forward``
    puts ``telemetry.timer`` around the forward instead: a break inside a ``with`` block of a
    context manager dynamo cannot trace makes it run the whole frame eagerly."""
    amp_device = device.type
    inner = torch._dynamo.lookup_backend(backend)

    def counting(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        graphs.append(sum(1 for node in gm.graph.nodes if node.op in ("call_function", "call_method", "call_module")))
        return inner(gm, example_inputs)

    def timed_forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with telemetry.timer("compiled_forward"), torch.autocast(device_type=amp_device, dtype=torch.bfloat16):
            return torch.nn.functional.mse_loss(model(x).float(), y)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=amp_device, dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        telemetry.scalar("compiled_loss", loss)
        telemetry.timing("compiled_ms", 1.0)
        telemetry.count("compiled_steps")
        telemetry.gauge("compiled_lr", 1e-4)
        telemetry.category("compiled_bucket", "b")
        telemetry.publish(0, {"compiled_host_ms": 1.0})
        with telemetry.timer("compiled_tail"):
            loss = loss + 0.0
        return loss

    return torch.compile(timed_forward if timer_around_forward else step, backend=counting)


def timer_around_forward_ops(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> int:
    """Operators dynamo compiles (eager backend: only the count matters) when ``telemetry.timer``
    wraps the forward inside the compiled function; 0 means the forward ran eagerly."""
    graphs: list[int] = []
    compiled_step(model, device, "eager", graphs, timer_around_forward=True)(x, y)
    return sum(graphs)


def graph_break_reasons() -> list[str]:
    """The first line of each graph-break reason dynamo counted in this process."""
    from torch._dynamo.utils import counters

    reasons = counters["graph_break"] or counters["unimplemented"]
    return sorted({str(reason).strip().splitlines()[0][:200] for reason in reasons})


def dynamo_counts() -> tuple[int, int]:
    """(graph breaks, frames compiled) from dynamo's own counters, so far in this process."""
    from torch._dynamo.utils import counters

    breaks = sum(counters["graph_break"].values()) or sum(counters["unimplemented"].values())
    return int(breaks), int(counters["frames"]["total"])


def run_compiled(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                 steps: int, device: torch.device, backend: str, sync_debug: bool, keep: list[Any],
                 rx: ReceiverProcess) -> dict[str, Any]:
    """Warm the compiled step up (compiles), then run ``steps`` steps, under sync-debug if asked,
    which stays on until the receiver has every scalar. Raises ``TimeoutError`` if it has not
    after 30 s."""
    graphs: list[int] = []
    fn = compiled_step(model, device, backend, graphs)

    def one_step() -> None:
        loss = fn(x, y)
        loss.backward()
        gn = grad_norm(model)
        opt.step()
        opt.zero_grad(set_to_none=True)
        telemetry.scalar("compiled_grad_norm", gn)
        keep.append((loss.detach(), gn.detach()))

    started = time.perf_counter()
    for _ in range(2):  # compile outside the sync-debug region: compiling may synchronize
        one_step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    compile_s = time.perf_counter() - started
    breaks0, frames0 = dynamo_counts()
    error = None
    if sync_debug:
        torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(steps):
            one_step()
        wait_until(lambda: scalars_settled(rx, {"compiled_loss": len(keep)}, allocator=False), 30)
    except RuntimeError as exc:  # a synchronizing call under "error" mode
        error = f"{type(exc).__name__}: {exc}"
    finally:
        if sync_debug:
            torch.cuda.set_sync_debug_mode(0)
    breaks, frames = dynamo_counts()
    return {"backend": backend, "graphs": len(graphs), "graph_ops": sum(graphs), "steps": len(keep) - 2,
            "compile_s": compile_s, "sync_error": error,
            "graph_break_reasons": graph_break_reasons(),
            "timer_around_forward_ops": timer_around_forward_ops(model, x, y, device),
            "graph_breaks": breaks, "graph_breaks_after_warmup": breaks - breaks0,
            "recompiles_after_warmup": frames - frames0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="run on CPU tensors even if CUDA is present")
    parser.add_argument("--steps", type=int, default=None, help="steps per loop (default 50 on CUDA, 3 on CPU)")
    parser.add_argument("--dim", type=int, default=None, help="model width (default 2048 on CUDA, 64 on CPU)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=None, help="rows per step (default 4096 on CUDA, 32 on CPU)")
    parser.add_argument("--compile-backend", default=None,
                        help="torch.compile backend (default inductor on CUDA; eager on CPU: dynamo traces the "
                             "step, no code generation, so the dry run stays quick)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.dry_run
    steps = args.steps or (50 if cuda else 3)
    dim, batch = args.dim or (2048 if cuda else 64), args.batch or (4096 if cuda else 32)
    backend = args.compile_backend or ("inductor" if cuda else "eager")
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    results: dict[str, Any] = {"torch": torch.__version__, "cuda_runtime": torch.version.cuda, "dry_run": not cuda,
                               "steps": steps, "dim": dim, "layers": args.layers, "batch": batch, "skipped": []}
    if cuda:
        results["device"] = torch.cuda.get_device_name(device)
        print(f"device: {results['device']}, torch {torch.__version__}, CUDA runtime {torch.version.cuda}")
    else:
        why = "--dry-run" if torch.cuda.is_available() else "no CUDA device"
        results["skipped"] = [f"{what}: {why}, CPU tensors" for what in (
            "sync-debug mode (the zero-sync proof)", "busy-GPU probe", "CUDA scalars (pinned copy + event)",
            "allocator samples (no CUDA allocator)")]
        print(f"CPU dry run ({why}), torch {torch.__version__}: every shim call runs, eager and compiled "
              f"(backend {backend}), on CPU tensors. Skipped: "
              + "; ".join(s.split(":")[0] for s in results["skipped"]))
    if not cuda:
        torch.set_num_threads(1)  # a dry run stays on one core of a shared machine
    collect = _Collect()
    logging.getLogger("trainer_shim").addHandler(collect)
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="dfs-gpu-", dir="/tmp") as tmp:
        rx = ReceiverProcess(f"ipc://{tmp}/sidecar.sock", Path(tmp) / "frames")
        try:
            telemetry.configure(endpoint=rx.endpoint, role="drafter", worker="0",
                                devices=[0] if cuda else [], allocator_interval_s=0.05)
            torch.manual_seed(0)
            model, opt = build(dim, args.layers, device)
            x = torch.randn(batch, dim, device=device)
            y = torch.randn(batch, dim, device=device)
            timed(device, model, opt, x, y, 2, shim=False)  # warm-up: kernels, cuBLAS
            if cuda:
                try:
                    probe_failures, results["busy_probe_us"] = busy_gpu_probe(device)
                except Exception as exc:  # noqa: BLE001 - e.g. no torch.cuda._sleep: the loops still run
                    probe_failures = [f"busy-GPU probe failed: {type(exc).__name__}: {exc}"]
                failures += probe_failures
                results["busy_probe_failures"] = probe_failures
            results["first_call"] = first = first_call_costs(f"ipc://{tmp}/nobody.sock", device)
            failures += [f"first-call probe ({order}): {r['error']}" for order, r in first.items() if "error" in r]
            keep: list[Any] = []
            results["eager"] = eager = {"steps": steps, "sync_error": None}
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")  # from here any synchronization raises
            try:
                train(model, opt, x, y, steps, shim=True, device=device, keep=keep)
                # The shim's threads (scalar resolver, allocator sampler, flusher) under the mode too.
                wait_until(lambda: scalars_settled(rx, {"loss": len(keep)}, allocator=cuda), 30)
            except RuntimeError as exc:
                eager["sync_error"] = f"{type(exc).__name__}: {exc}"
            except TimeoutError:
                failures.append("eager loop: scalars or allocator samples did not arrive within 30 s")
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode(0)
                    torch.cuda.synchronize()
            if eager["sync_error"]:
                failures.append(f"eager loop synchronized: {eager['sync_error']}")
            where = 'under set_sync_debug_mode("error"): no synchronization' if cuda else "on CPU"
            print(f"eager loop: {len(keep)} steps with every shim call {where}"
                  + (f" -- FAILED: {eager['sync_error']}" if eager["sync_error"] else ""))
            compiled_keep: list[Any] = []
            try:
                results["compiled"] = comp = run_compiled(model, opt, x, y, steps, device, backend, cuda,
                                                          compiled_keep, rx)
            except Exception as exc:  # noqa: BLE001 - a compile failure is a finding, reported
                results["compiled"] = comp = {"backend": backend, "error": f"{type(exc).__name__}: {exc}"}
                failures.append(f"compiled loop failed: {comp['error'][:500]}")
            if "error" not in comp:
                if comp["sync_error"]:
                    failures.append(f"compiled loop synchronized: {comp['sync_error']}")
                target = comp["graph_breaks"] == 0 and comp["recompiles_after_warmup"] == 0
                comp["no_break_no_recompile"] = target
                if not comp["graph_ops"]:
                    failures.append("compiled loop: dynamo compiled no operator, the step ran eagerly")
                print(f"compiled loop (backend {backend}, compiled in {comp['compile_s']:.1f} s): "
                      f"{comp['steps']} steps "
                      f"with every shim call inside the compiled step {where}"
                      + (f" -- FAILED: {comp['sync_error']}" if comp["sync_error"] else "")
                      + f"; dynamo: {comp['graphs']} graph(s) of {comp['graph_ops']} operators, "
                      f"{comp['graph_breaks']} graph break(s) {comp['graph_break_reasons']}, "
                      f"{comp['recompiles_after_warmup']} "
                      f"recompile(s) after warm-up (target 0 and 0: {'met' if target else 'MISSED'}); "
                      f"with the timer around the forward dynamo compiles {comp['timer_around_forward_ops']} "
                      "operators" + (" (the forward runs eagerly)" if not comp["timer_around_forward_ops"] else ""))
            value_failures, results["values"] = check_values(
                {"loss": [k[0] for k in keep], "grad_norm": [k[1] for k in keep],
                 "compiled_loss": [k[0] for k in compiled_keep], "compiled_grad_norm": [k[1] for k in compiled_keep]},
                rx)
            failures += value_failures
            if cuda and not results["values"]["allocator_samples"]:
                failures.append("no allocator sample arrived (the sampler should run every 50 ms on CUDA)")
        finally:
            telemetry.close()
            rx.stop()
    stats = next(iter(telemetry.stats().values()))
    bad = {k: v for k, v in stats["dropped"].items() if k not in ("buffer_full",)}
    results["shim_drops"] = stats["dropped"]
    results["shim_warnings"] = collect.messages
    if collect.messages or bad:
        failures.append(f"shim warnings {collect.messages} or drops {bad}")
    for failure in failures:
        print("FAIL:", failure)
    results["failures"], results["passed"] = failures, not failures
    write_json(args.json, results)
    print("PASS" if not failures else "FAILED", "(CPU dry run)" if not cuda else "")
    return 1 if failures else 0

def received(rx: ReceiverProcess, kind: int, name: str | None = None) -> list[Any]:
    """Records of ``kind`` (and ``name``) the receiver got so far."""
    return [r for b in books_of(rx.messages()).values() for r in b.records
            if r[0] == kind and (name is None or r[1] == name)]


def scalars_settled(rx: ReceiverProcess, expected: dict[str, int], allocator: bool) -> bool:
    """Every expected scalar resolved and received, and an allocator sample if ``allocator``."""
    from trainer_shim import cuda_scalar

    resolver = cuda_scalar.current()
    if resolver is not None and resolver.in_flight() > 0:
        return False
    telemetry.flush()
    if allocator and not received(rx, RecordKind.ALLOCATOR):
        return False
    return all(len(received(rx, RecordKind.SCALAR, name)) >= n for name, n in expected.items())


def check_values(expected: dict[str, list[Any]], rx: ReceiverProcess) -> tuple[list[str], dict[str, Any]]:
    """The scalars the receiver got equal the values read after the loops (as multisets: the
    resolver publishes in completion order). Returns failures and what was compared."""
    telemetry.flush(wait_s=10)
    try:
        wait_until(lambda: scalars_settled(rx, {k: len(v) for k, v in expected.items()}, False), 30)
    except TimeoutError:
        pass
    failures, counts = [], {}
    for name, tensors in expected.items():
        want = sorted(float(t) for t in tensors)
        got = sorted(r[2] for r in received(rx, RecordKind.SCALAR, name))
        counts[name] = len(got)
        if got != want:
            failures.append(f"scalar {name!r}: received {len(got)} values, expected {len(want)}"
                            + ("" if len(got) != len(want) else "; they differ from the values read after the loop"))
    allocator = len(received(rx, RecordKind.ALLOCATOR))
    if not failures:
        print(f"scalar values match: {', '.join(f'{n} {name}' for name, n in counts.items())} equal the values "
              f"read after the loops; {allocator} allocator samples received")
    return failures, {"scalars_received": counts, "allocator_samples": allocator}


if __name__ == "__main__":
    os.environ.pop("DFLASH_TELEMETRY_STRICT", None)  # production mode: what a real run uses
    raise SystemExit(main())
