"""Throughput parity: training steps/s without the shim, and with its parts taken apart.

Part of ``python bench/gpu_check.py``; alone::

    python bench/gpu_check_parity.py [--repeats 5] [--run-seconds 2.5] [--old-scalar FILE] [--json FILE] [--dry-run]

The same bf16 (autocast) MLP training loop of ``gpu_check_shim.py`` on the first CUDA device,
in six setups:

- ``baseline``: no shim call, no daemon running;
- ``daemon(nvml 1s), no shim``: a real ``dflash-sidecar run`` polling NVML every second (GPM on
  wherever the GPU supports it), no shim call;
- ``shim+daemon(no gpu metrics)``: every shim call each step (``scalar()`` on the loss and the
  grad norm included) sent to a daemon with ``--no-gpu-metrics``: the shim alone;
- ``shim+daemon(nvml 1s)``: both (the per-process query on: the shim's hello gives the daemon
  the trainer's pid);
- ``scalar() x2 only``: two ``scalar()`` per step, on the loss and the grad norm, nothing else
  (no daemon: the records are dropped at send, as ``no_receiver``);
- ``scalar() x2 only, cf69852 resolver``: the same through the resolver of commit cf69852 (the
  "before" of issue 38), swapped in as the process's resolver so the call path is the same;
  loaded from ``--old-scalar`` (that commit's ``trainer_shim/cuda_scalar.py``) or from git.

Each daemon run starts its own daemon (1 s aggregation windows), warms up until the daemon has
accepted records where the shim sends, then times a fixed number of steps (calibrated once so
that a run lasts about ``--run-seconds``) between two device synchronizations, and reads the
daemon's CPU over that window from /proc. The scalar runs warm the resolver first. Every round
runs each setup once, the order rotating; results are written after every round. Reported:
median steps/s per setup, its range, the ratio to the baseline's median (target: at least
99.5 %), and the daemon's median CPU share. ``--dry-run`` (or no CUDA) runs the same on CPU
tensors: the plumbing is exercised, the figures mean nothing. Exit status: 0 when every run
completed (a missed target is reported, not a failure), 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from gpu_check_common import ROOT, DaemonProc, cpu_seconds, gpus_up, http_get, start_daemon, write_json
from gpu_check_shim import build, timed
from shim_helpers import wait_until  # type: ignore[import-not-found]

from trainer_shim import cuda_scalar, telemetry

BASELINE = "baseline"
NVML_ALONE = "daemon(nvml 1s), no shim"
SHIM_ALONE = "shim+daemon(no gpu metrics)"
BOTH = "shim+daemon(nvml 1s)"
SCALARS = "scalar() x2 only"
SCALARS_OLD = "scalar() x2 only, cf69852 resolver"
SETUPS = (BASELINE, NVML_ALONE, SHIM_ALONE, BOTH, SCALARS, SCALARS_OLD)
TARGET_RATIO = 0.995
OLD_COMMIT = "cf69852"
"""The commit whose scalar resolver is measured as "before" (issue 38: 94.1 % on an H200)."""


def accepted(daemon: DaemonProc) -> float:
    """Records the daemon has accepted so far (all senders); 0 if /metrics is unreadable."""
    try:
        text = http_get(daemon.url)
    except OSError:
        return 0.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("dflash_sidecar_records_accepted_total{"))


def old_resolver(path: Path | None, workdir: Path) -> tuple[Any, str]:
    """The scalar resolver of ``OLD_COMMIT``: from ``path`` (its ``trainer_shim/cuda_scalar.py``)
    or, without one, from git. Returns (resolver, where it came from); raises ``RuntimeError``
    when neither works."""
    if path is None:
        path = workdir / "old_cuda_scalar.py"
        got = subprocess.run(["git", "-C", str(ROOT), "show", f"{OLD_COMMIT}:trainer_shim/cuda_scalar.py"],
                             capture_output=True, text=True, check=False)
        if got.returncode != 0:
            raise RuntimeError(f"no --old-scalar file and git cannot show {OLD_COMMIT}: {got.stderr.strip()[:200]}")
        path.write_text(got.stdout)
    spec = importlib.util.spec_from_file_location("old_cuda_scalar", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    if not hasattr(module.ScalarResolver, "resolve_ready") or hasattr(module, "prepare"):
        raise RuntimeError(f"{path} is not the {OLD_COMMIT} resolver")
    resolver = module.ScalarResolver(module.TorchBackend())
    resolver.turn = lambda: None  # it polls on its own thread; this publisher's flusher asks for turns
    return resolver, str(path)


class Runner:
    """One timed run of each setup on one model; the daemons are started per run (none runs
    during the runs without one)."""

    def __init__(self, workdir: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                 y: torch.Tensor, steps: int, device: torch.device, old: Any) -> None:
        self.workdir, self.model, self.opt, self.x, self.y = workdir, model, opt, x, y
        self.steps, self.device, self.old = steps, device, old

    def timed(self, steps: int, shim: bool = False, scalars_only: bool = False) -> float:
        return timed(self.device, self.model, self.opt, self.x, self.y, steps, shim=shim, scalars_only=scalars_only)

    def run(self, setup: str) -> dict[str, Any]:
        """steps/s of ``setup``, and the daemon's CPU share and GPUs seen where one runs."""
        if setup == BASELINE:
            return {"steps_per_s": self.steps / self.timed(self.steps)}
        if setup in (SCALARS, SCALARS_OLD):
            return self.scalars(old=setup == SCALARS_OLD)
        daemon = start_daemon(Path(tempfile.mkdtemp(prefix="run-", dir=self.workdir)), gpu_metrics=setup != SHIM_ALONE,
                              nvml_interval_s=1.0, extra=("--interval", "1"))
        try:
            shim = setup != NVML_ALONE
            if shim:
                self.link_up(daemon, setup)
            cpu0, wall0 = cpu_seconds(daemon.pid), time.monotonic()
            seconds = self.timed(self.steps, shim=shim)
            cpu = (cpu_seconds(daemon.pid) - cpu0) / (time.monotonic() - wall0)
            gpus = gpus_up(daemon)
        finally:
            telemetry.close()
            daemon.stop()
        return {"steps_per_s": self.steps / seconds, "daemon_cpu_share": cpu, "daemon_gpus_up": gpus}

    def link_up(self, daemon: DaemonProc, setup: str) -> None:
        """Configure the shim for ``daemon`` and warm up until it has accepted records."""
        telemetry.configure(endpoint=daemon.endpoint, role="trainer", worker="0",
                            devices=[self.device.index or 0] if self.device.type == "cuda" else [])
        deadline = time.monotonic() + 20
        while accepted(daemon) == 0 and time.monotonic() < deadline:  # link up, hello seen
            self.timed(3, shim=True)
            telemetry.flush(wait_s=1.0)
        if accepted(daemon) == 0:
            raise RuntimeError(f"{setup}: the daemon accepted no record within 20 s")

    def scalars(self, old: bool) -> dict[str, Any]:
        """Two ``scalar()`` per step and no other shim call, through this checkout's resolver or
        ``OLD_COMMIT``'s (swapped in as the process's resolver: the same call path)."""
        if old and self.old is None:
            raise RuntimeError("the old resolver is not available (see the first failure)")
        telemetry.configure(endpoint=f"ipc://{self.workdir}/nobody.sock", role="trainer", worker="0")
        saved = cuda_scalar._resolver
        if old:
            cuda_scalar._resolver = self.old
        try:
            self.timed(3, scalars_only=True)  # warm: the resolver set up, its path run
            wait_until(lambda: (r := cuda_scalar.current()) is None or r.in_flight() == 0, 10)
            seconds = self.timed(self.steps, scalars_only=True)
            imported = type(cuda_scalar.current()).__module__ if self.device.type == "cuda" else None
        finally:
            cuda_scalar._resolver = saved
            telemetry.close()
        return {"steps_per_s": self.steps / seconds, "resolver_module": imported}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The part's options (``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="run on CPU tensors even if CUDA is present")
    parser.add_argument("--repeats", type=int, default=5, help="rounds: runs per setup (at least 3 for a figure)")
    parser.add_argument("--run-seconds", type=float, default=None,
                        help="length of one run (default 2.5 on CUDA, 0.3 on CPU)")
    parser.add_argument("--dim", type=int, default=None, help="model width (default 2048 on CUDA, 64 on CPU)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=None, help="rows per step (default 4096 on CUDA, 32 on CPU)")
    parser.add_argument("--old-scalar", type=Path, default=None,
                        help=f"{OLD_COMMIT}'s trainer_shim/cuda_scalar.py (default: from git)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here (after every round)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available() and not args.dry_run
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    dim, batch = args.dim or (2048 if cuda else 64), args.batch or (4096 if cuda else 32)
    if not cuda:
        torch.set_num_threads(1)  # a dry run stays on one core of a shared machine
    torch.manual_seed(0)
    model, opt = build(dim, args.layers, device)
    x, y = torch.randn(batch, dim, device=device), torch.randn(batch, dim, device=device)
    timed(device, model, opt, x, y, 5, shim=False)  # warm-up: kernels, cuBLAS
    steps = max(5, int((args.run_seconds or (2.5 if cuda else 0.3)) * 20
                       / timed(device, model, opt, x, y, 20, shim=False)))
    label = torch.cuda.get_device_name(device) if cuda else "CPU dry run: plumbing only, not a measurement"
    print(f"throughput parity on {label}: {steps} steps per run, dim {dim}, batch {batch}, {args.layers} blocks, "
          f"{args.repeats} rounds of {len(SETUPS)} setups, the order rotating")
    results: dict[str, Any] = {"dry_run": not cuda, "device": label, "steps_per_run": steps, "dim": dim,
                               "batch": batch, "layers": args.layers, "repeats": args.repeats,
                               "target_ratio": TARGET_RATIO}
    failures: list[str] = []
    runs: dict[str, list[dict[str, Any]]] = {setup: [] for setup in SETUPS}
    with tempfile.TemporaryDirectory(prefix="dfs-parity-", dir="/tmp") as tmp:
        try:
            old, results["old_resolver_from"] = old_resolver(args.old_scalar, Path(tmp))
        except Exception as exc:  # noqa: BLE001 - a "before" missing is said, not a failure
            old = None
            results["skipped"] = f"{SCALARS_OLD}: {type(exc).__name__}: {exc}"
            print(f"skipped: {results['skipped']}", flush=True)
        runner = Runner(Path(tmp), model, opt, x, y, steps, device, old)
        for round_no in range(args.repeats):
            order = SETUPS[round_no % len(SETUPS):] + SETUPS[:round_no % len(SETUPS)]
            for setup in order:
                if setup == SCALARS_OLD and old is None:
                    continue
                try:
                    runs[setup].append(runner.run(setup))
                except Exception as exc:  # noqa: BLE001 - one failed run is reported; the others still run
                    failures.append(f"{setup} run {round_no + 1}: {type(exc).__name__}: {exc}")
                    print(f"FAIL: {failures[-1]}", flush=True)
            results.update(summarize(runs, cuda, quiet=True), failures=failures, rounds_done=round_no + 1)
            write_json(args.json, results)  # a part killed later keeps the rounds done
    results.update(summarize(runs, cuda, quiet=False))
    if cuda and BOTH in results["setups"] and not any(results["setups"][BOTH]["daemon_gpus_up"]):
        failures.append("the NVML daemon saw no GPU: the nvml setup did not poll NVML")
    results.update(failures=failures, passed=not failures)
    write_json(args.json, results)
    print("PASS" if not failures else "FAILED", "(CPU dry run)" if not cuda else "")
    return 1 if failures else 0


def summarize(runs: dict[str, list[dict[str, Any]]], cuda: bool, quiet: bool) -> dict[str, Any]:
    """Per setup: runs, median, range, ratio to the baseline's median, the daemon's CPU; the
    verdicts against ``TARGET_RATIO``. Printed unless ``quiet``."""
    summary: dict[str, Any] = {}
    base = statistics.median(r["steps_per_s"] for r in runs[BASELINE]) if runs[BASELINE] else float("nan")
    for setup in SETUPS:
        if not runs[setup]:
            continue
        rates = [r["steps_per_s"] for r in runs[setup]]
        median = statistics.median(rates)
        cpu = [r["daemon_cpu_share"] for r in runs[setup] if "daemon_cpu_share" in r]
        summary[setup] = {"runs_steps_per_s": rates, "median_steps_per_s": median, "ratio_to_baseline": median / base,
                          "range_ratio": [min(rates) / base, max(rates) / base],
                          "daemon_cpu_share_median": statistics.median(cpu) if cpu else None,
                          "daemon_gpus_up": [r.get("daemon_gpus_up") for r in runs[setup]],
                          "resolver_module": sorted({str(r["resolver_module"]) for r in runs[setup]
                                                     if r.get("resolver_module")})}
        line = (f"  {setup:36} median {median:9.2f} steps/s  {median / base * 100:7.2f} % of baseline "
                f"(runs {min(rates) / base * 100:.2f}-{max(rates) / base * 100:.2f} %)")
        if cpu:
            line += (f"  daemon CPU {statistics.median(cpu) * 100:.2f} % of a core, "
                     f"GPUs up {summary[setup]['daemon_gpus_up']}")
        if not quiet:
            print(line, flush=True)
    verdicts = {setup: bool(row["ratio_to_baseline"] >= TARGET_RATIO) for setup, row in summary.items()
                if setup not in (BASELINE, SCALARS_OLD)}
    for setup, met in verdicts.items():
        if not quiet:
            print(f"target >= {TARGET_RATIO * 100:.1f} % of baseline, {setup}: "
                  f"{summary[setup]['ratio_to_baseline'] * 100:.2f} % -> {'met' if met else 'MISSED'}"
                  + ("" if cuda else " (CPU dry run: no verdict on a GPU)"))
    return {"setups": summary, "target_met": verdicts}


if __name__ == "__main__":
    raise SystemExit(main())
