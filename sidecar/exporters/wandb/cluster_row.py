"""The cluster's verdict in the W&B run: where the daemon writes into a W&B run and
``wandb_cluster_prometheus`` names the Prometheus that joins the nodes, every ``every_s`` seconds
its own thread reads the straggler rules (deploy/prometheus/rules/dflash-stragglers.yml) for the
run this node serves and hands the W&B exporter one row (``submit``), its keys under the node's
``<host>/cluster/``: ``nodes`` (the run's nodes now), ``held_back`` (how many nodes the others wait
for: 0 or more), and per named node ``<node>/excess_s`` and ``<node>/lost_gpu_hours_per_hour``
(at most ``MAX_NAMED``, largest first); with a W&B alert when a node is newly named. Prometheus
unreachable: no row, logged once until it answers again. Never blocks the ingest thread:
``consume`` only keeps the run label of the latest window."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping

from sidecar.exporters.base import Exporter
from sidecar.exporters.prometheus.query import PrometheusApi, PrometheusError
from sidecar.model.cluster import HOSTS_SERIES, LOST_SERIES, NAMED_SERIES
from sidecar.model.window import IngestReport

MAX_NAMED = 8
"""Named nodes per row (bounded keys: a run with more slow nodes than this logs the slowest)."""

Submit = Callable[[Mapping[str, float], int | None, tuple[tuple[str, str], ...]], bool]
"""``WandbExporter.submit``: (row, trainer step, alerts) -> queued."""


def cluster_row(api: PrometheusApi, run: str) -> tuple[dict[str, float], dict[str, str]]:
    """The row for ``run`` (keys under ``cluster/``) and the named nodes' causes (node -> cause).
    Raises ``PrometheusError``."""
    sel = "{run=" + _quoted(run) + "}"
    nodes = api.query(HOSTS_SERIES + sel)
    named = sorted(api.query(NAMED_SERIES + sel), key=lambda lv: -lv[1])[:MAX_NAMED]
    lost = {lab.get("host", ""): v for lab, v in api.query(LOST_SERIES + sel)}
    row = {"cluster/nodes": nodes[0][1] if nodes else 0.0, "cluster/held_back": float(len(named))}
    causes = {}
    for labels, excess in named:
        host = labels.get("host", "")
        causes[host] = labels.get("cause", "")
        row[f"cluster/{host}/excess_s"] = excess
        if host in lost:
            row[f"cluster/{host}/lost_gpu_hours_per_hour"] = lost[host]
    return row, causes


def _quoted(value: str) -> str:
    """``value`` as a PromQL double-quoted string (JSON's escapes are PromQL's)."""
    return json.dumps(value)


class ClusterRow(Exporter):
    """Polls Prometheus for the cluster's verdict and submits it to the W&B exporter."""

    name = "wandb-cluster"

    def __init__(self, url: str, host: str, submit: Submit, every_s: float = 30.0,
                 log: logging.Logger | None = None) -> None:
        """Raises ``PrometheusError`` for a URL that is not http(s)."""
        self._api = PrometheusApi(url)
        self._host = host
        self._submit = submit
        self._every_s = every_s
        self._log = log or logging.getLogger("sidecar.wandb")
        self._run: str | None = None
        self._named: dict[str, str] = {}
        self._failing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="sidecar-wandb-cluster", daemon=True)
            self._thread.start()

    def consume(self, report: IngestReport) -> None:
        node = report.insight.node if report.insight is not None else None
        if node is not None:
            self._run = node.run  # one reference swap: the thread reads it

    def poll(self) -> bool:
        """One poll now: True when a row was submitted."""
        run = self._run
        if run is None:
            return False
        try:
            row, causes = cluster_row(self._api, run)
        except PrometheusError as exc:
            if not self._failing:
                self._log.warning("W&B cluster row: %s (retrying every %.0f s)", exc, self._every_s)
            self._failing = True
            return False
        self._failing = False
        alerts = tuple((f"{h} holds run {run} back ({c})"[:63],
                        f"dflash-sidecar on {self._host}: the nodes of run {run} wait for {h} ({c}); "
                        f"dflash-sidecar cluster --prometheus URL --run {run}")
                       for h, c in causes.items() if self._named.get(h) != c)
        self._named = causes
        return self._submit({f"{self._host}/{k}": v for k, v in row.items()}, None, alerts)

    def _loop(self) -> None:
        while not self._stop.wait(self._every_s):
            self.poll()

    def shutdown(self, timeout_s: float) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
