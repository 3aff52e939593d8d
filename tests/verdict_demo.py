"""Drive ``dflash-sidecar demo`` in each verdict scenario and score its console verdicts (a
support module: ``tests/test_insight_demo.py`` and ``tests/test_naming_verdicts.py`` run the short
form, ``bench/bench_verdict.py`` the long one with its confusion matrix).

Scenarios (``SCENARIOS``): the DFlash demo with per-worker channels (``none`` ... ``throttled``);
the same pipeline published seed-style, one profile dict per interval from a monitor thread
(``seed-*``); a plain single-role training loop publishing every occurrence (``loop-*``) or
per-batch-mean snapshots (``snap-*``). ``throttled``, ``loop-throttled`` and ``loop-compute`` run
the daemon on the fake NVML driver (tests/fake_nvml); every other scenario has NVML off."""

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

_DFLASH = {"none": "balanced", "target": "target-bound", "drafter": "drafter-bound", "queue": "queue-starved",
           "input": "input-bound", "straggler": "straggler"}
_LOOP = {"none": "balanced", "input": "input-bound", "host": "host-bound", "comm": "communication-bound",
         "straggler": "straggler"}
SCENARIOS: dict[str, tuple[list[str], str, str]] = {
    **{b: (["--bottleneck", b], v, "") for b, v in _DFLASH.items()},
    "throttled": (["--bottleneck", "none"], "throttled", "dflash-throttled"),
    **{f"seed-{b}": (["--style", "seed", "--bottleneck", b], v, "") for b, v in _DFLASH.items() if b != "straggler"},
    **{f"loop-{b}": (["--style", "generic", "--bottleneck", b], v, "") for b, v in _LOOP.items()},
    "loop-compute": (["--style", "generic", "--bottleneck", "none"], "compute-bound", "loop-busy"),
    "loop-throttled": (["--style", "generic", "--bottleneck", "none"], "throttled", "loop-throttled"),
    "loop-ddp-busy": (["--style", "generic", "--bottleneck", "comm"], "communication-bound", "loop-spin"),
    "loop-ddp-gpm": (["--style", "generic", "--bottleneck", "comm"], "communication-bound", "loop-spin-gpm"),
    **{f"snap-{b}": (["--style", "generic", "--form", "snapshot", "--profile-interval", "0.5", "--bottleneck", b],
                     v, "") for b, v in _LOOP.items()},
}
"""Scenario -> (demo arguments, expected verdict, fake-NVML set-up or ""). The DFlash bottleneck
``input`` (targets wait on the data loader; ``host`` until 0.3) is ``input-bound``: one word, one
meaning. ``throttled``: the balanced demo with the fake driver reporting hw_slowdown on the
drafters' GPU; ``loop-compute``: the balanced loop on a GPU whose GPM SM activity reads 97 %;
``loop-throttled``: on a GPU at 60 % in hw_slowdown; ``loop-ddp-busy``: the loop waiting ~half its
step in its all-reduce on GPUs NVML reads 96 % busy (collectives spin), without GPM;
``loop-ddp-gpm``: the same with GPM SM activity at 15 % beside it. The seed-style dict is per-batch means over
all workers, so it carries no per-worker balance: there is no ``seed-straggler``."""
EXPECTED = {name: expected for name, (_, expected, _) in SCENARIOS.items()}
DFLASH_SCENARIOS = [*_DFLASH, "throttled"]
"""The scenarios of the original benchmark (``tests/test_insight_demo.py``)."""
LINE = re.compile(r"window (?P<dur>[\d.]+)s \|.*\| verdict (?P<verdict>[a-z-]+)(?: \((?P<evidence>[^)]*)\))?"
                  r"(?: confidence (?P<confidence>[\d.]+))?")


