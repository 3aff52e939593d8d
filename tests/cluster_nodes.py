"""Simulated nodes of a data-parallel job for the live cluster tests: each node is a real daemon
and a real trainer process publishing through the shim, its step split as its kind says; one real
Prometheus scrapes them with the shipped cluster config (``tests.test_deploy_multinode``)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.deploy_support import env, free_port, spawn_sidecar, stop

TRAINER = """
import json, sys, time
from trainer_shim import telemetry
endpoint, phases = sys.argv[1], json.loads(sys.argv[2])
ch = telemetry.configure(endpoint=endpoint, role="trainer", worker="0", flush_interval_s=0.05)
while True:
    start = time.perf_counter()
    for name, ms in phases.items():
        t = time.perf_counter()
        time.sleep(ms / 1000)
        ch.timing(name, (time.perf_counter() - t) * 1000)
    ch.timing("step_ms", (time.perf_counter() - start) * 1000)
    ch.count("batches")
"""

_HEALTHY = {"data_time_ms": 2, "forward_ms": 10, "backward_ms": 14, "allreduce_ms": 37, "optimizer_step_ms": 3}
KINDS: dict[str, dict[str, float]] = {
    "healthy": _HEALTHY,  # waits ~55 % of its step in the all-reduce
    "compute": {"data_time_ms": 2, "forward_ms": 26, "backward_ms": 34, "allreduce_ms": 2, "optimizer_step_ms": 3},
    "input": {"data_time_ms": 37, "forward_ms": 10, "backward_ms": 14, "allreduce_ms": 2, "optimizer_step_ms": 3},
}
"""Node kind -> ms per phase of its step (the generic preset's names). ``compute``: ~2.5 times
the healthy node's compute and hardly any wait; ``input``: the same step in its data loader."""


@dataclass
class Node:
    """One node: its name (the target's ``node`` label), run label, kind and daemon port; ``nvml``:
    the fake-NVML environment of its daemon (empty: ``--no-gpu-metrics``)."""

    name: str
    run: str
    kind: str
    port: int = field(default_factory=free_port)
    nvml: dict[str, str] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, tmp: Path, logs: list[Path]) -> None:
        """Start (or restart) its daemon and trainer."""
        folder = tmp / self.name
        folder.mkdir(mode=0o700, exist_ok=True)
        endpoint = f"ipc://{folder}/sidecar.sock"
        daemon_log, trainer_log = folder / "daemon.log", folder / "trainer.log"
        logs += [daemon_log, trainer_log]
        gpus = ["--nvml-interval", "0.5"] if self.nvml else ["--no-gpu-metrics"]
        self.procs.append(spawn_sidecar(["run", *gpus, "--interval", "1", "--endpoint", endpoint,
                                         "--prometheus-addr", f"127.0.0.1:{self.port}"], daemon_log,
                                        env(**self.nvml)))
        with open(trainer_log, "ab") as out:
            self.procs.append(subprocess.Popen([sys.executable, "-c", TRAINER, endpoint, json.dumps(KINDS[self.kind])],
                                               stdout=out, stderr=subprocess.STDOUT,
                                               env=env(DFLASH_RUN_LABEL=self.run)))

    def stop(self) -> None:
        stop(self.procs)
        self.procs.clear()


def start_prometheus(tmp: Path, nodes: list[Node], logs: list[Path]) -> tuple[subprocess.Popen[bytes], str]:
    """A real Prometheus with the shipped cluster config and rules at a 1 s scrape and evaluation,
    scraping ``nodes``: the process and its base URL."""
    from tests.deploy_support import require_tool
    from tests.prometheus_harness import prometheus_config

    prometheus = require_tool("prometheus", "prometheus")
    web = free_port()
    logs.append(tmp / "prometheus.log")
    config = prometheus_config(tmp, {n.name: n.port for n in nodes})
    with open(logs[-1], "wb") as out:
        proc = subprocess.Popen([prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{web}", "--log.level=warn"],
                                stdout=out, stderr=subprocess.STDOUT, cwd=tmp)
    return proc, f"http://127.0.0.1:{web}"
