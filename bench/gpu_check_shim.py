"""Zero-synchronization proof and GPU throughput with and without the trainer shim.

One short command on a GPU machine (about a minute on an H200)::

    python bench/gpu_check.py

What it does, on the first CUDA device:

1. **Busy-GPU probe.** Queues a ~200 ms GPU spin kernel, then times every shim call on the host
   while the GPU is still busy. A call that synchronized would take the rest of those 200 ms;
   each must return in microseconds. The scalar published after the kernel must still be
   unresolved when the calls return (its copy waits behind the kernel) and resolve afterwards.
2. **Sync-debug training loop.** A small bf16 (autocast) MLP trained with AdamW; every step
   calls every shim API (publish, timing, count, gauge, category, timer, scalar on the loss and
   the grad norm, allocator sampling on) inside ``torch.cuda.set_sync_debug_mode("error")``:
   any synchronizing CUDA call raises. The shim's background threads swallow errors by design,
   so the check also fails on any shim warning, internal error or scalar error.
3. **Values.** The loss and grad-norm values the receiver got through ``scalar()`` equal the
   values read back after the loop.
4. **Throughput.** Steps/s with and without the shim, interleaved runs, median of ``--repeats``.

A real receiver process (``tests/shim_helpers.py receive``) drains the shim's socket throughout.
Without CUDA the same loop runs on CPU as a dry run (no sync proof possible) and exits 0.
Exit status: 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402
from shim_helpers import ReceiverProcess, ledgers, wait_until  # noqa: E402

from trainer_shim import telemetry  # noqa: E402
from trainer_shim.wire import RecordKind  # noqa: E402


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
          steps: int, shim: bool, device: torch.device, keep: list[Any] | None = None) -> None:
    """Run ``steps`` steps without any synchronization of its own."""
    amp = torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    for step in range(steps):
        t0 = time.perf_counter_ns()
        if shim:
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
        if shim:
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


def timed(device: torch.device, *args: Any, **kwargs: Any) -> float:
    """``train`` between two device synchronizations; returns the wall time in seconds."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    train(*args, device=device, **kwargs)
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


def busy_gpu_probe(device: torch.device) -> list[str]:
    """Shim calls while the GPU spins for ~200 ms; returns failures."""
    failures: list[str] = []
    cycles = int(0.2 * 1000 * _sleep_cycles_per_ms())
    probe = torch.ones((), device=device)
    torch.cuda.synchronize()
    torch.cuda._sleep(cycles)
    value = probe * 3  # ready only after the spin
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
    from trainer_shim import cuda_scalar

    resolver = cuda_scalar.current()
    unresolved = resolver is not None and resolver.in_flight() > 0
    gpu_busy = torch.cuda.current_stream(device).query() is False
    torch.cuda.synchronize()
    worst = max(timings.values())
    print(f"busy-GPU probe: every shim call returned while the GPU spun for 200 ms; "
          f"slowest {worst * 1e6:.1f} us ({', '.join(f'{k} {v * 1e6:.1f}' for k, v in timings.items())} us)")
    if worst > 0.05:
        failures.append(f"a shim call took {worst * 1e3:.1f} ms while the GPU was busy (synchronized?)")
    if not gpu_busy:
        failures.append("the GPU was already idle after the calls: the probe proved nothing")
    if not unresolved:
        failures.append("the probe scalar resolved before its copy could have run")
    wait_until(lambda: resolver is not None and resolver.in_flight() == 0, 10)
    return failures


