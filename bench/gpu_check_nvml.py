"""NVML on real hardware: the cost of each call kind and of a poll (GPM on and off, with the
per-process query), the daemon's CPU at 1 s polling, and the sidecar's readings next to
``nvidia-smi``'s for every field the NVML source exports.

Part of ``python bench/gpu_check.py``; alone::

    python bench/gpu_check_nvml.py [--seconds 3] [--interval 0.2] [--daemon-seconds 10]
        [--nvidia-smi PATH] [--library PATH] [--json FILE] [--dry-run]

1. **Calls.** Every NVML call a poll makes or falls back to, timed ``--reps`` times per GPU
   through the sidecar's ``NvmlDriver``: a table call -> ok / unsupported / missing / error.
2. **Polls.** The real ``NvmlSource`` reading every value every poll (``every-poll``: what
   one poll of everything costs) for ``--seconds`` each, polling every ``--interval``: GPM on
   (the default), GPM off, and GPM on with a trainer pid known (the per-process query each
   poll). Wall time and poller-thread CPU per poll, per GPU, NVML calls per poll.
3. **Daemon CPU.** Real ``dflash-sidecar run`` daemons polling every 1 s at default settings,
   side by side: the cost-aware poller (the default), ``--nvml-cadence every-poll`` (every value
   every poll, as before the cadences), each for ``--daemon-seconds`` of wall time, then
   ``--no-gpu-metrics`` for half as long; CPU from /proc, and the NVML cost per poll (wall and
   CPU, per call kind) and the slow values' intervals from the daemon's own telemetry.
4. **Readings.** Right after the last poll, ``nvidia-smi --query-gpu=...`` (and ``nvidia-smi
   dmon -s t`` for PCIe rates), per GPU and field both values in nvidia-smi's units with a
   tolerance check (instantaneous values such as utilization move between the two reads).
   Values nvidia-smi has no field for (energy, GPM, XIDs) are listed on their own.

On a CUDA machine a load process (bf16 matmuls) keeps the GPU busy throughout, so utilization,
power and clocks are not idle values, and it is the trainer pid of the per-process query.
Exit status: 0 all compared fields agree, 1 some differ (or nvidia-smi gave nothing), 2 no
NVML/GPU here (with a message saying why; ``--dry-run``: 0, reported as skipped).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_check_common import cpu_share, gpus_up, start_daemon, write_json
from gpu_check_nvml_calls import gpu_calls, per_poll_estimate, print_table, system_calls

from sidecar.model.gpu import GpuReading, GpuSnapshot
from sidecar.sources.nvml import GpmSampler, NvmlSource, probe_nvml
from sidecar.sources.nvml_cadence import EVERY_POLL
from sidecar.sources.nvml_driver import NvmlDriver

MIB = 1024.0 * 1024.0


@dataclass(frozen=True)
class Field:
    """One compared value: nvidia-smi query names (first supported wins) and the sidecar's value
    converted to nvidia-smi's unit, with an absolute and relative tolerance."""

    label: str
    smi: tuple[str, ...]
    sidecar: Callable[[GpuReading], float | None]
    abs_tol: float = 0.0
    rel_tol: float = 0.0
    hex_mask: bool = False


def _scaled(attribute: str, scale: float) -> Callable[[GpuReading], float | None]:
    def get(reading: GpuReading) -> float | None:
        value = getattr(reading, attribute)
        return None if value is None else float(value) * scale
    return get


