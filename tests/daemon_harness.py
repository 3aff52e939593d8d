"""Real processes for daemon tests: the daemon as a subprocess, shim publishers as subprocesses,
and readers of the daemon's Prometheus endpoint. No mocks: real sockets between real processes.

The one shared harness of the tests (and of the benchmarks that reuse it): free ports
(``free_port``), the daemon launcher (``spawn_sidecar``, and ``DaemonProc`` on top of it), outside
tools (``require_tool``) and waits (``wait_for``, on ``tests.waiting.wait_until``)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.sources.receiver import ReceiverStats
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent

Samples = dict[str, list[tuple[dict[str, str], float]]]


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def require_tool(name: str, package: str | None = None) -> str:
    """Path of an outside tool; skips the test on a developer box (naming the Debian package to
    install: ``package``, by default the tool's), fails it under ``CI=true``."""
    path = shutil.which(name)
    if path:
        return path
    package = package or ("prometheus" if name in ("prometheus", "promtool") else name)
    message = f"{name} is not installed (Debian package: {package})"
    if in_ci():
        pytest.fail(f"{message}; CI must install it (.ci/run)")
    pytest.skip(message)


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port on 127.0.0.1 free right now (TCP, or UDP with ``socket.SOCK_DGRAM``)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e["PYTHONUNBUFFERED"] = "1"
    e.update(extra)
    return e


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
    """``python -m sidecar`` in a subprocess, stderr captured to a file."""

    def __init__(self, tmp: Path, *args: str, endpoint: str | None = None, port: int | None = None,
                 interval: float | None = 0.5, extra_env: dict[str, str] | None = None, wait: bool = True,
                 gpu: bool = False, nofile: int | None = None) -> None:
        """``nofile``: run the daemon with this open-file limit, soft and hard."""
        self.port = port or free_port()
        self.endpoint = endpoint or f"ipc://{tmp}/sidecar.sock"
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


class NoSocket:
    """A receiver without a socket, for an ``IngestLoop`` fed frames in process (``handle_frame``)."""

    stats = ReceiverStats()

    def poll(self, timeout_ms: int) -> list[bytes]:
        return []

    def close(self) -> None:
        pass


def self_signed_cert(tmp: Path) -> tuple[Path, Path]:
    """A throw-away EC certificate and key for 127.0.0.1 in ``tmp`` (needs openssl): (cert, key)."""
    openssl = require_tool("openssl")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=dflash-sidecar test",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    return cert, key


@contextmanager
def raw_publisher(endpoint: str) -> Iterator[Any]:
    """An XPUB socket in this process connected to a daemon at ``endpoint``, yielded once the
    daemon's subscription arrived, for hand-built frames; closed (linger 0) on exit."""
    import zmq

    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.connect(endpoint)
    try:
        wait_for(lambda: pub.poll(100) and pub.recv(), what="the daemon to subscribe")
        yield pub
    finally:
        pub.close(0)
        ctx.term()