def main(argv: list[str] | None = None) -> int:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200 if cuda else 20, help="steps per run")
    parser.add_argument("--repeats", type=int, default=5 if cuda else 2, help="runs per configuration")
    parser.add_argument("--dim", type=int, default=2048 if cuda else 128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4096 if cuda else 64, help="rows per step")
    args = parser.parse_args(argv)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    else:
        print(f"CPU dry run: no CUDA device, torch {torch.__version__}. The same loop runs on CPU "
              "with every shim call; zero-sync and GPU throughput need a GPU.")
    collect = _Collect()
    logging.getLogger("trainer_shim").addHandler(collect)
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="dfs-gpu-", dir="/tmp") as tmp:
        endpoint = f"ipc://{tmp}/sidecar.sock"
        rx = ReceiverProcess(endpoint, Path(tmp) / "frames")
        try:
            telemetry.configure(endpoint=endpoint, role="drafter", worker="0",
                                devices=[0] if cuda else [], allocator_interval_s=0.5)
            torch.manual_seed(0)
            model, opt = build(args.dim, args.layers, device)
            x = torch.randn(args.batch, args.dim, device=device)
            y = torch.randn(args.batch, args.dim, device=device)
            timed(device, model, opt, x, y, 3, shim=False)  # warm-up: kernels, cuBLAS
            if cuda:
                failures += busy_gpu_probe(device)
            keep: list[Any] = []
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")  # from here any synchronization raises
            try:
                train(model, opt, x, y, args.steps, shim=True, device=device, keep=keep)
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode(0)
                    torch.cuda.synchronize()
            where = 'under set_sync_debug_mode("error"): no synchronization' if cuda else "on CPU"
            print(f"sync-debug loop: {args.steps} steps with every shim call {where}")
            failures += check_values(keep, rx)
            failures += throughput(model, opt, x, y, args, device)
        finally:
            telemetry.close()
            rx.stop()
    stats = next(iter(telemetry.stats().values()))
    bad = {k: v for k, v in stats["dropped"].items() if k not in ("buffer_full",)}
    if collect.messages or bad:
        failures.append(f"shim warnings {collect.messages} or drops {bad}")
    for failure in failures:
        print("FAIL:", failure)
    print("PASS" if not failures else "FAILED", "(CPU dry run)" if not cuda else "")
    return 1 if failures else 0


def check_values(keep: list[Any], rx: ReceiverProcess) -> list[str]:
    """The scalars the receiver got equal the values read after the loop (as multisets: the
    resolver publishes in completion order)."""
    from trainer_shim import cuda_scalar

    resolver = cuda_scalar.current()
    wait_until(lambda: resolver is None or resolver.in_flight() == 0, 30)
    telemetry.flush(wait_s=10)
    want_loss = sorted(float(t) for t, _ in keep)
    want_gn = sorted(float(g) for _, g in keep)

    def got(name: str) -> list[float]:
        return sorted(r[2] for b in ledgers(rx.messages()).values() for r in b.records
                      if r[0] == RecordKind.SCALAR and r[1] == name)

    try:
        wait_until(lambda: len(got("loss")) >= len(want_loss) and len(got("grad_norm")) >= len(want_gn), 30)
    except TimeoutError:
        return [f"received {len(got('loss'))}/{len(want_loss)} loss values"]
    if got("loss") != want_loss or got("grad_norm") != want_gn:
        return ["scalar values differ from the values computed after the fact"]
    allocator = [r for b in ledgers(rx.messages()).values() for r in b.records if r[0] == RecordKind.ALLOCATOR]
    print(f"scalar values match: {len(want_loss)} losses and grad norms equal the values read "
          f"after the loop; {len(allocator)} allocator samples received")
    return []


def throughput(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               args: argparse.Namespace, device: torch.device) -> list[str]:
    runs: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeats):
        for shim in (False, True):
            runs[shim].append(args.steps / timed(device, model, opt, x, y, args.steps, shim=shim))
    base, with_shim = statistics.median(runs[False]), statistics.median(runs[True])
    label = "throughput" if device.type == "cuda" else "throughput (CPU dry run: not a measurement)"
    print(f"{label} (median of {args.repeats} runs of {args.steps} steps, dim {args.dim}, "
          f"batch {args.batch}): without shim {base:.1f} steps/s, with shim {with_shim:.1f} steps/s "
          f"({(with_shim / base - 1) * 100:+.2f} %)")
    print(f"  runs without: {', '.join(f'{r:.1f}' for r in runs[False])}; "
          f"with: {', '.join(f'{r:.1f}' for r in runs[True])}")
    return []


if __name__ == "__main__":
    os.environ.pop("DFLASH_TELEMETRY_STRICT", None)  # production mode: what a real run uses
    raise SystemExit(main())