FIELDS: tuple[Field, ...] = (
    Field("utilization.gpu [%]", ("utilization.gpu",), _scaled("utilization_ratio", 100), abs_tol=15),
    Field("utilization.memory [%]", ("utilization.memory",), _scaled("memory_utilization_ratio", 100), abs_tol=15),
    Field("memory.total [MiB]", ("memory.total",), _scaled("memory_total_bytes", 1 / MIB), rel_tol=0.02),
    Field("memory.used [MiB]", ("memory.used",), _scaled("memory_used_bytes", 1 / MIB), abs_tol=64, rel_tol=0.05),
    Field("memory.free [MiB]", ("memory.free",), _scaled("memory_free_bytes", 1 / MIB), abs_tol=64, rel_tol=0.05),
    # nvmlDeviceGetPowerUsage, what the sidecar reads, is nvidia-smi's power.draw.average on Ampere and newer
    Field("power.draw [W]", ("power.draw.average", "power.draw"), _scaled("power_watts", 1), abs_tol=10,
          rel_tol=0.15),
    Field("enforced.power.limit [W]", ("enforced.power.limit",), _scaled("power_limit_watts", 1), abs_tol=1),
    Field("temperature.gpu [C]", ("temperature.gpu",), _scaled("temperature_celsius", 1), abs_tol=2),
    Field("temperature.memory [C]", ("temperature.memory",), _scaled("memory_temperature_celsius", 1), abs_tol=2),
    Field("clocks.sm [MHz]", ("clocks.sm",), _scaled("sm_clock_hertz", 1e-6), rel_tol=0.1),
    Field("clocks.mem [MHz]", ("clocks.mem",), _scaled("memory_clock_hertz", 1e-6), rel_tol=0.02),
    Field("clock event reasons (mask)", ("clocks_event_reasons.active", "clocks_throttle_reasons.active"),
          lambda r: None if r.clock_event_mask is None else float(r.clock_event_mask), hex_mask=True),
    Field("ecc corrected, volatile", ("ecc.errors.corrected.volatile.total",), _scaled("ecc_corrected_total", 1)),
    Field("ecc uncorrected, volatile", ("ecc.errors.uncorrected.volatile.total",),
          _scaled("ecc_uncorrected_total", 1)),
)

PCIE = (("pcie rx [MB/s]", "rxpci", "pcie_rx_bytes_per_second"),
        ("pcie tx [MB/s]", "txpci", "pcie_tx_bytes_per_second"))
"""Compared with ``nvidia-smi dmon -s t`` (its own 1 s sample, so a loose tolerance)."""
PCIE_ABS_TOL, PCIE_REL_TOL = 200.0, 0.5

SIDECAR_ONLY = (
    ("energy [J]", "energy_joules"), ("GPM sm activity", "sm_activity_ratio"),
    ("GPM sm occupancy", "sm_occupancy_ratio"), ("GPM tensor activity", "tensor_activity_ratio"),
    ("GPM dram bandwidth", "dram_bandwidth_ratio"), ("GPM nvlink rx [B/s]", "nvlink_rx_bytes_per_second"),
    ("GPM nvlink tx [B/s]", "nvlink_tx_bytes_per_second"), ("xid errors", "xid_errors_total"),
    ("profiling", "profiling"),
)


def supported_smi_fields(binary: str) -> set[str]:
    """Query field names this nvidia-smi knows (from ``--help-query-gpu``)."""
    text = subprocess.run([binary, "--help-query-gpu"], capture_output=True, text=True, check=False).stdout
    return {part.strip().strip('"') for line in text.splitlines() if line.startswith('"')
            for part in line.split(" or ")}


def query_smi(binary: str, fields: list[str]) -> dict[int, dict[str, str]]:
    """``nvidia-smi --query-gpu`` as ``{index: {field: raw text}}``. Raises ``RuntimeError``."""
    result = subprocess.run([binary, f"--query-gpu=index,{','.join(fields)}", "--format=csv,noheader,nounits"],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"nvidia-smi failed: {result.stdout.strip()} {result.stderr.strip()}")
    rows: dict[int, dict[str, str]] = {}
    for line in result.stdout.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        rows[int(values[0])] = dict(zip(fields, values[1:], strict=False))
    return rows


