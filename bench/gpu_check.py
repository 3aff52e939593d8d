"""The whole GPU check in one command: ``python bench/gpu_check.py --out gpu_check.json``.

Runs three parts one after the other, each in its own interpreter under its own time limit
(a part that overruns is killed and reported as timed out; the check never hangs), streams
their output, then prints a compact summary and writes every part's results to ``--out``:

1. ``gpu_check_shim.py``: zero synchronization of every shim call under
   ``torch.cuda.set_sync_debug_mode("error")``, eager and inside ``torch.compile``, scalar
   values checked, a busy-GPU probe (its kernels warmed, the spin checked with an event), the
   first ``scalar()`` of a fresh process against the next ones;
2. ``gpu_check_parity.py``: steps/s without the shim, with the NVML daemon alone, the shim alone,
   both, and two ``scalar()`` per step alone (this resolver and cf69852's); 5 rounds, the
   order rotating, medians and ranges, ratio to the baseline against the 99.5 % target;
3. ``gpu_check_nvml.py``: NVML cost per call kind and per poll (GPM on/off, the per-process
   query), the daemon's CPU at 1 s polling, and the readings next to ``nvidia-smi``'s.

About 5 minutes on one GPU; the part limits add up to at most ``--budget`` seconds (340), so
that with start-up the check ends within 6 minutes.
``--dry-run`` runs the same on a machine without a GPU: CPU tensors, short runs, NVML against
whatever ``libnvidia-ml.so.1`` the loader finds (the tests' fake driver with ``--fake-nvml N``,
else the NVML part is skipped). Every child the check starts gets this interpreter's
``sys.path`` through ``PYTHONPATH``, so packages reachable only that way reach the parts, their
receivers and daemons. Exit status: 0 when every part passed, else 1.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from gpu_check_common import export_sys_path  # noqa: E402 - after the path set-up

# part -> (script, share of the time budget, arguments of a real run, arguments of a dry run)
PARTS: dict[str, tuple[str, float, list[str], list[str]]] = {
    "shim": ("gpu_check_shim.py", 0.26, [], ["--dry-run", "--steps", "3"]),
    "parity": ("gpu_check_parity.py", 0.50, ["--repeats", "5", "--run-seconds", "2.5"],
               ["--dry-run", "--repeats", "1", "--run-seconds", "0.1"]),
    "nvml": ("gpu_check_nvml.py", 0.24, [],
             ["--dry-run", "--seconds", "0.6", "--daemon-seconds", "0.5", "--reps", "5"]),
}
BUDGET_S = 340.0
"""Default total of the part limits: with start-up, the whole check within 6 minutes."""


def run_part(name: str, args: list[str], limit_s: float, workdir: Path) -> dict[str, Any]:
    """Run one part; its stdout is streamed, its stderr kept in a file. Never outlives ``limit_s``."""
    script, _, _, _ = PARTS[name]
    json_path, err_path = workdir / f"{name}.json", workdir / f"{name}.stderr"
    print(f"===== {name}: {script} {' '.join(args)} (limit {limit_s:.0f} s) =====", flush=True)
    started = time.monotonic()
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, str(HERE / script), *args, "--json", str(json_path)],
                                stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT, start_new_session=True)
        assert proc.stdout is not None
        stdout = proc.stdout
        echo = threading.Thread(target=lambda: [print(f"  {line}", end="", flush=True) for line in stdout],
                                daemon=True)
        echo.start()
        timed_out = False
        try:
            proc.wait(limit_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)  # the part's whole session: its daemons and load process too
            proc.wait()
        echo.join(5)
    rc = proc.returncode
    stderr = err_path.read_text()
    try:
        results = json.loads(json_path.read_text())
    except (OSError, ValueError):
        results = {}
    verdict = "TIMED OUT" if timed_out else ("ok" if rc == 0 else f"exit {rc}")
    print(f"===== {name}: {verdict} after {time.monotonic() - started:.1f} s =====", flush=True)
    if rc != 0 and stderr.strip():
        print("  stderr (last lines):\n    " + "\n    ".join(stderr.strip().splitlines()[-15:]), flush=True)
    return {"exit": rc, "timed_out": timed_out, "seconds": time.monotonic() - started,
            "stderr_tail": stderr[-4000:], "results": results}


def summary(parts: dict[str, dict[str, Any]]) -> list[str]:
    """The compact report: one or two lines per part."""
    lines = []
    shim = parts.get("shim", {}).get("results", {})
    if shim:
        eager, comp = shim.get("eager", {}), shim.get("compiled", {})
        mode = "CPU dry run, no sync proof" if shim.get("dry_run") else "sync-debug error mode"
        lines.append(f"zero sync ({mode}): eager {'FAILED' if eager.get('sync_error') else 'ok'}, compiled "
                     f"({comp.get('backend')}) {'FAILED' if comp.get('sync_error') or comp.get('error') else 'ok'}; "
                     f"graph breaks {comp.get('graph_breaks')}, recompiles {comp.get('recompiles_after_warmup')}; "
                     f"values {'ok' if not shim.get('failures') else 'see failures'}")
    lines += probe_lines(shim)
    parity = parts.get("parity", {}).get("results", {})
    for setup, row in parity.get("setups", {}).items():
        low, high = row.get("range_ratio", [row["ratio_to_baseline"]] * 2)
        lines.append(f"throughput {setup}: {row['median_steps_per_s']:.2f} steps/s, "
                     f"{row['ratio_to_baseline'] * 100:.2f} % of baseline (runs {low * 100:.2f}-{high * 100:.2f} %)"
                     + ("" if row.get("daemon_cpu_share_median") is None
                        else f", daemon CPU {row['daemon_cpu_share_median'] * 100:.2f} %")
                     + (" (dry run)" if parity.get("dry_run") else ""))
    for setup, met in parity.get("target_met", {}).items():
        lines.append(f"  target >= 99.5 % ({setup}): {'met' if met else 'MISSED'}"
                     + (" -- dry run, not a GPU figure" if parity.get("dry_run") else ""))
    nvml = parts.get("nvml", {}).get("results", {})
    if nvml.get("skipped"):
        lines.append(f"NVML: skipped ({nvml['skipped']})")
    for scenario, poll in nvml.get("polls", {}).items():
        lines.append(f"NVML poll, {scenario}: {poll['median_ms']:.3f} ms median ({poll['median_ms_per_gpu']:.3f} ms "
                     f"per GPU), {poll['calls_per_poll']:.1f} calls")
    if nvml.get("calls"):
        bad = sorted({f"{row['call'].strip()}: {row['status']}" for rows in nvml["calls"]["per_gpu"].values()
                      for row in rows if row["status"] != "ok"})
        lines.append("NVML calls not ok: " + ("; ".join(bad) if bad else "none"))
    cpu = nvml.get("daemon_cpu", {})
    if "nvml_1s" in cpu:
        lines.append(f"daemon CPU, NVML 1 s: {cpu['nvml_1s'] * 100:.3f} % of a core "
                     f"(--no-gpu-metrics {cpu['no_gpu_metrics'] * 100:.3f} %)")
    if "mismatches" in nvml:
        lines.append("readings vs nvidia-smi: " + ("nvidia-smi gave no readings" if nvml["mismatches"] is None
                                                   else f"{nvml['mismatches']} value(s) differ beyond tolerance"))
    for name, part in parts.items():
        lines.append(f"part {name}: {'TIMED OUT' if part['timed_out'] else 'exit ' + str(part['exit'])} "
                     f"in {part['seconds']:.0f} s")
    return lines


def probe_lines(shim: dict[str, Any]) -> list[str]:
    """The shim part's busy-GPU probe and first-call costs, one line each."""
    lines = []
    probe = shim.get("busy_probe_us")
    if probe:
        bad = shim.get("busy_probe_failures", [])
        lines.append(f"busy-GPU probe: {'FAILED: ' + '; '.join(bad) if bad else 'ok'}; slowest call "
                     f"{max(probe.values()):.1f} us (scalar {probe.get('scalar', float('nan')):.1f} us)")
    for order, row in shim.get("first_call", {}).items():
        lines.append(f"first scalar() ({order}): " + (f"error {row['error']}" if "error" in row else
                     f"{row['first_us']:.1f} us, later median {row['later_median_us']:.1f} us, "
                     f"max {row['later_max_us']:.1f} us"))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write every part's results here (JSON)")
    parser.add_argument("--dry-run", action="store_true", help="no GPU: CPU tensors, short runs")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="total time limit (s), shared by the parts")
    parser.add_argument("--old-scalar", type=Path, default=None,
                        help="the parity part's \"before\": cf69852's trainer_shim/cuda_scalar.py (default: from git)")
    parser.add_argument("--fake-nvml", type=int, default=0, metavar="N",
                        help="dry run only: NVML from the tests' fake driver with N GPUs (needs gcc and nvml.h)")
    parser.add_argument("--nvidia-smi", default=None, help="nvidia-smi binary for the NVML part")
    args = parser.parse_args(argv)
    chosen = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in PARTS]
    if unknown or not chosen:
        parser.error(f"unknown part(s) {unknown}; choose from {', '.join(PARTS)}")
    if args.fake_nvml and not args.dry_run:
        parser.error("--fake-nvml is for --dry-run only")
    if args.budget <= 0:
        parser.error("--budget must be > 0")
    export_sys_path()  # every part, receiver and daemon sees what this process imports
    environment, missing = preflight()
    print(f"environment: {environment}", flush=True)
    if missing:
        print(f"missing Python modules: {', '.join(missing)}; install the carried wheels into a target directory "
              "and put it on PYTHONPATH (see bench/RESULTS_GPU.md)", file=sys.stderr)
        write_out(args.out, args.dry_run, environment, [f"missing modules: {missing}"], {})
        return 2
    parts: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="dfs-gpucheck-", dir="/tmp") as tmp:
        workdir = Path(tmp)
        if args.fake_nvml:
            os.environ.update(fake_nvml_env(workdir, args.fake_nvml))
        share = sum(PARTS[p][1] for p in chosen)
        for name in chosen:
            _, weight, real, dry = PARTS[name]
            extra = list(dry if args.dry_run else real)
            if name == "nvml" and args.nvidia_smi:
                extra += ["--nvidia-smi", args.nvidia_smi]
            if name == "parity" and args.old_scalar:
                extra += ["--old-scalar", str(args.old_scalar.resolve())]
            parts[name] = run_part(name, extra, args.budget * weight / share, workdir)
            write_out(args.out, args.dry_run, environment, summary(parts), parts)  # partial results survive a kill
    lines = summary(parts)
    print("===== summary =====\n" + "\n".join(lines), flush=True)
    if args.out is not None:
        write_out(args.out, args.dry_run, environment, lines, parts)
        print(f"results written to {args.out}")
    return 0 if all(p["exit"] == 0 and not p["timed_out"] for p in parts.values()) else 1


