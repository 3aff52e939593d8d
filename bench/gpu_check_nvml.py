"""GPU check for a real GPU machine: the sidecar's NVML readings next to nvidia-smi's, and
the NVML cost of one poll on this hardware.

    python bench/gpu_check.py [--seconds 5] [--interval 0.1] [--nvidia-smi PATH] [--library PATH]

Runs the real ``NvmlSource`` for ``--seconds`` (polling every ``--interval``), then queries
``nvidia-smi --query-gpu=...`` right after the newest snapshot and prints, per GPU and field,
both values in nvidia-smi's units with a tolerance check (instantaneous values such as
utilization move between the two reads). Values nvidia-smi has no query field for (energy,
PCIe rates, GPM, XIDs) are listed on their own. Exit status: 0 all compared fields agree,
1 some differ, 2 no NVML/GPU here (with a message saying why).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sidecar.model.gpu import GpuReading, GpuSnapshot
from sidecar.sources.nvml import NvmlSource, probe_nvml

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
    Field("power.draw [W]", ("power.draw.instant", "power.draw"), _scaled("power_watts", 1), abs_tol=10, rel_tol=0.15),
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

SIDECAR_ONLY = (
    ("energy [J]", "energy_joules"), ("pcie rx [B/s]", "pcie_rx_bytes_per_second"),
    ("pcie tx [B/s]", "pcie_tx_bytes_per_second"), ("GPM sm activity", "sm_activity_ratio"),
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


def compare(snapshot: GpuSnapshot, smi: dict[int, dict[str, str]], chosen: dict[str, str]) -> tuple[list[str], int]:
    """Lines of the comparison table and the number of disagreeing values."""
    lines, mismatches = [], 0
    for reading in snapshot.gpus:
        lines.append(f"GPU {reading.index}  {reading.name}  {reading.uuid}  {'up' if reading.up else 'DOWN'}")
        lines.append(f"  {'field':30} {'sidecar':>16} {'nvidia-smi':>16}  {'agree':5}  nvidia-smi field")
        for field in FIELDS:
            name = chosen.get(field.label)
            mine = field.sidecar(reading)
            theirs = _number(smi.get(reading.index, {}).get(name or ""), field.hex_mask) if name else None
            if mine is None and theirs is None:
                verdict = "n/a"
            elif mine is None or theirs is None:
                verdict = "ONLY " + ("smi" if mine is None else "us")
                mismatches += 1
            else:
                ok = abs(mine - theirs) <= max(field.abs_tol, field.rel_tol * abs(theirs))
                verdict = "yes" if ok else "NO"
                mismatches += 0 if ok else 1
            shown = [_show(v, field.hex_mask) for v in (mine, theirs)]
            lines.append(f"  {field.label:30} {shown[0]:>16} {shown[1]:>16}  {verdict:5}  {name or '(none)'}")
        for label, attribute in SIDECAR_ONLY:
            value = getattr(reading, attribute)
            text = "-" if value is None else (value.value if hasattr(value, "value") else f"{value:.6g}")
            lines.append(f"  {label:30} {text:>16} {'(no smi field)':>16}")
    return lines, mismatches


def main() -> int:
    parser = argparse.ArgumentParser(description="Sidecar NVML readings vs nvidia-smi, and NVML cost per poll.")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--nvidia-smi", default=shutil.which("nvidia-smi") or "nvidia-smi")
    parser.add_argument("--library", default=None, help="explicit libnvidia-ml.so path")
    args = parser.parse_args()

    ok, message = probe_nvml(args.library)
    print(message)
    if not ok:
        print("No usable NVIDIA GPU/driver here: nothing to check. Run this on the GPU machine.", file=sys.stderr)
        return 2
    source = NvmlSource(interval_s=args.interval, library_path=args.library)
    source.start()
    time.sleep(0.5)
    poller = next((t for t in threading.enumerate() if t.name == "nvml-poller"), None)
    cpu_clock = time.pthread_getcpuclockid(poller.ident) if poller is not None and poller.ident else None
    cpu0, polls0 = (time.clock_gettime(cpu_clock) if cpu_clock is not None else 0.0), source.status().polls_total
    durations, calls, seen = [], [], source.latest()
    deadline = time.monotonic() + args.seconds
    give_up = deadline + 10.0  # a loaded machine: wait for at least two polls
    while time.monotonic() < deadline or (len(durations) < 2 and time.monotonic() < give_up):
        time.sleep(args.interval / 4)
        snapshot = source.latest()
        if snapshot is not None and snapshot is not seen:
            seen = snapshot
            durations.append(snapshot.poll_duration_s)
            calls.append(snapshot.nvml_calls)
    polls = source.status().polls_total - polls0
    cpu = (time.clock_gettime(cpu_clock) - cpu0) / polls if cpu_clock is not None and polls else float("nan")
    snapshot = source.latest()
    try:
        known = supported_smi_fields(args.nvidia_smi)
        chosen = {f.label: next((n for n in f.smi if n in known), "") for f in FIELDS}
        smi = query_smi(args.nvidia_smi, sorted({n for n in chosen.values() if n}))
    except (OSError, RuntimeError) as exc:
        print(f"cannot run nvidia-smi ({args.nvidia_smi}): {exc}", file=sys.stderr)
        chosen, smi = {}, {}
    status = source.status()
    source.shutdown()
    if snapshot is None or not durations:
        print(f"the NVML source produced no data: {status.state.value} {status.reason}", file=sys.stderr)
        return 2
    lines, mismatches = compare(snapshot, smi, chosen)
    print("\n".join(lines))
    if not smi:
        print("nvidia-smi gave no readings: the sidecar's values are shown without comparison")
    durations.sort()
    p99 = durations[int(0.99 * (len(durations) - 1))]
    print(f"\nNVML cost per poll, {len(snapshot.gpus)} GPU(s), {len(durations)} polls at {args.interval:g} s: "
          f"median {statistics.median(durations) * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms, "
          f"max {durations[-1] * 1e3:.3f} ms; {statistics.mean(calls):.1f} NVML calls per poll; "
          f"poller CPU {cpu * 1e3:.3f} ms per poll; errors: {dict(status.errors) or 'none'}")
    if not smi:
        return 1
    print(f"{mismatches} value(s) differ beyond tolerance" if mismatches else "all compared values agree")
    return 1 if mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