def run_one(scenario: str, duration_s: float, interval_s: float, workdir: str) -> list[tuple[float, str, str]]:
    """Run one demo; returns (window seconds, verdict, evidence) for every window it logged."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    demo_args, _, gpu_setup = SCENARIOS[scenario]
    gpu_args = ["--no-gpu-metrics"]
    if gpu_setup:
        env.update(_fake_gpus(Path(workdir) / scenario, gpu_setup))
        gpu_args = ["--nvml-interval", "0.5"] + (["--gpu-group", "target=0", "--gpu-group", "drafter=1"]
                                                 if gpu_setup.startswith("dflash") else ["--gpu-group", "trainer=0,1"])
    cmd = [sys.executable, "-m", "sidecar", "demo", *demo_args,
           "--interval", str(interval_s), "--duration", str(duration_s), *gpu_args,
           "--endpoint", f"ipc://{workdir}/{scenario}.sock", "--prometheus-addr", f"127.0.0.1:{free_port()}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=duration_s + 60, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"demo scenario {scenario} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    matches = [m for m in map(LINE.search, proc.stderr.splitlines()) if m]
    return [(float(m["dur"]), m["verdict"], m["evidence"] or "") for m in matches]


def _fake_gpus(workdir: Path, setup: str) -> dict[str, str]:
    """Environment for a daemon whose NVML is the fake driver, 2 GPUs: ``dflash-throttled``: GPU 1
    in hw_slowdown; ``loop-busy``: GPM SM activity 97 %; ``loop-throttled``: 60 % and hw_slowdown;
    ``loop-spin``: utilization 96 %, no GPM; ``loop-spin-gpm``: utilization 96 %, SM activity 15 %."""
    from tests.fake_nvml.build import build_fake_nvml
    from tests.fake_nvml.control import FakeNvml

    workdir.mkdir(parents=True, exist_ok=True)
    library = build_fake_nvml("full")
    control = FakeNvml(workdir / "nvml-control.txt", library, {"devices": 2})
    if setup == "dflash-throttled":
        control.gpu("*", utilization_gpu=95, clock_reasons=0)
        control.gpu(1, clock_reasons=0x8)
    elif setup == "loop-busy":
        control.gpu("*", utilization_gpu=100, gpm_supported=1, gpm_sm_util=97, clock_reasons=0)
    elif setup == "loop-spin":
        control.gpu("*", utilization_gpu=96, gpm_supported=0, clock_reasons=0)
    elif setup == "loop-spin-gpm":
        control.gpu("*", utilization_gpu=96, gpm_supported=1, gpm_sm_util=15, clock_reasons=0)
    else:
        control.gpu("*", utilization_gpu=60, clock_reasons=0x8)
    return {"LD_LIBRARY_PATH": str(library.parent), "FAKE_NVML_CONTROL": str(control.path)}


def scored(windows: list[tuple[float, str, str]], interval_s: float, warmup: int) -> list[tuple[float, str, str]]:
    """The windows that count: after ``warmup`` windows, full-length only, never the last one (the
    partial window flushed at shutdown: its console line rounds its length, so 0.46 s reads 0.5)."""
    return [w for w in windows[warmup:-1] if w[0] >= 0.5 * interval_s]


def evaluate(bottlenecks: list[str], duration_s: float, interval_s: float = 1.0, warmup: int = 1,
             serial: bool = False, parallel: int | None = None) -> dict[str, list[tuple[float, str, str]]]:
    """Scenario -> its scored windows; ``parallel`` scenarios at a time (default: all)."""
    with tempfile.TemporaryDirectory(prefix="dflash-verdict-") as workdir:
        with ThreadPoolExecutor(max_workers=1 if serial else parallel or len(bottlenecks)) as pool:
            results = pool.map(lambda b: run_one(b, duration_s, interval_s, workdir), bottlenecks)
            return {b: scored(w, interval_s, warmup) for b, w in zip(bottlenecks, results, strict=True)}


def confusion(results: dict[str, list[tuple[float, str, str]]]) -> dict[str, Counter[str]]:
    return {b: Counter(v for _, v, _ in windows) for b, windows in results.items()}


def accuracy(counts: Counter[str], bottleneck: str) -> float:
    total = sum(counts.values())
    return counts[EXPECTED[bottleneck]] / total if total else 0.0