def dmon_pcie(binary: str, timeout_s: float = 15.0) -> dict[int, dict[str, float]] | None:
    """One sample of ``nvidia-smi dmon -c 1 -s t``: ``{gpu: {column: MB/s}}``; None if it fails."""
    try:
        result = subprocess.run([binary, "dmon", "-c", "1", "-s", "t"], capture_output=True, text=True,
                                timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = result.stdout.splitlines()
    header = next((line.lstrip("#").split() for line in lines if line.startswith("#")), [])
    if result.returncode != 0 or "gpu" not in header:
        return None
    rows: dict[int, dict[str, float]] = {}
    for line in lines:
        values = line.split()
        if line.startswith("#") or len(values) != len(header):
            continue
        row = dict(zip(header, values, strict=True))
        try:
            rows[int(row.pop("gpu"))] = {k: float(v) for k, v in row.items() if v not in ("-", "N/A")}
        except ValueError:
            continue
    return rows or None


def _number(text: str | None, hex_mask: bool) -> float | None:
    if text is None or text.startswith("[") or text in ("N/A", ""):
        return None
    try:
        return float(int(text, 16)) if hex_mask else float(text)
    except ValueError:
        return None


def _show(value: float | None, hex_mask: bool) -> str:
    if value is None:
        return "-"
    return f"{int(value):#x}" if hex_mask else f"{value:.6g}"


def _verdict(mine: float | None, theirs: float | None, abs_tol: float, rel_tol: float) -> tuple[str, int]:
    if mine is None and theirs is None:
        return "n/a", 0
    if mine is None or theirs is None:
        return "ONLY " + ("smi" if mine is None else "us"), 1
    ok = abs(mine - theirs) <= max(abs_tol, rel_tol * abs(theirs))
    return ("yes", 0) if ok else ("NO", 1)


def compare(snapshot: GpuSnapshot, smi: dict[int, dict[str, str]], chosen: dict[str, str],
            pcie: dict[int, dict[str, float]] | None = None) -> tuple[list[str], int]:
    """Lines of the comparison table and the number of disagreeing values. ``pcie``: per GPU
    ``nvidia-smi dmon -s t`` columns (MB/s); None when dmon gave nothing (not compared)."""
    lines, mismatches = [], 0
    for reading in snapshot.gpus:
        lines.append(f"GPU {reading.index}  {reading.name}  {reading.uuid}  {'up' if reading.up else 'DOWN'}")
        lines.append(f"  {'field':30} {'sidecar':>16} {'nvidia-smi':>16}  {'agree':5}  nvidia-smi field")
        for field in FIELDS:
            name = chosen.get(field.label)
            mine = field.sidecar(reading)
            theirs = _number(smi.get(reading.index, {}).get(name or ""), field.hex_mask) if name else None
            if name:
                verdict, missed = _verdict(mine, theirs, field.abs_tol, field.rel_tol)
            else:  # this nvidia-smi has no query field for it: nothing to compare, no mismatch
                verdict, missed = "-", 0
            mismatches += missed
            shown = [_show(v, field.hex_mask) for v in (mine, theirs)]
            lines.append(f"  {field.label:30} {shown[0]:>16} {shown[1]:>16}  {verdict:5}  {name or '(none)'}")
        for label, column, attribute in PCIE:
            rate = getattr(reading, attribute)
            mine = None if rate is None else rate / 1e6
            if pcie is None:
                lines.append(f"  {label:30} {_show(mine, False):>16} {'(no dmon)':>16}")
                continue
            theirs = pcie.get(reading.index, {}).get(column)
            verdict, missed = _verdict(mine, theirs, PCIE_ABS_TOL, PCIE_REL_TOL)
            mismatches += missed
            lines.append(f"  {label:30} {_show(mine, False):>16} {_show(theirs, False):>16}  {verdict:5}  "
                         f"dmon -s t {column}")
        for label, attribute in SIDECAR_ONLY:
            value = getattr(reading, attribute)
            text = "-" if value is None else (value.value if hasattr(value, "value") else f"{value:.6g}")
            lines.append(f"  {label:30} {text:>16} {'(no smi field)':>16}")
    return lines, mismatches


@contextlib.contextmanager
def gpm_disabled() -> Iterator[None]:
    """GPM off for the sources started inside (the daemon has no switch for it: GPM is on wherever
    the GPU supports it); the sampler then reports the GPU as not supporting GPM."""
    with mock.patch.object(GpmSampler, "setup", lambda self: None):
        yield


def measure_source(seconds: float, interval: float, library: str | None, trainer: dict[int, tuple[str, str]],
                   after: Callable[[GpuSnapshot], Any] | None = None) -> dict[str, Any]:
    """Poll with a real ``NvmlSource`` for ``seconds``: per-poll wall time, poller CPU and NVML calls.

    ``after`` runs on the newest snapshot while the source still runs (the nvidia-smi comparison)."""
    source = NvmlSource(interval_s=interval, library_path=library, cadence=EVERY_POLL)
    source.set_trainer_processes(trainer)
    source.start()
    try:
        give_up = time.monotonic() + 15.0
        while source.latest() is None and time.monotonic() < give_up:
            time.sleep(0.02)
        poller = next((t for t in threading.enumerate() if t.name == "nvml-poller"), None)
        cpu_clock = time.pthread_getcpuclockid(poller.ident) if poller is not None and poller.ident else None
        cpu0, polls0 = (time.clock_gettime(cpu_clock) if cpu_clock is not None else 0.0), source.status().polls_total
        durations: list[float] = []
        calls: list[int] = []
        seen = source.latest()
        deadline = time.monotonic() + seconds
        give_up = deadline + 10.0  # a loaded machine: wait for at least two polls
        while time.monotonic() < deadline or (len(durations) < 2 and time.monotonic() < give_up):
            time.sleep(interval / 4)
            snapshot = source.latest()
            if snapshot is not None and snapshot is not seen:
                seen = snapshot
                durations.append(snapshot.poll_duration_s)
                calls.append(snapshot.nvml_calls)
        polls = source.status().polls_total - polls0
        cpu = (time.clock_gettime(cpu_clock) - cpu0) / polls if cpu_clock is not None and polls else float("nan")
        snapshot = source.latest()
        extra = after(snapshot) if after is not None and snapshot is not None else None
        status = source.status()
    finally:
        source.shutdown()
    if snapshot is None or not durations:
        raise RuntimeError(f"the NVML source produced no data: {status.state.value} {status.reason}")
    durations.sort()
    gpus = len(snapshot.gpus)
    return {"gpus": gpus, "polls": len(durations), "interval_s": interval,
            "median_ms": statistics.median(durations) * 1e3,
            "p99_ms": durations[int(0.99 * (len(durations) - 1))] * 1e3,
            "max_ms": durations[-1] * 1e3, "median_ms_per_gpu": statistics.median(durations) * 1e3 / max(gpus, 1),
            "poller_cpu_ms_per_poll": cpu * 1e3, "calls_per_poll": statistics.mean(calls),
            "errors": dict(status.errors), "profiling": [g.profiling.value for g in snapshot.gpus],
            "processes_found": sum(len(g.processes) for g in snapshot.gpus), "snapshot": snapshot, "after": extra}


def start_load(seconds: float) -> subprocess.Popen[str] | None:
    """A process keeping GPU 0 busy with bf16 matmuls for ``seconds`` (None without CUDA)."""
    code = ("import sys, time, torch\n"
            "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
            "torch.cuda.synchronize(); print('ready', flush=True)\n"
            f"end = time.monotonic() + {seconds}\n"
            "while time.monotonic() < end:\n"
            "    for _ in range(8): a @ a\n"
            "    torch.cuda.synchronize()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 90.0)
    if not ready or proc.stdout.readline().strip() != "ready":
        print("GPU load process did not start; the NVML part runs on an idle GPU", file=sys.stderr)
        proc.kill()
        proc.wait()
        return None
    return proc


DAEMONS: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    ("nvml_1s", ()), ("nvml_1s_every_poll", ("--nvml-cadence", "every-poll")), ("no_gpu_metrics", None))
"""The daemon runs of the CPU reading: key -> extra ``run`` options (None: ``--no-gpu-metrics``).
``nvml_1s`` is the default (the cost-aware poller, within its CPU budget); ``every-poll`` reads
every value every poll, as the poller did before it had cadences."""


def daemon_cpu(seconds: float) -> dict[str, Any]:
    """CPU share of one core of a real daemon over ``seconds`` for each of ``DAEMONS`` (the run
    without NVML for half as long), with its NVML cost per poll from its own telemetry."""
    out: dict[str, Any] = {"seconds": seconds}
    with tempfile.TemporaryDirectory(prefix="dfs-nvml-", dir="/tmp") as tmp:
        for key, extra in DAEMONS:
            daemon = start_daemon(Path(tmp), gpu_metrics=extra is not None, nvml_interval_s=1.0, extra=extra or ())
            try:
                time.sleep(1.0)  # start-up work and the first poll are not the steady state
                before = daemon.samples() if extra is not None else None
                out[key] = cpu_share(daemon.pid, seconds if extra is not None else seconds / 2)
                out[f"{key}_gpus_up"] = gpus_up(daemon)
                if before is not None:
                    out[f"{key}_nvml"] = nvml_costs(before, daemon.samples())
            finally:
                daemon.stop()
    return out


def nvml_costs(before: Any, after: Any) -> dict[str, Any]:
    """The daemon's NVML telemetry between two scrapes: polls, NVML wall and CPU ms per poll (all
    calls, and per call kind), the poller thread's CPU per poll, the slow values' intervals."""
    def delta(name: str, **labels: str) -> float:
        return sum(v for lab, v in after.get(name, []) if all(lab.get(k) == x for k, x in labels.items())) - sum(
            v for lab, v in before.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))

    polls = delta("dflash_nvml_polls_total")
    if not polls:
        return {"polls": 0}
    calls = sorted({lab["call"] for lab, _ in after.get("dflash_nvml_call_seconds_total", [])})
    by_call = {call: delta("dflash_nvml_call_seconds_total", call=call) * 1e3 / polls for call in calls}
    return {"polls": polls, "wall_ms_per_poll": sum(by_call.values()),
            "cpu_ms_per_poll": delta("dflash_nvml_call_cpu_seconds_total") * 1e3 / polls,
            "poller_cpu_ms_per_poll": delta("dflash_nvml_cpu_seconds_total") * 1e3 / polls,
            "wall_ms_per_poll_by_call": {c: v for c, v in by_call.items() if v > 0},
            "intervals_s": {lab["values"]: v for lab, v in after.get("dflash_nvml_interval_seconds", [])}}


