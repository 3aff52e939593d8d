"""The one daemon launcher of the tests and the benchmarks, and the readers they share: a free
port, the environment a child needs to run this checkout, an HTTP GET, and a process's CPU time
and memory from ``/proc``.

Standard library only at import (no pytest, no prometheus_client until ``DaemonProc.samples``):
the GPU check (``bench/gpu_check_*.py``) imports it on a GPU box that has only the repository and
the daemon's dependencies. ``tests.daemon_harness`` re-exports it for the tests."""

from __future__ import annotations

import gzip
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""The checkout these helpers belong to."""

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
"""One clock tick of ``/proc/<pid>/stat`` (seconds; usually 10 ms)."""

Samples = dict[str, list[tuple[dict[str, str], float]]]
"""Samples of one scrape: {sample name: [(labels, value), ...]}."""


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port on 127.0.0.1 free right now (TCP, or UDP with ``socket.SOCK_DGRAM``)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def code_root() -> Path:
    """The checkout whose ``sidecar`` this process imports (``PYTHONPATH`` picks it), so that the
    daemon a test or a benchmark starts runs the same code as the process that started it."""
    import sidecar

    return Path(sidecar.__file__).resolve().parent.parent


def env(**extra: str) -> dict[str, str]:
    """This process's environment for a child that runs this checkout's code: ``PYTHONPATH``
    starts with ``code_root()`` and ``ROOT``, output unbuffered, the shim's endpoint variable
    (``DFLASH_SIDECAR_ENDPOINT``) removed, then ``extra`` set."""
    e = dict(os.environ)
    e.pop("DFLASH_SIDECAR_ENDPOINT", None)
    paths = list(dict.fromkeys([str(code_root()), str(ROOT)]))
    e["PYTHONPATH"] = os.pathsep.join(paths + ([e["PYTHONPATH"]] if e.get("PYTHONPATH") else []))
    e["PYTHONUNBUFFERED"] = "1"
    e.update(extra)
    return e


def http_get(url: str, timeout_s: float = 5.0, gz: bool = False) -> str:
    """The body of ``url`` as text (a gzip-encoded answer decompressed; ``gz``: ask for one).
    Raises ``OSError`` (``urllib.error.URLError`` and ``HTTPError`` are ``OSError``s) when it does
    not answer, or answers with an error status, within ``timeout_s`` seconds."""
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"} if gz else {})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - a test's own URL
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    return body.decode()


def cpu_seconds(pid: int) -> float:
    """CPU time of ``pid``, user + system, all its threads including those that already ended
    (seconds), from ``/proc/<pid>/stat``: clock ticks (``TICK_S``), so a share of a core needs
    seconds of wall time. Raises ``OSError`` when the process is gone."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def memory_bytes(pid: int) -> tuple[int, int]:
    """(resident set size now, its high-water mark) of ``pid`` in bytes (``VmRSS``, ``VmHWM`` of
    ``/proc/<pid>/status``; (0, 0) for a zombie). Raises ``OSError`` when the process is gone."""
    rss = hwm = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    return rss, hwm


def spawn_sidecar(args: list[str], log_path: Path, environ: dict[str, str] | None = None,
                  nofile: int | None = None) -> subprocess.Popen[bytes]:
    """``python -m sidecar ARGS`` from this checkout in ``log_path``'s folder, stdout and stderr to
    ``log_path``. ``environ``: the whole environment (default ``env()``). ``nofile``: the open-file
    limit it runs under (soft and hard). The run ledger's default state folder is moved into
    ``log_path``'s folder unless ``environ`` names one: a test never writes the user's state."""
    environ = dict(environ if environ is not None else env())
    environ.setdefault("XDG_STATE_HOME", str(log_path.parent / "xdg-state"))

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    with open(log_path, "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "sidecar", *args], stdout=log, stderr=subprocess.STDOUT,
                                env=environ, cwd=log_path.parent,
                                preexec_fn=limit if nofile is not None else None)


class DaemonProc:
    """``python -m sidecar run`` in a subprocess, its output captured to ``log_path``.

    ``args``: more ``run`` options. ``endpoint``: the ipc or tcp endpoint (default an ipc socket in
    ``tmp``; ``False``: no ``--endpoint``). ``port``: the Prometheus port on 127.0.0.1 (default a
    free one). ``interval``: ``--interval`` seconds (None: the daemon's default). ``gpu``: NVML on
    (the fake driver is reached through ``extra_env``); else ``--no-gpu-metrics``. The run
    ledger's state goes to ``tmp/state`` unless ``args`` names ``--state-dir``. ``nofile``: the
    open-file limit it runs under. ``wait``: return once ``/metrics`` answers (``wait_ready``)."""

    def __init__(self, tmp: Path, *args: str, endpoint: str | bool | None = None, port: int | None = None,
                 interval: float | None = 0.5, extra_env: dict[str, str] | None = None, wait: bool = True,
                 gpu: bool = False, nofile: int | None = None) -> None:
        tmp = Path(tmp)
        self.port = port or free_port()
        self.endpoint = endpoint if isinstance(endpoint, str) else f"ipc://{tmp}/sidecar.sock"
        self.log_path = tmp / f"daemon-{self.port}.log"
        cmd = ["run", "--prometheus-addr", f"127.0.0.1:{self.port}", *args]
        if not gpu:
            cmd.append("--no-gpu-metrics")
        if interval is not None:
            cmd += ["--interval", str(interval)]
        if endpoint is not False:
            cmd += ["--endpoint", self.endpoint]
        if "--state-dir" not in args:  # the run ledger's file stays in the test's folder
            cmd += ["--state-dir", str(tmp / "state")]
        self.proc = spawn_sidecar(cmd, self.log_path, env(**(extra_env or {})), nofile=nofile)
        if wait:
            self.wait_ready()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        """Return once ``/metrics`` answers. Raises ``AssertionError`` (with the log) when the
        daemon exits first, or does not answer within ``timeout_s`` (it is then killed)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            try:
                self.text(timeout_s=1.0)
                return
            except OSError:
                time.sleep(0.05)
        self.proc.kill()
        self.proc.wait()
        raise AssertionError(f"daemon not ready after {timeout_s}s:\n{self.log()}")

    def text(self, timeout_s: float = 5.0) -> str:
        """One scrape of ``/metrics``. Raises ``OSError`` when it does not answer."""
        return http_get(self.url, timeout_s)

    def samples(self) -> Samples:
        from prometheus_client.parser import text_string_to_metric_families

        out: Samples = defaultdict(list)
        for family in text_string_to_metric_families(self.text()):
            for s in family.samples:
                out[s.name].append((s.labels, s.value))
        return out

    def value(self, name: str, **labels: str) -> float | None:
        """Sum of the samples of ``name`` whose labels include ``labels`` (None if none)."""
        found = [v for lab, v in self.samples().get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
        return sum(found) if found else None

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> float:
        """Signal the daemon and wait; returns seconds it took to exit. Idempotent. Raises
        ``AssertionError`` (after killing it) when it does not exit within ``timeout_s``."""
        start = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"daemon did not exit within {timeout_s}s:\n{self.log()}") from None
        return time.monotonic() - start
