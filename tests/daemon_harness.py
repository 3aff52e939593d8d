"""Real processes for daemon tests: the daemon as a subprocess, shim publishers as subprocesses,
and readers of the daemon's Prometheus endpoint. No mocks: real sockets between real processes.

The one shared harness of the tests (and of the benchmarks that reuse it): the daemon launcher
(``DaemonProc``, ``spawn_sidecar``), free ports and the child's environment, all re-exported from
``tests.launcher`` (which the GPU check imports without pytest); shim publishers (``publish``),
outside tools (``require_tool``) and waits (``wait_for``, on ``tests.waiting.wait_until``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from sidecar.model.handoff import Received
from tests.launcher import ROOT, DaemonProc, Samples, env, free_port, spawn_sidecar
from tests.waiting import wait_until

__all__ = ["ROOT", "DaemonProc", "Samples", "env", "free_port", "spawn_sidecar"]  # the launcher's, re-exported


def verdict(d: DaemonProc) -> str | None:
    """The verdict ``d``'s ``/metrics`` shows (its ``dflash_pipeline_bottleneck`` at 1), None if none."""
    on = [lab["verdict"] for lab, v in d.samples().get("dflash_pipeline_bottleneck", []) if v == 1.0]
    return on[0] if on else None


def explain(d: DaemonProc, *extra: str) -> str:
    """``dflash-sidecar explain`` against ``d``'s ``/metrics``: its output (``extra``: more options)."""
    out = subprocess.run([sys.executable, "-m", "sidecar", "explain", "--prometheus-addr", f"127.0.0.1:{d.port}",
                          *extra], env=env(), capture_output=True, text=True, timeout=30, check=True, cwd=ROOT)
    return out.stdout


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


PUBLISHER = textwrap.dedent("""
    import json, math, sys, time
    from trainer_shim import telemetry
    spec = json.loads(sys.argv[1])
    ch = telemetry.configure(endpoint=spec["endpoint"], role=spec["role"], worker=spec["worker"],
                             flush_interval_s=0.02)
    calls = 0
    deadline = time.monotonic() + 15
    while ch.records_total == 0 and time.monotonic() < deadline:  # until a record reached a running daemon
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
    """A receiver without a socket, for an ``IngestLoop`` fed frames in process (``handle_frame``):
    what ``sources.receiver.Receiver`` has, with no endpoint and never a frame."""

    def __init__(self) -> None:
        self.endpoints: list[str] = []
        self.backlog = False

    def poll(self, timeout_ms: int) -> list[tuple[bytes, int | None]]:
        return []

    def charge(self, peer: int | None, cpu_s: float, nbytes: int) -> None:
        pass

    def received(self) -> Received:
        return Received()

    def close(self) -> None:
        pass

    def remove_files(self) -> None:
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
