"""Many nodes: two daemons on one machine, each fed by its own trainer shim in another process,
scraped by ONE real Prometheus running the shipped cluster config and rules; the cluster-level
series are read back through Prometheus's HTTP API with their exact labels.

Both daemons label their series with this machine's hostname, so the targets carry a `node`
label (file_sd, as in deploy/prometheus/targets/nodes.yml.example) that the shipped scrape config
writes into `host`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.deploy_support import env, free_port, http_get, require_tool, spawn_sidecar, stop
from tests.prometheus_harness import prometheus_config, query, wait_for

PUBLISHER = """
import sys, time
from trainer_shim import telemetry
endpoint, pairs = sys.argv[1], [p.split("/") for p in sys.argv[2:]]
channels = [telemetry.configure(endpoint=endpoint, role=pairs[0][0], worker=pairs[0][1], flush_interval_s=0.05)]
channels += [telemetry.channel(role=role, worker=worker) for role, worker in pairs[1:]]
while True:
    for ch in channels:
        ch.count("batches")
        ch.timing("forward_ms", 5.0)
    time.sleep(0.01)
"""

NODES = {"node-a": ["drafter/0"], "node-b": ["target/0", "drafter/1"]}
"""Each simulated node: its trainer's role/worker pairs."""


def start_publisher(endpoint: str, pairs: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-c", PUBLISHER, endpoint, *pairs], stdout=out,
                                stderr=subprocess.STDOUT, env=env())


def label_sets(result: list[dict]) -> list[dict[str, str]]:
    return sorted((r["metric"] for r in result), key=lambda m: sorted(m.items()))


def test_two_daemons_one_prometheus(tmp_path: Path) -> None:
    prometheus = require_tool("prometheus", "prometheus")
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    ports = {node: free_port() for node in NODES}
    try:
        for node, pairs in NODES.items():
            (tmp_path / node).mkdir(mode=0o700)  # the daemon creates only its own default directory
            endpoint = f"ipc://{tmp_path}/{node}/sidecar.sock"
            logs += [tmp_path / f"{node}-daemon.log", tmp_path / f"{node}-publisher.log"]
            procs.append(spawn_sidecar(["run", "--no-gpu-metrics", "--interval", "1", "--endpoint", endpoint,
                                        "--prometheus-addr", f"127.0.0.1:{ports[node]}"], logs[-2]))
            procs.append(start_publisher(endpoint, pairs, logs[-1]))
        config = prometheus_config(tmp_path, ports)
        web = free_port()
        logs.append(tmp_path / "prometheus.log")
        with open(logs[-1], "wb") as out:
            procs.append(subprocess.Popen(
                [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                 f"--web.listen-address=127.0.0.1:{web}", "--log.level=warn"],
                stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path))
        base = f"http://127.0.0.1:{web}"

        # the cluster-level recording rule, evaluated on the recorded per-node series
        cluster = "role:dflash_sidecar_records_accepted:rate1m"
        result = wait_for(f"{cluster} for both roles",
                          lambda: (r := query(base, f"{cluster} > 0")) and len(r) == 2 and r, 60, logs)
        assert label_sets(result) == [{"__name__": cluster, "role": "drafter"}, {"__name__": cluster, "role": "target"}]

        # the same thing asked directly: one sum across both daemons
        direct = query(base, "sum by (role) (rate(dflash_sidecar_records_accepted_total[1m]))")
        assert label_sets(direct) == [{"role": "drafter"}, {"role": "target"}]

        per_node = "host_role:dflash_sidecar_records_accepted:rate1m"
        result = wait_for(f"{per_node} for three workers",
                          lambda: (r := query(base, f"{per_node} > 0")) and len(r) == 3 and r, 20, logs)
        assert label_sets(result) == [{"__name__": per_node, "host": "node-a", "role": "drafter"},
                                      {"__name__": per_node, "host": "node-b", "role": "drafter"},
                                      {"__name__": per_node, "host": "node-b", "role": "target"}]

        # raw series: `node` became `host` and is gone; each daemon is its own target
        raw = query(base, "dflash_sidecar_start_time_seconds")
        assert sorted((m["host"], m["job"], "node" in m) for m in label_sets(raw)) == \
            [("node-a", "dflash-sidecar", False), ("node-b", "dflash-sidecar", False)]
        assert {m["instance"] for m in label_sets(raw)} == {f"127.0.0.1:{p}" for p in ports.values()}

        # every shipped rule loaded and evaluates without error against real series
        groups = json.loads(http_get(f"{base}/api/v1/rules"))["data"]["groups"]
        assert {g["name"] for g in groups} == {"dflash-host", "dflash-cluster", "dflash-alerts", "dflash-node",
                                               "dflash-stragglers"}
        broken = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"] if r["health"] == "err"]
        assert broken == []
        firing = [r["name"] for g in groups for r in g["rules"] if r.get("state") == "firing"]
        assert firing == [], "nothing is wrong with these two nodes"
    finally:
        stop(procs)
