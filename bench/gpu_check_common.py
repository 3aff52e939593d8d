"""Shared plumbing of the GPU check's parts: a real daemon process, its CPU from /proc, JSON results.

Nothing here touches CUDA or NVML; the parts (``gpu_check_shim.py``, ``gpu_check_parity.py``,
``gpu_check_nvml.py``) import it, and ``gpu_check.py`` runs them one after the other.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def write_json(path: Path | None, results: dict[str, Any]) -> None:
    """Write one part's results (``None``: nowhere). Non-finite floats become null."""
    if path is not None:
        path.write_text(json.dumps(_finite(results), indent=1) + "\n")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def proc_cpu_s(pid: int) -> float:
    """CPU time of ``pid``, all its threads, the ones that already ended included (user + system,
    seconds), from ``/proc/<pid>/stat``: clock ticks, usually 10 ms, so a reading needs seconds
    of wall time. (Summing the threads' schedstat would be finer but loses the threads that
    ended, such as the daemon's per-scrape HTTP threads.) Raises ``OSError`` if it is gone."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 5.0) -> str:
    """The body of ``url`` as text. Raises ``OSError``."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


class Daemon:
    """A real ``dflash-sidecar run`` process on a fresh ipc endpoint in ``workdir``.

    ``gpu_metrics``: NVML polling every ``nvml_interval_s`` (GPM wherever the GPU supports it,
    the daemon's default) or ``--no-gpu-metrics``; ``extra``: more ``run`` options. The
    environment is this process's, so a fake NVML driver set up through ``LD_LIBRARY_PATH`` and
    ``FAKE_NVML_CONTROL`` reaches it. Raises ``RuntimeError`` when it does not serve /metrics
    within ``start_timeout_s``.
    """

    def __init__(self, workdir: Path, gpu_metrics: bool, nvml_interval_s: float = 1.0,
                 extra: tuple[str, ...] = (), start_timeout_s: float = 30.0) -> None:
        self.endpoint = f"ipc://{workdir}/sidecar.sock"
        self.url = f"http://127.0.0.1:{free_port()}/metrics"
        cmd = [sys.executable, "-m", "sidecar", "run", "--endpoint", self.endpoint,
               "--prometheus-addr", self.url.split("/")[2], "--log-level", "warning",
               *(["--nvml-interval", str(nvml_interval_s)] if gpu_metrics else ["--no-gpu-metrics"]), *extra]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        self.log_path = workdir / f"daemon-{'nvml' if gpu_metrics else 'nogpu'}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT, cwd=workdir)
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                http_get(self.url, timeout=1.0)
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the daemon did not start: {self.log_path.read_text()[-2000:]}") from None
                time.sleep(0.05)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def gpus_up(self) -> int:
        """How many GPUs the daemon's NVML source reports up (``dflash_gpu_up`` = 1); -1 if unreadable."""
        try:
            text = http_get(self.url)
        except OSError:
            return -1
        return sum(1 for line in text.splitlines() if line.startswith("dflash_gpu_up{") and line.endswith(" 1.0"))

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s. Idempotent."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def cpu_share(pid: int, seconds: float) -> float:
    """Share of one core ``pid`` used over ``seconds`` of wall time (0.01 = 1 %)."""
    cpu0, t0 = proc_cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    return (proc_cpu_s(pid) - cpu0) / (time.monotonic() - t0)
