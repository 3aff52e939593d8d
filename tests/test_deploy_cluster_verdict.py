"""The cluster's verdict, live: four nodes (a daemon and a trainer process each, as
tests/test_deploy_multinode.py runs them), one real Prometheus with the shipped cluster config and
rules at a 1 s scrape and evaluation. The trainers of n0-n2 wait ~55 % of each step in their
all-reduce; n3 computes ~2.5 times as long and hardly waits (its own verdict: balanced). The rules
must name n3, with its cause (compute-bound), soon after the nodes' first full windows, never a
healthy node; ``dflash-sidecar cluster`` must print the same, the W&B cluster row carry it (with one
alert), and ``report --prometheus`` say n3 held the run back most."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

from sidecar.aggregation.insight import compute_insight
from sidecar.exporters.wandb.cluster_row import ClusterRow
from sidecar.exporters.wandb.keys import pattern_of
from sidecar.model.window import IngestReport
from tests.cluster_nodes import Node, start_prometheus
from tests.deploy_support import env, stop
from tests.insight_synth import report, sender, worker
from tests.prometheus_harness import query, wait_for

SLOW = "n3"
RUN = "job44"
NAMED = "run_host_cause:dflash_node_straggler:excess_seconds"


def _window_of_run(run: str) -> IngestReport:
    """A window of a node whose trainer names ``run`` (what the W&B cluster row reads of it)."""
    series = worker("trainer", "0", {"forward": 10, "comm_wait": 30}, 10)
    senders = (dataclasses.replace(sender("trainer", "0"), hello={"run_label": run}),)
    rep = report(series, senders=senders)
    return dataclasses.replace(rep, insight=compute_insight(rep.window, None, None, senders))


def test_four_nodes_one_slow_by_compute_is_named_with_its_cause(tmp_path: Path) -> None:
    nodes = [Node(f"n{i}", RUN, "compute" if i == 3 else "healthy") for i in range(4)]
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    try:
        prometheus, base = start_prometheus(tmp_path, nodes, logs)
        procs.append(prometheus)
        cli = [sys.executable, "-m", "sidecar", "cluster", "--prometheus", base]
        wait_for("Prometheus up", lambda: query(base, "vector(1)"), 60, logs)
        empty = subprocess.run(cli, capture_output=True, text=True, env=env(), timeout=60, check=False)
        assert empty.returncode == 1 and "no run: no node reports dflash_node_* series" in empty.stderr, empty.stderr

        started = time.monotonic()
        for node in nodes:
            node.start(tmp_path, logs)

        wait_for("every node's figures", lambda: len(query(base, "run:dflash_node_hosts:count == 4")) == 1, 60, logs)
        full = time.monotonic()
        named: list[dict[str, str]] = []

        def slow_named() -> bool:
            result = query(base, NAMED)
            named.extend(r["metric"] for r in result)
            return any(r["metric"]["host"] == SLOW for r in result)

        wait_for("n3 named", slow_named, 45, logs)
        latency, since_start = time.monotonic() - full, time.monotonic() - started
        deadline = time.monotonic() + 5  # keep watching: no healthy node is ever named
        while time.monotonic() < deadline:
            named.extend(r["metric"] for r in query(base, NAMED))
            time.sleep(0.5)
        assert {(m["host"], m["cause"], m["run"]) for m in named} == {(SLOW, "compute-bound", RUN)}, named
        print(f"n3 named {latency:.1f} s after all four nodes' first figures, "
              f"{since_start:.1f} s after the nodes started")

        text = subprocess.run(cli, capture_output=True, text=True, env=env(), timeout=60, check=False)
        assert text.returncode == 0, text.stderr
        assert f"run {RUN}: 4 nodes" in text.stdout and "n3 holds the others back: compute-bound" in text.stdout, \
            text.stdout
        table = text.stdout.split("verdict\n", 1)[1].splitlines()
        assert table[0].startswith("n3 ") and len(table) == 4, text.stdout  # slowest first
        data = json.loads(subprocess.run(cli + ["--run", RUN, "--json"], capture_output=True, text=True, env=env(),
                                         timeout=60, check=True).stdout)
        assert [(n["host"], n["cause"]) for n in data["named"]] == [(SLOW, "compute-bound")]
        assert data["median_comm"] > 0.3 and {n["host"] for n in data["nodes"]} == {n.name for n in nodes}
        wrong = subprocess.run(cli + ["--run", "other"], capture_output=True, text=True, env=env(), timeout=60)
        assert wrong.returncode == 1 and "no run 'other' reports now; runs: job44 (4 nodes)" in wrong.stderr
        # the W&B cluster row of n0's daemon (wandb_cluster_prometheus): handed to the W&B exporter's queue
        rows: list[tuple[dict[str, float], tuple[tuple[str, str], ...]]] = []
        poller = ClusterRow(base, "n0", lambda row, step, alerts: rows.append((dict(row), alerts)) or True)
        assert poller.poll() is False  # no window yet: the node's run is not known
        poller.consume(_window_of_run(RUN))
        assert poller.poll() and poller.poll()
        row, alerts = rows[0]
        assert row["n0/cluster/nodes"] == 4 and row["n0/cluster/held_back"] == 1, row
        assert row["n0/cluster/n3/excess_s"] > 0 and "n0/cluster/n3/lost_gpu_hours_per_hour" in row, row
        assert alerts == (("n3 holds run job44 back (compute-bound)", "dflash-sidecar on n0: the nodes of run job44 "
                           "wait for n3 (compute-bound); dflash-sidecar cluster --prometheus URL --run job44"),)
        assert rows[1][1] == ()  # alerted once, not at every poll
        assert all(pattern_of(f"sidecar/{key}") for key in row), row  # keys of the documented scheme
        unreachable = ClusterRow("http://127.0.0.1:9", "n0", lambda *a: True)
        unreachable.consume(_window_of_run(RUN))
        assert unreachable.poll() is False

        # the run ledger of n0's daemon, with Prometheus's history: n3 held the run back most
        state = env(XDG_STATE_HOME=str(tmp_path / "n0" / "xdg-state"))
        report = subprocess.run([sys.executable, "-m", "sidecar", "report", "--run", RUN, "--prometheus", base],
                                capture_output=True, text=True, env=state, timeout=60, check=False)
        assert report.returncode == 0, report.stderr
        assert f"run {RUN}: held back most by n3 (compute-bound) for" in report.stdout, report.stdout
        daemon = subprocess.run(cli[:-1] + [f"http://127.0.0.1:{nodes[0].port}"], capture_output=True, text=True,
                                env=env(), timeout=60)  # a daemon's address, not Prometheus's
        assert daemon.returncode == 1 and "not a daemon's /metrics" in daemon.stderr, daemon.stderr
    finally:
        stop(procs)
        for node in nodes:
            node.stop()


def test_runs_sharing_one_prometheus_each_name_their_own_node_and_a_balanced_run_none(tmp_path: Path) -> None:
    """Three runs scraped by one Prometheus: in ``ra`` a node slow by its data loader (its own
    verdict input-bound), in ``rb`` a node slow and throttled (fake NVML: hw_slowdown on its GPUs),
    ``rc`` balanced, one of its two nodes restarting (daemon and trainer) mid-run. Each run names
    its own node with its cause, never another run's, and ``rc`` names nothing, restart included
    (while c1 is down, ``cluster --run rc`` says only one node reports)."""
    from tests.fake_nvml.build import build_fake_nvml
    from tests.fake_nvml.control import FakeNvml
    from tests.fake_nvml.helpers import library_or_skip

    library_or_skip("full")
    library = build_fake_nvml("full")
    control = FakeNvml(tmp_path / "nvml-control.txt", library, {"devices": 2})
    control.gpu("*", utilization_gpu=60, clock_reasons=0x8)  # hw_slowdown
    hot = {"LD_LIBRARY_PATH": str(library.parent), "FAKE_NVML_CONTROL": str(control.path)}
    nodes = [Node("a0", "ra", "healthy"), Node("a1", "ra", "healthy"), Node("a2", "ra", "input"),
             Node("b0", "rb", "healthy"), Node("b1", "rb", "compute", nvml=hot), Node("b2", "rb", "healthy"),
             Node("c0", "rc", "healthy"), Node("c1", "rc", "healthy")]
    logs: list[Path] = []
    prometheus, base = start_prometheus(tmp_path, nodes, logs)
    named: set[tuple[str, str, str]] = set()

    def watch() -> set[tuple[str, str, str]]:
        named.update((m["metric"]["run"], m["metric"]["host"], m["metric"]["cause"]) for m in query(base, NAMED))
        return named

    try:
        for node in nodes:
            node.start(tmp_path, logs)
        wait_for("three runs", lambda: len(query(base, "run:dflash_node_hosts:count >= 2")) == 3, 90, logs)
        wait_for("a2 and b1 named", lambda: {("ra", "a2", "input-bound"), ("rb", "b1", "throttled")} <= watch(),
                 45, logs)
        nodes[-1].stop()  # c1 restarts: gone a few seconds, then back
        wait_for("rc down to c0", lambda: watch() is not None and query(
            base, 'run:dflash_node_hosts:count{run="rc"} == 1'), 20, logs)
        alone = subprocess.run([sys.executable, "-m", "sidecar", "cluster", "--prometheus", base, "--run", "rc"],
                               capture_output=True, text=True, env=env(), timeout=60, check=False)
        assert alone.returncode == 1 and "run 'rc': only one node reports (c0)" in alone.stderr, alone.stderr
        nodes[-1].start(tmp_path, logs)
        wait_for("c1 back", lambda: query(base, 'run_host:dflash_node_step_seconds:avg1m{host="c1"}'), 45, logs)
        for _ in range(10):
            watch()
            time.sleep(0.5)
        assert named == {("ra", "a2", "input-bound"), ("rb", "b1", "throttled")}, named
        text = subprocess.run([sys.executable, "-m", "sidecar", "cluster", "--prometheus", base, "--run", "rc"],
                              capture_output=True, text=True, env=env(), timeout=60, check=True).stdout
        assert "run rc: 2 nodes" in text and "no node holds the others back" in text, text
        several = subprocess.run([sys.executable, "-m", "sidecar", "cluster", "--prometheus", base],
                                 capture_output=True, text=True, env=env(), timeout=60, check=False)
        assert several.returncode == 1 and "3 runs report to this Prometheus: pass --run" in several.stderr
    finally:
        stop([prometheus])
        for node in nodes:
            node.stop()
