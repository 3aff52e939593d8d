"""Throughput parity: training steps/s without the shim, and with the shim and a running daemon.

Part of ``python bench/gpu_check.py``; alone::

    python bench/gpu_check_parity.py [--repeats 3] [--run-seconds 4] [--json FILE] [--dry-run]

Three setups, the same bf16 (autocast) MLP training loop of ``gpu_check_shim.py`` on the first
CUDA device:

- ``baseline``: no shim call, no daemon running;
- ``shim+daemon(nvml 1s)``: every shim call each step (``scalar()`` on the loss and the grad
  norm included), sent to a real ``dflash-sidecar run`` process polling NVML every second
  (GPM on wherever the GPU supports it, the per-process query on, since the shim's hello gives
  the daemon the trainer's pid);
- ``shim+daemon(no gpu metrics)``: the same with the daemon's ``--no-gpu-metrics``.

Each run starts its own daemon (none runs during a baseline run; 1 s aggregation windows, so
that its first window comes soon), warms up until the daemon has accepted records, then times
a fixed number of steps (calibrated once so that a run lasts about
``--run-seconds``) between two device synchronizations, and reads the daemon's CPU over that
window from /proc. Runs alternate, the order rotating each round, ``--repeats`` of each.
Reported: median steps/s per setup, its ratio to the baseline (target: at least 99.5 %), and the
daemon's median CPU share. ``--dry-run`` (or no CUDA) runs the same on CPU tensors: the plumbing
is exercised, the figures mean nothing. Exit status: 0 when every run completed (a missed target
is reported, not a failure), 1 otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from gpu_check_common import DaemonProc, cpu_seconds, gpus_up, http_get, start_daemon, write_json
from gpu_check_shim import build, timed

from trainer_shim import telemetry

BASELINE, NVML, NO_GPU = "baseline", "shim+daemon(nvml 1s)", "shim+daemon(no gpu metrics)"
SETUPS = (BASELINE, NVML, NO_GPU)
TARGET_RATIO = 0.995


def accepted(daemon: DaemonProc) -> float:
    """Records the daemon has accepted so far (all senders); 0 if /metrics is unreadable."""
    try:
        text = http_get(daemon.url)
    except OSError:
        return 0.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("dflash_sidecar_records_accepted_total{"))


def one_run(setup: str, workdir: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
            y: torch.Tensor, steps: int, device: torch.device) -> dict[str, Any]:
    """One timed run of ``setup``: steps/s, and the daemon's CPU share and GPUs seen."""
    if setup == BASELINE:
        return {"steps_per_s": steps / timed(device, model, opt, x, y, steps, shim=False)}
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=workdir))
    daemon = start_daemon(run_dir, gpu_metrics=setup == NVML, nvml_interval_s=1.0, extra=("--interval", "1"))
    try:
        telemetry.configure(endpoint=daemon.endpoint, role="trainer", worker="0",
                            devices=[device.index or 0] if device.type == "cuda" else [])
        deadline = time.monotonic() + 20
        while accepted(daemon) == 0 and time.monotonic() < deadline:  # link up, hello seen
            timed(device, model, opt, x, y, 3, shim=True)
            telemetry.flush(wait_s=1.0)
        if accepted(daemon) == 0:
            raise RuntimeError(f"{setup}: the daemon accepted no record within 20 s")
        cpu0, wall0 = cpu_seconds(daemon.pid), time.monotonic()
        seconds = timed(device, model, opt, x, y, steps, shim=True)
        cpu = (cpu_seconds(daemon.pid) - cpu0) / (time.monotonic() - wall0)
        gpus = gpus_up(daemon)
    finally:
        telemetry.close()
        daemon.stop()
    return {"steps_per_s": steps / seconds, "daemon_cpu_share": cpu, "daemon_gpus_up": gpus}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="run on CPU tensors even if CUDA is present")
    parser.add_argument("--repeats", type=int, default=3, help="runs per setup (at least 3 for a figure)")
    parser.add_argument("--run-seconds", type=float, default=None,
                        help="length of one run (default 4 on CUDA, 0.3 on CPU)")
    parser.add_argument("--dim", type=int, default=None, help="model width (default 2048 on CUDA, 64 on CPU)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=None, help="rows per step (default 4096 on CUDA, 32 on CPU)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    cuda = torch.cuda.is_available() and not args.dry_run
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    dim, batch = args.dim or (2048 if cuda else 64), args.batch or (4096 if cuda else 32)
    run_seconds = args.run_seconds or (4.0 if cuda else 0.3)
    if not cuda:
        torch.set_num_threads(1)  # a dry run stays on one core of a shared machine
    torch.manual_seed(0)
    model, opt = build(dim, args.layers, device)
    x, y = torch.randn(batch, dim, device=device), torch.randn(batch, dim, device=device)
    timed(device, model, opt, x, y, 5, shim=False)  # warm-up: kernels, cuBLAS
    steps = max(5, int(run_seconds * 20 / timed(device, model, opt, x, y, 20, shim=False)))
    label = torch.cuda.get_device_name(device) if cuda else "CPU dry run: plumbing only, not a measurement"
    print(f"throughput parity on {label}: {steps} steps per run (~{run_seconds:g} s), dim {dim}, batch {batch}, "
          f"{args.layers} blocks, {args.repeats} runs per setup, alternating")
    runs: dict[str, list[dict[str, Any]]] = {setup: [] for setup in SETUPS}
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="dfs-parity-", dir="/tmp") as tmp:
        for round_no in range(args.repeats):
            order = SETUPS[round_no % 3:] + SETUPS[:round_no % 3]
            for setup in order:
                try:
                    runs[setup].append(one_run(setup, Path(tmp), model, opt, x, y, steps, device))
                except Exception as exc:  # noqa: BLE001 - one failed run is reported; the others still run
                    failures.append(f"{setup} run {round_no + 1}: {type(exc).__name__}: {exc}")
                    print(f"FAIL: {failures[-1]}")
    summary: dict[str, Any] = {}
    base = statistics.median(r["steps_per_s"] for r in runs[BASELINE]) if runs[BASELINE] else float("nan")
    for setup in SETUPS:
        if not runs[setup]:
            continue
        rates = [r["steps_per_s"] for r in runs[setup]]
        median = statistics.median(rates)
        cpu = [r["daemon_cpu_share"] for r in runs[setup] if "daemon_cpu_share" in r]
        summary[setup] = {"runs_steps_per_s": rates, "median_steps_per_s": median, "ratio_to_baseline": median / base,
                          "daemon_cpu_share_median": statistics.median(cpu) if cpu else None,
                          "daemon_gpus_up": [r.get("daemon_gpus_up") for r in runs[setup]]}
        line = f"  {setup:28} median {median:9.2f} steps/s  {median / base * 100:7.2f} % of baseline"
        if cpu:
            line += (f"  daemon CPU {statistics.median(cpu) * 100:.2f} % of a core, "
                     f"GPUs up {summary[setup]['daemon_gpus_up']}")
        print(line + f"  runs: {', '.join(f'{r:.2f}' for r in rates)}")
    verdicts = {}
    for setup in (NVML, NO_GPU):
        if setup in summary:
            ratio = summary[setup]["ratio_to_baseline"]
            verdicts[setup] = bool(ratio >= TARGET_RATIO)
            met = "met" if verdicts[setup] else "MISSED"
            print(f"target >= {TARGET_RATIO * 100:.1f} % of baseline, {setup}: {ratio * 100:.2f} % -> {met}"
                  + ("" if cuda else " (CPU dry run: no verdict on a GPU)"))
    if cuda and NVML in summary and not any(summary[NVML]["daemon_gpus_up"]):
        failures.append("the NVML daemon saw no GPU: the nvml setup did not poll NVML")
    results = {"dry_run": not cuda, "device": label, "steps_per_run": steps, "dim": dim, "batch": batch,
               "layers": args.layers, "repeats": args.repeats, "target_ratio": TARGET_RATIO, "setups": summary,
               "target_met": verdicts, "failures": failures, "passed": not failures}
    write_json(args.json, results)
    print("PASS" if not failures else "FAILED", "(CPU dry run)" if not cuda else "")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