def print_daemon_cpu(cpu: dict[str, Any]) -> None:
    """The daemon runs side by side: CPU share, NVML per poll, the slow values' intervals."""
    print(f"\ndaemon CPU over {cpu['seconds']:g} s at 1 s polling (idle trainer side), default settings:")
    for key, label in (("nvml_1s", "cost-aware poller (default)"), ("nvml_1s_every_poll", "every value every poll"),
                       ("no_gpu_metrics", "--no-gpu-metrics")):
        if key not in cpu:
            continue
        line = f"  {label:30} {cpu[key] * 100:6.3f} % of a core"
        nvml = cpu.get(f"{key}_nvml", {})
        if nvml.get("polls"):
            top = sorted(nvml["wall_ms_per_poll_by_call"].items(), key=lambda kv: -kv[1])[:4]
            line += (f" ({cpu[f'{key}_gpus_up']} GPU(s) up); NVML per poll {nvml['wall_ms_per_poll']:.3f} ms wall, "
                     f"{nvml['cpu_ms_per_poll']:.3f} ms CPU; poller CPU {nvml['poller_cpu_ms_per_poll']:.3f} ms "
                     f"per poll over {nvml['polls']:.0f} polls; most: "
                     + ", ".join(f"{c} {v:.3f} ms" for c, v in top))
        print(line)
    intervals = cpu.get("nvml_1s_nvml", {}).get("intervals_s", {})
    slow = {k: v for k, v in intervals.items() if v > 1.0}
    if slow:
        print("  cost-aware intervals of the slow values (s): " + ", ".join(f"{k} {v:.3g}" for k, v in slow.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="NVML cost per call and poll, daemon CPU, readings vs nvidia-smi.")
    parser.add_argument("--seconds", type=float, default=1.5, help="polling time per scenario")
    parser.add_argument("--interval", type=float, default=0.2, help="poll interval of the scenarios (s)")
    parser.add_argument("--reps", type=int, default=10, help="repetitions of each NVML call")
    parser.add_argument("--daemon-seconds", type=float, default=12.0,
                        help="wall time per daemon CPU reading (the one without NVML: half; 0: skip)")
    parser.add_argument("--nvidia-smi", default=shutil.which("nvidia-smi") or "nvidia-smi")
    parser.add_argument("--library", default=None, help="explicit libnvidia-ml.so path")
    parser.add_argument("--no-load", action="store_true", help="no GPU load process during the part")
    parser.add_argument("--dry-run", action="store_true", help="no NVML here is not a failure; no GPU load")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"dry_run": args.dry_run}
    ok, message = probe_nvml(args.library)
    print(message)
    results["probe"] = message
    if not ok:
        results["skipped"] = f"no usable NVML: {message}"
        write_json(args.json, results)
        if args.dry_run:
            print("dry run: no NVML library here, NVML part skipped (run with the fake driver to exercise it)")
            return 0
        print("No usable NVIDIA GPU/driver here: nothing to check. Run this on the GPU machine.", file=sys.stderr)
        return 2
    load = None if args.dry_run or args.no_load else start_load(300.0)
    try:
        return measure_all(args, results, load)
    except Exception as exc:  # noqa: BLE001 - a driver refusing something unforeseen: report, keep results
        results["error"] = f"{type(exc).__name__}: {exc}"
        print(f"NVML part failed: {results['error']}", file=sys.stderr)
        write_json(args.json, results)
        return 1
    finally:
        if load is not None:
            load.kill()
            load.wait()


