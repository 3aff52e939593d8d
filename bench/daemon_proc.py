"""Process plumbing for bench/bench_daemon.py: a real daemon process, /proc readings, spawning
the load processes, and reading the daemon's accounting and per-window rates."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.append(ROOT)  # after PYTHONPATH: the ``sidecar`` under test stays the one imported

from tests.launcher import DaemonProc, code_root, cpu_seconds, env, memory_bytes  # noqa: E402 - the one launcher

__all__ = ["code_root", "cpu_seconds", "memory_bytes"]  # the launcher's, re-exported for bench_daemon.py

LOAD = os.path.join(ROOT, "bench", "daemon_load.py")
DAEMON_CORE, CLIENT_CORE = 0, 1


def pin(pid: int, core: int) -> str:
    """Pin ``pid`` to ``core`` when the machine has two cores or more; returns what was done."""
    if (os.cpu_count() or 1) < 2:
        return "not pinned (one core)"
    os.sched_setaffinity(pid, {core})
    return f"core {core}"


class Daemon(DaemonProc):
    """The launcher's daemon, pinned to ``DAEMON_CORE`` before it serves, logging warnings only.
    ``gpu_env``: with NVML (the daemon's default ``--nvml-interval``), these variables added to
    its environment (the fake driver's); None: ``--no-gpu-metrics``."""

    def __init__(self, workdir: str, interval: float, extra: list[str] | None = None,
                 gpu_env: dict[str, str] | None = None) -> None:
        super().__init__(Path(workdir), "--log-level", "warning", *(extra or []), interval=interval,
                         gpu=gpu_env is not None, extra_env=gpu_env, wait=False)
        self.fake: Any = None
        self.pinning = pin(self.pid, DAEMON_CORE)
        self.wait_ready()


@contextmanager
def running_daemon(interval: float, extra: list[str] | None = None,
                   fake_gpus: int = 0) -> Iterator[Daemon]:
    """A daemon in a fresh directory. ``fake_gpus`` > 0: with NVML on that many GPUs of the fake
    driver (tests/fake_nvml), scripted through ``daemon.fake`` (a ``FakeNvml``; else None)."""
    workdir = tempfile.mkdtemp(prefix="dbench-")
    fake = fake_nvml(workdir, fake_gpus) if fake_gpus else None
    gpu_env = None if fake is None else {"LD_LIBRARY_PATH": str(fake.library.parent),
                                         "FAKE_NVML_CONTROL": str(fake.path)}
    daemon = Daemon(workdir, interval, extra, gpu_env)
    daemon.fake = fake
    try:
        yield daemon
    finally:
        daemon.stop()
        shutil.rmtree(workdir, ignore_errors=True)


GIB = 2**30


def fake_nvml(workdir: str, gpus: int) -> Any:
    """The fake NVML driver (built from tests/fake_nvml, cached) with a control file in
    ``workdir``: ``gpus`` busy H100-like GPUs, GPM supported, values a training run shows."""
    from tests.fake_nvml import FakeNvml, build_fake_nvml

    fake = FakeNvml(os.path.join(workdir, "nvml-control.txt"), build_fake_nvml("full"), {"devices": gpus})
    fake.gpu("*", utilization_memory=48, memory_total=80 * GIB, temperature_memory=74, clock_sm_mhz=1755,
             clock_mem_mhz=2619, clock_reasons=0, power_limit_mw=700_000, pcie_tx_bytes_per_s=3_000_000_000,
             pcie_rx_bytes_per_s=5_000_000_000, gpm_supported=1, gpm_sm_util=85, gpm_sm_occupancy=42,
             gpm_any_tensor_util=55, gpm_dram_bw_util=60, gpm_pcie_tx_mib_per_s=2900, gpm_pcie_rx_mib_per_s=4800,
             gpm_nvlink_tx_mib_per_s=38_000, gpm_nvlink_rx_mib_per_s=38_000)
    for i in range(gpus):
        fake.gpu(i, utilization_gpu=88 + i % 8, memory_used=70 * GIB + i * 2**28, temperature_gpu=62 + i % 5,
                 power_mw=540_000 + 5_000 * i)
    return fake


def train_on_every_gpu(fake: Any, gpus: int, pid: int) -> None:
    """Make process ``pid`` the one compute process on every GPU (about 70 GiB each), so the
    daemon's per-process memory queries run and match its hello."""
    fake.set({f"gpu.{i}.processes": {pid: 70 * GIB + i * 2**28} for i in range(gpus)})


def sample_values(text: str, name: str) -> list[float]:
    """Values of every sample of ``name`` (any labels) in an exposition."""
    return [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(name + "{") or line.startswith(name + " ")]


def accounting(text: str) -> dict[str, Any]:
    """Accepted and dropped-by-reason totals (all roles/workers) from an exposition."""
    accepted = 0.0
    dropped: dict[str, float] = {}
    messages: dict[str, float] = {}
    series = 0.0
    for line in text.splitlines():
        if line.startswith("dflash_sidecar_records_accepted_total{"):
            accepted += float(line.rsplit(" ", 1)[1])
        elif line.startswith("dflash_sidecar_records_dropped_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            dropped[reason] = dropped.get(reason, 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith("dflash_sidecar_messages_dropped_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            messages[reason] = messages.get(reason, 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith("dflash_sidecar_series{"):
            series = float(line.rsplit(" ", 1)[1])
    return {"accepted": int(accepted), "dropped": {k: int(v) for k, v in dropped.items()},
            "messages_dropped": {k: int(v) for k, v in messages.items()}, "series": int(series)}


def wait_accounted(daemon: Daemon, sent: int, timeout_s: float) -> dict[str, Any]:
    """Poll /metrics until accepted + dropped == sent (or the timeout); returns the last figures."""
    deadline = time.monotonic() + timeout_s
    while True:
        acct = accounting(daemon.text())
        if acct["accepted"] + sum(acct["dropped"].values()) >= sent or time.monotonic() > deadline:
            return acct
        time.sleep(0.5)


def spawn(role: str, args: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, LOAD, role, *args], env=env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    pin(proc.pid, CLIENT_CORE)
    return proc


def read_json_line(proc: subprocess.Popen[str], timeout_s: float = 60.0) -> dict[str, Any]:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    line = proc.stdout.readline() if ready else ""
    if not line:
        raise RuntimeError(f"{proc.args[2]} process gave no answer (rc {proc.poll()})")
    return json.loads(line)


def pctl(values: list[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0..100) of ``values``."""
    s = sorted(values)
    return s[max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))]


_WINDOW_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) "
                          r".*window ([\d.]+)s \| \d+ senders \| ([\d,]+) rec/s")


def window_rates(log_path: str | Path) -> list[tuple[float, float, float]]:
    """(start, end, records/s) of each window from the daemon's console lines (wall clock)."""
    out = []
    with open(log_path) as f:
        for line in f:
            m = _WINDOW_LINE.match(line)
            if m:
                end = time.mktime(time.strptime(m[1], "%Y-%m-%d %H:%M:%S")) + int(m[2]) / 1000
                out.append((end - float(m[3]), end, float(m[4].replace(",", ""))))
    return out
