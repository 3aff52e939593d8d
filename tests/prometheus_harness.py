"""A real Prometheus for the live multi-node tests: the shipped cluster config with its rules at a
1 s scrape and evaluation, file_sd targets with their ``node`` label, and the HTTP API read back
(``tests/test_deploy_multinode.py``, ``tests/test_deploy_cluster_verdict.py``)."""

from __future__ import annotations

import json
import shutil
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.deploy_support import PROMETHEUS_DIR, http_get
from tests.waiting import wait_until


def prometheus_config(tmp: Path, targets: dict[str, int]) -> Path:
    """The shipped prometheus-cluster.yml, rules and all, with a 1 s scrape and our two targets."""
    shutil.copytree(PROMETHEUS_DIR / "rules", tmp / "rules")
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus-cluster.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    (tmp / "targets").mkdir()
    (tmp / "targets" / "nodes.yml").write_text(yaml.safe_dump(
        [{"targets": [f"127.0.0.1:{port}"], "labels": {"node": node}} for node, port in targets.items()]))
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def query(base: str, promql: str) -> list[dict]:
    try:
        body = http_get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    except OSError:  # Prometheus not up yet
        return []
    reply = json.loads(body)
    assert reply["status"] == "success", reply
    return reply["data"]["result"]


def wait_for(what: str, probe: Callable[[], object], timeout: float, logs: list[Path]) -> object:
    """``tests.waiting.wait_until``, failing with the daemons' and Prometheus' logs."""
    try:
        return wait_until(probe, timeout, 0.5, what)
    except AssertionError as exc:
        pytest.fail(f"{exc}; logs:\n" + "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in logs if p.exists()))