def measure_all(args: argparse.Namespace, results: dict[str, Any], load: subprocess.Popen[str] | None) -> int:
    """Calls, polls, daemon CPU and readings; fills ``results``, prints, returns the exit status."""
    print(f"GPU load process: {'pid ' + str(load.pid) if load is not None else 'none (idle GPU values)'}")
    driver = NvmlDriver(logging.getLogger("gpu_check"))
    driver.load(args.library)
    try:
        count = driver.call_raw("nvmlDeviceGetCount")
        handles = [driver.call_raw("nvmlDeviceGetHandleByIndex", i) for i in range(count)]
        system, versions = system_calls(driver, handles, args.reps)
        per_gpu = {i: gpu_calls(driver, h, args.reps) for i, h in enumerate(handles)}
    finally:
        driver.shutdown()
    results["versions"], results["calls"] = versions, {"system": system, "per_gpu": per_gpu}
    write_json(args.json, results)  # after each stage: a part killed at its time limit keeps what it measured
    print(f"driver {versions.get('driver')}, NVML {versions.get('nvml')}, CUDA (driver) {versions.get('cuda_driver')}")
    print_table(per_gpu, system)
    estimates = {g: {"base_us": per_poll_estimate(rows, False, False), "gpm_us": per_poll_estimate(rows, False, True),
                     "gpm_processes_us": per_poll_estimate(rows, True, True)} for g, rows in per_gpu.items()}
    results["per_poll_estimate_us"] = estimates
    for g, e in estimates.items():
        print(f"  GPU {g}: sum of the medians of one poll's calls: {e['base_us']:.1f} us without GPM, "
              f"{e['gpm_us']:.1f} us with GPM, {e['gpm_processes_us']:.1f} us with GPM and the process query")

    smi_state: dict[str, Any] = {}

    def read_smi(snapshot: GpuSnapshot) -> None:
        try:
            known = supported_smi_fields(args.nvidia_smi)
            smi_state["chosen"] = {f.label: next((n for n in f.smi if n in known), "") for f in FIELDS}
            smi_state["smi"] = query_smi(args.nvidia_smi, sorted({n for n in smi_state["chosen"].values() if n}))
            smi_state["pcie"] = dmon_pcie(args.nvidia_smi)
        except (OSError, RuntimeError) as exc:
            print(f"cannot run nvidia-smi ({args.nvidia_smi}): {exc}", file=sys.stderr)

    trainer = {load.pid if load is not None else os.getpid(): ("trainer", "0")}
    scenarios: tuple[tuple[str, bool, dict[int, tuple[str, str]], Callable[[GpuSnapshot], None] | None], ...] = (
        ("gpm on", False, {}, None), ("gpm off", True, {}, None),
        ("gpm on + process query", False, trainer, read_smi))
    polls: dict[str, dict[str, Any]] = {}
    print(f"\nNVML polls by the sidecar's NvmlSource reading every value every poll, {args.seconds:g} s per scenario "
          f"every {args.interval:g} s:")
    for name, no_gpm, pids, after in scenarios:
        with gpm_disabled() if no_gpm else contextlib.nullcontext():
            try:
                polls[name] = measure_source(args.seconds, args.interval, args.library, pids, after)
            except RuntimeError as exc:
                print(f"  {name}: {exc}", file=sys.stderr)
                continue
        p = polls[name]
        print(f"  {name:24} NVML cost per poll, {p['gpus']} GPU(s), {p['polls']} polls: median {p['median_ms']:.3f} ms "
              f"({p['median_ms_per_gpu']:.3f} ms per GPU), p99 {p['p99_ms']:.3f} ms, max {p['max_ms']:.3f} ms; "
              f"{p['calls_per_poll']:.1f} NVML calls per poll; "
              f"poller CPU {p['poller_cpu_ms_per_poll']:.3f} ms per poll; "
              f"GPM {'/'.join(p['profiling'])}; trainer processes found {p['processes_found']}; "
              f"errors: {p['errors'] or 'none'}")
    last = polls.get("gpm on + process query")
    results["polls"] = {k: {n: v for n, v in p.items() if n not in ("snapshot", "after")} for k, p in polls.items()}
    write_json(args.json, results)
    if args.daemon_seconds > 0:
        try:
            results["daemon_cpu"] = cpu = daemon_cpu(args.daemon_seconds)
            print_daemon_cpu(cpu)
            write_json(args.json, results)
        except (RuntimeError, OSError, AssertionError) as exc:
            results["daemon_cpu"] = {"error": str(exc)}
            print(f"daemon CPU: could not measure: {exc}", file=sys.stderr)
    if last is None:
        write_json(args.json, results)
        return 2
    lines, mismatches = compare(last["snapshot"], smi_state.get("smi", {}), smi_state.get("chosen", {}),
                                smi_state.get("pcie"))
    print("\nreadings, sidecar vs nvidia-smi (right after the last poll):")
    print("\n".join(lines))
    results["readings"] = lines
    results["mismatches"] = mismatches if smi_state.get("smi") else None
    status = 0
    if not smi_state.get("smi"):
        print("nvidia-smi gave no readings: the sidecar's values are shown without comparison")
        status = 1
    else:
        print(f"{mismatches} value(s) differ beyond tolerance" if mismatches else "all compared values agree")
        status = 1 if mismatches else 0
    write_json(args.json, results)
    if args.dry_run and status:
        print("dry run: the comparison is plumbing only (no real GPU), so it does not fail the run")
        return 0
    return status


if __name__ == "__main__":
    raise SystemExit(main())
