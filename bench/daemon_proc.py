"""Process plumbing for bench/bench_daemon.py: a real daemon process, /proc readings, spawning
the load processes, and reading the daemon's accounting and per-window rates."""

from __future__ import annotations

import gzip
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.append(ROOT)  # after PYTHONPATH: the ``sidecar`` under test stays the one imported

from tests.daemon_harness import free_port  # noqa: E402 - the tests' harness, shared

LOAD = os.path.join(ROOT, "bench", "daemon_load.py")
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
DAEMON_CORE, CLIENT_CORE = 0, 1


def pin(pid: int, core: int) -> str:
    """Pin ``pid`` to ``core`` when the machine has two cores or more; returns what was done."""
    if (os.cpu_count() or 1) < 2:
        return "not pinned (one core)"
    os.sched_setaffinity(pid, {core})
    return f"core {core}"


def proc_cpu_s(pid: int) -> float:
    """utime + stime of every thread of ``pid`` (seconds), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def proc_rss(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in bytes."""
    rss = hwm = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    return rss, hwm


def code_root() -> str:
    """The checkout whose ``sidecar`` this process imports (PYTHONPATH picks it): the daemon and
    the publishers run the same code, so a before/after comparison needs only PYTHONPATH."""
    import sidecar

    return os.path.dirname(os.path.dirname(os.path.abspath(sidecar.__file__)))


def env_with_root() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([code_root(), ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def http_get(url: str, gz: bool = False, timeout: float = 10.0) -> bytes:
    req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"} if gz else {})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body = resp.read()
        if resp.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    return body


class Daemon:
    """A real daemon process, pinned to ``DAEMON_CORE``. ``gpu_env``: with NVML (the daemon's
    default ``--nvml-interval``), these variables added to its environment (the fake driver's);
    None: ``--no-gpu-metrics``."""

    def __init__(self, workdir: str, interval: float, extra: list[str] | None = None,
                 gpu_env: dict[str, str] | None = None) -> None:
        self.endpoint = f"ipc://{workdir}/sidecar.sock"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        cmd = [sys.executable, "-m", "sidecar", "run", *([] if gpu_env is not None else ["--no-gpu-metrics"]),
               "--interval", str(interval), "--endpoint", self.endpoint,
               "--prometheus-addr", f"127.0.0.1:{self.port}", "--log-level", "warning", *(extra or [])]
        self.fake: Any = None
        self.log = open(os.path.join(workdir, "daemon.log"), "w")
        self.proc = subprocess.Popen(cmd, env={**env_with_root(), **(gpu_env or {})}, stdout=self.log,
                                     stderr=subprocess.STDOUT, cwd=workdir)
        self.pinning = pin(self.proc.pid, DAEMON_CORE)
        deadline = time.monotonic() + 20
        while True:
            try:
                http_get(self.url, timeout=1.0)
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"daemon did not start (see {self.log.name})") from None
                time.sleep(0.05)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def metrics(self) -> str:
        return http_get(self.url).decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


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
        acct = accounting(daemon.metrics())
        if acct["accepted"] + sum(acct["dropped"].values()) >= sent or time.monotonic() > deadline:
            return acct
        time.sleep(0.5)


def spawn(role: str, args: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, LOAD, role, *args], env=env_with_root(),
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


def window_rates(log_path: str) -> list[tuple[float, float, float]]:
    """(start, end, records/s) of each window from the daemon's console lines (wall clock)."""
    out = []
    with open(log_path) as f:
        for line in f:
            m = _WINDOW_LINE.match(line)
            if m:
                end = time.mktime(time.strptime(m[1], "%Y-%m-%d %H:%M:%S")) + int(m[2]) / 1000
                out.append((end - float(m[3]), end, float(m[4].replace(",", ""))))
    return out