# What the parts import, by import name; a missing one fails the check in seconds, not minutes.
REQUIRED_MODULES = ("torch", "zmq", "msgspec", "datasketches", "numpy", "pynvml", "prometheus_client")


def preflight() -> tuple[dict[str, Any], list[str]]:
    """Versions of the environment, and the required modules it lacks."""
    environment: dict[str, Any] = {"python": sys.version.split()[0]}
    missing = []
    for module in REQUIRED_MODULES:
        if importlib.util.find_spec(module) is None:
            missing.append(module)
            continue
        try:
            environment[module] = importlib.metadata.version(DISTRIBUTIONS.get(module, module))
        except importlib.metadata.PackageNotFoundError:
            environment[module] = "?"
    environment["nvidia-smi"] = shutil.which("nvidia-smi")
    return environment, missing


DISTRIBUTIONS = {"zmq": "pyzmq", "pynvml": "nvidia-ml-py", "prometheus_client": "prometheus-client"}


def write_out(path: Path | None, dry_run: bool, environment: dict[str, Any], lines: list[str],
              parts: dict[str, dict[str, Any]]) -> None:
    """The combined results file (``None``: nowhere)."""
    if path is not None:
        path.write_text(json.dumps({"dry_run": dry_run, "argv": sys.argv[1:], "environment": environment,
                                    "summary": lines, "parts": parts}, indent=1) + "\n")


def fake_nvml_env(workdir: Path, gpus: int) -> dict[str, str]:
    """Build the tests' fake NVML driver and script ``gpus`` busy Hopper-like GPUs; the variables
    that make the parts and their daemons load it."""
    sys.path.insert(0, str(ROOT))
    from tests.fake_nvml import FakeNvml, build_fake_nvml

    library = build_fake_nvml("full")
    fake = FakeNvml(workdir / "nvml-control.txt", library, {"devices": gpus})
    fake.gpu("*", utilization_gpu=90, memory_total=80 * 2**30, memory_used=60 * 2**30, gpm_supported=1)
    return {"LD_LIBRARY_PATH": str(library.parent), "FAKE_NVML_CONTROL": str(fake.path)}


if __name__ == "__main__":
    raise SystemExit(main())
