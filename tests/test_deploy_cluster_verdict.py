"""The cluster's verdict, live: four nodes (a daemon and a trainer process each, as
tests/test_deploy_multinode.py runs them), one real Prometheus with the shipped cluster config and
rules at a 1 s scrape and evaluation. The trainers of n0-n2 wait ~55 % of each step in their
all-reduce; n3 computes ~2.5 times as long and hardly waits (its own verdict: balanced). The rules
must name n3, with its cause (compute-bound), soon after the nodes' first full windows, never a
healthy node, and ``dflash-sidecar cluster`` must print the same."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.deploy_support import env, free_port, require_tool, spawn_sidecar, stop
from tests.test_deploy_multinode import prometheus_config, query, wait_for

TRAINER = """
import sys, time
from trainer_shim import telemetry
endpoint, slow = sys.argv[1], sys.argv[2] == "slow"
ch = telemetry.configure(endpoint=endpoint, role="trainer", worker="0", flush_interval_s=0.05)
phases = ({"data_time_ms": 2, "forward_ms": 26, "backward_ms": 34, "allreduce_ms": 2, "optimizer_step_ms": 3}
          if slow else {"data_time_ms": 2, "forward_ms": 10, "backward_ms": 14, "allreduce_ms": 37,
                        "optimizer_step_ms": 3})
while True:
    start = time.perf_counter()
    for name, ms in phases.items():
        t = time.perf_counter()
        time.sleep(ms / 1000)
        ch.timing(name, (time.perf_counter() - t) * 1000)
    ch.timing("step_ms", (time.perf_counter() - start) * 1000)
    ch.count("batches")
"""
NODES = ("n0", "n1", "n2", "n3")
SLOW = "n3"
RUN = "job44"
NAMED = "run_host_cause:dflash_node_straggler:excess_seconds"


def test_four_nodes_one_slow_by_compute_is_named_with_its_cause(tmp_path: Path) -> None:
    prometheus = require_tool("prometheus", "prometheus")
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    ports = {node: free_port() for node in NODES}
    trainer_env = env() | {"DFLASH_RUN_LABEL": RUN}
    try:
        web = free_port()
        logs.append(tmp_path / "prometheus.log")
        with open(logs[-1], "wb") as out:
            procs.append(subprocess.Popen(
                [prometheus, f"--config.file={prometheus_config(tmp_path, ports)}",
                 f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{web}",
                 "--log.level=warn"], stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path))
        base = f"http://127.0.0.1:{web}"
        cli = [sys.executable, "-m", "sidecar", "cluster", "--prometheus", base]
        wait_for("Prometheus up", lambda: query(base, "vector(1)"), 60, logs)
        empty = subprocess.run(cli, capture_output=True, text=True, env=env(), timeout=60, check=False)
        assert empty.returncode == 1 and "no run: no node reports dflash_node_* series" in empty.stderr, empty.stderr

        for node in NODES:
            (tmp_path / node).mkdir(mode=0o700)
            endpoint = f"ipc://{tmp_path}/{node}/sidecar.sock"
            logs += [tmp_path / f"{node}-daemon.log", tmp_path / f"{node}-trainer.log"]
            procs.append(spawn_sidecar(["run", "--no-gpu-metrics", "--interval", "1", "--endpoint", endpoint,
                                        "--prometheus-addr", f"127.0.0.1:{ports[node]}"], logs[-2]))
            with open(logs[-1], "wb") as out:
                procs.append(subprocess.Popen([sys.executable, "-c", TRAINER, endpoint,
                                               "slow" if node == SLOW else "healthy"],
                                              stdout=out, stderr=subprocess.STDOUT, env=trainer_env))

        wait_for("every node's figures", lambda: len(query(base, "run:dflash_node_hosts:count == 4")) == 1, 60, logs)
        full = time.monotonic()
        named: list[dict[str, str]] = []

        def slow_named() -> bool:
            result = query(base, NAMED)
            named.extend(r["metric"] for r in result)
            return any(r["metric"]["host"] == SLOW for r in result)

        wait_for("n3 named", slow_named, 45, logs)
        latency = time.monotonic() - full
        deadline = time.monotonic() + 5  # keep watching: no healthy node is ever named
        while time.monotonic() < deadline:
            named.extend(r["metric"] for r in query(base, NAMED))
            time.sleep(0.5)
        assert {(m["host"], m["cause"], m["run"]) for m in named} == {(SLOW, "compute-bound", RUN)}, named
        print(f"n3 named {latency:.1f} s after all four nodes' first figures")

        text = subprocess.run(cli, capture_output=True, text=True, env=env(), timeout=60, check=False)
        assert text.returncode == 0, text.stderr
        assert f"run {RUN}: 4 nodes" in text.stdout and "n3 holds the others back: compute-bound" in text.stdout, \
            text.stdout
        table = text.stdout.split("verdict\n", 1)[1].splitlines()
        assert table[0].startswith("n3 ") and len(table) == 4, text.stdout  # slowest first
        data = json.loads(subprocess.run(cli + ["--run", RUN, "--json"], capture_output=True, text=True, env=env(),
                                         timeout=60, check=True).stdout)
        assert [(n["host"], n["cause"]) for n in data["named"]] == [(SLOW, "compute-bound")]
        assert data["median_comm"] > 0.3 and {n["host"] for n in data["nodes"]} == set(NODES)
        wrong = subprocess.run(cli + ["--run", "other"], capture_output=True, text=True, env=env(), timeout=60)
        assert wrong.returncode == 1 and "no run 'other' reports now; runs: job44 (4 nodes)" in wrong.stderr
        daemon = subprocess.run(cli[:-1] + [f"http://127.0.0.1:{ports['n0']}"], capture_output=True, text=True,
                                env=env(), timeout=60)  # a daemon's address, not Prometheus's
        assert daemon.returncode == 1 and "not a daemon's /metrics" in daemon.stderr, daemon.stderr
    finally:
        stop(procs)
