"""Real processes for daemon tests: the daemon as a subprocess, shim publishers as subprocesses,
and readers of the daemon's Prometheus endpoint. No mocks: real sockets between real processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent

Samples = dict[str, list[tuple[dict[str, str], float]]]


def require_tool(name: str) -> str:
    """Path of an outside tool; skips the test on a developer box, fails it in CI."""
    path = shutil.which(name)
    if path:
        return path
    if os.environ.get("CI") == "true":
        pytest.fail(f"{name} is required in CI (installed by .ci/run) but was not found")
    package = "prometheus" if name in ("prometheus", "promtool") else name
    pytest.skip(f"{name} not installed (apt-get install {package})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e["PYTHONUNBUFFERED"] = "1"
    e.update(extra)
    return e


class DaemonProc:
    """``python -m sidecar`` in a subprocess, stderr captured to a file."""

    def __init__(self, tmp: Path, *args: str, endpoint: str | None = None, port: int | None = None,
                 interval: float | None = 0.5, extra_env: dict[str, str] | None = None, wait: bool = True,
                 gpu: bool = False) -> None:
        self.port = port or free_port()
        self.endpoint = endpoint or f"ipc://{tmp}/sidecar.sock"
        self.log_path = tmp / f"daemon-{self.port}.log"
        cmd = [sys.executable, "-m", "sidecar", "run", "--prometheus-addr", f"127.0.0.1:{self.port}", *args]
        if not gpu:
            cmd.append("--no-gpu-metrics")
        if interval is not None:
            cmd += ["--interval", str(interval)]
        if endpoint is not False:
            cmd += ["--endpoint", self.endpoint]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env(**(extra_env or {})),
                                     cwd=tmp)
        if wait:
            self.wait_ready()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            try:
                self.text()
                return
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"daemon not ready after {timeout_s}s:\n{self.log()}")

    def text(self) -> str:
        with urllib.request.urlopen(self.url, timeout=5) as resp:
            return resp.read().decode()

    def samples(self) -> Samples:
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
        """Signal the daemon and wait; returns seconds it took to exit."""
        start = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"daemon did not exit within {timeout_s}s:\n{self.log()}") from None
        self._log.close()
        return time.monotonic() - start


PUBLISHER = textwrap.dedent("""
    import json, math, sys, time
    from trainer_shim import telemetry
    spec = json.loads(sys.argv[1])
    ch = telemetry.configure(endpoint=spec["endpoint"], role=spec["role"], worker=spec["worker"],
                             flush_interval_s=0.02)
    calls = 0
    deadline = time.monotonic() + 15
    while ch.records_total == 0 and time.monotonic() < deadline:  # until a record reached a live daemon
        ch.gauge("warmup", 1.0); calls += 1
        telemetry.flush(wait_s=1.0)
    for i in range(spec["n"]):
        ch.count("tokens", 10); ch.timing("forward_ms", 1.0 + i % 5); ch.gauge("queue_depth", i % 8)
        ch.category("bucket", i % 3)
        calls += 4
        if i % 100 == 0:
            ch.publish(i, {"loss_token_fraction": 0.5, "step_ms": 2.0})
            calls += 1
    for bad in spec.get("bad", []):
        getattr(ch, bad[0])(*bad[1:]); calls += 1
    telemetry.flush(); time.sleep(0.3)
    st = telemetry.stats()[(spec["role"], spec["worker"])]
    telemetry.close()
    print(json.dumps({"calls": calls, "records_total": st["records_total"], "dropped": st["dropped"]}))
""")


def publish(endpoint: str, role: str, worker: str, n: int, bad: list[list[object]] | None = None,
            timeout_s: float = 60.0) -> dict[str, object]:
    """Run a shim publisher in a subprocess; returns its own accounting (calls, records_total, dropped)."""
    spec = json.dumps({"endpoint": endpoint, "role": role, "worker": worker, "n": n, "bad": bad or []})
    out = subprocess.run([sys.executable, "-c", PUBLISHER, spec], capture_output=True, text=True,
                         env=env(), timeout=timeout_s, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def wait_for(predicate, timeout_s: float = 15.0, interval_s: float = 0.2, what: str = "condition"):
    """``tests.waiting.wait_until`` with this module's defaults."""
    return wait_until(predicate, timeout_s, interval_s, what)
