"""Drive ``dflash-sidecar demo --bottleneck X`` and score its console verdicts (a support module:
``tests/test_insight_demo.py`` runs the short form, ``bench/bench_verdict.py`` the long one with
its confusion matrix)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.daemon_harness import ROOT, free_port

EXPECTED = {"none": "balanced", "target": "target-bound", "drafter": "drafter-bound", "queue": "queue-starved",
            "host": "host-bound", "straggler": "straggler", "throttled": "throttled"}
"""Injected bottleneck -> expected verdict. ``throttled`` is the balanced demo with GPU telemetry
from the fake NVML driver (tests/fake_nvml) reporting hw_slowdown on the drafters' GPU."""
LINE = re.compile(r"window (?P<dur>[\d.]+)s \|.*\| verdict (?P<verdict>[a-z-]+)(?: \((?P<evidence>[^)]*)\))?")


def run_one(bottleneck: str, duration_s: float, interval_s: float, workdir: str) -> list[tuple[float, str, str]]:
    """Run one demo; returns (window seconds, verdict, evidence) for every window it logged."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    gpu_args = ["--no-gpu-metrics"]
    if bottleneck == "throttled":
        env.update(_throttled_gpus(Path(workdir)))
        gpu_args = ["--nvml-interval", "0.5", "--gpu-group", "target=0", "--gpu-group", "drafter=1"]
    cmd = [sys.executable, "-m", "sidecar", "demo", "--bottleneck", "none" if bottleneck == "throttled" else bottleneck,
           "--interval", str(interval_s), "--duration", str(duration_s), *gpu_args,
           "--endpoint", f"ipc://{workdir}/{bottleneck}.sock", "--prometheus-addr", f"127.0.0.1:{free_port()}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=duration_s + 60, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"demo --bottleneck {bottleneck} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    matches = [m for m in map(LINE.search, proc.stderr.splitlines()) if m]
    return [(float(m["dur"]), m["verdict"], m["evidence"] or "") for m in matches]


def _throttled_gpus(workdir: Path) -> dict[str, str]:
    """Environment for a daemon whose NVML is the fake driver: 2 GPUs, GPU 1 in hw_slowdown."""
    from tests.fake_nvml.build import build_fake_nvml
    from tests.fake_nvml.control import FakeNvml

    library = build_fake_nvml("full")
    control = FakeNvml(workdir / "nvml-control.txt", library, {"devices": 2})
    control.gpu("*", utilization_gpu=95, clock_reasons=0)
    control.gpu(1, clock_reasons=0x8)
    return {"LD_LIBRARY_PATH": str(library.parent), "FAKE_NVML_CONTROL": str(control.path)}


def scored(windows: list[tuple[float, str, str]], interval_s: float, warmup: int) -> list[tuple[float, str, str]]:
    """The windows that count: after ``warmup`` windows, full-length only."""
    return [w for w in windows[warmup:] if w[0] >= 0.5 * interval_s]


def evaluate(bottlenecks: list[str], duration_s: float, interval_s: float = 1.0, warmup: int = 1,
             serial: bool = False) -> dict[str, list[tuple[float, str, str]]]:
    """Injected bottleneck -> its scored windows."""
    with tempfile.TemporaryDirectory(prefix="dflash-verdict-") as workdir:
        with ThreadPoolExecutor(max_workers=1 if serial else len(bottlenecks)) as pool:
            results = pool.map(lambda b: run_one(b, duration_s, interval_s, workdir), bottlenecks)
            return {b: scored(w, interval_s, warmup) for b, w in zip(bottlenecks, results, strict=True)}


def confusion(results: dict[str, list[tuple[float, str, str]]]) -> dict[str, Counter[str]]:
    return {b: Counter(v for _, v, _ in windows) for b, windows in results.items()}


def accuracy(counts: Counter[str], bottleneck: str) -> float:
    total = sum(counts.values())
    return counts[EXPECTED[bottleneck]] / total if total else 0.0
