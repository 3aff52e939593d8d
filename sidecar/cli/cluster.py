"""``dflash-sidecar cluster --prometheus URL [--run ID] [--json]``: the cluster's verdict, read
from the straggler rules' series (deploy/prometheus/rules/dflash-node.yml, dflash-stragglers.yml)
through Prometheus's HTTP API: the node the others wait for, its cause, since when, what it costs
them, and every node of the run, slowest first. The daemons never talk to each other; Prometheus
(or what it federates or remote-writes into) joins them. docs/DEPLOY.md, "Many nodes"."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from sidecar.cli.exit_status import FAILURE, OK, USAGE
from sidecar.exporters.prometheus.query import PrometheusApi, PrometheusError
from sidecar.model.cluster import HELD_SERIES, HOSTS_SERIES, LOST_SERIES, NAMED_SERIES, PHASE_CLASSES

HOSTS, NAMED, HELD, LOST = HOSTS_SERIES, NAMED_SERIES, HELD_SERIES, LOST_SERIES
STEP = "run_host:dflash_node_step_seconds:avg1m"
SHARES = "run_host_class:dflash_node_step_share_ratio:avg1m"
RATIO = "run_host:dflash_node_work_seconds:ratio_median"
MEDIAN_SHARE = "run_class:dflash_node_step_share_ratio:median"
VERDICTS = "host_verdict:dflash_pipeline_bottleneck:max"
READ = (HOSTS, STEP, SHARES, RATIO, MEDIAN_SHARE, NAMED, LOST, HELD, VERDICTS)
"""The recorded series the command reads (tests check the rules record each)."""
SINCE_LOOKBACK_S = 3600.0
"""How far back ``since`` looks for the start of the named node's current stretch."""


class ClusterError(Exception):
    """The cluster view cannot be made: the message says what to fix."""


@dataclass(frozen=True, slots=True)
class NodeRow:
    """One node of the run: its step (s), its own work over the median node's, its step split by
    phase class (0-1) and its own verdict (None when Prometheus has none)."""

    host: str
    step_s: float | None
    work_ratio: float | None
    shares: dict[str, float]
    verdict: str | None


@dataclass(frozen=True, slots=True)
class Named:
    """A node the others wait for: its cause, seconds per step its work exceeds the median node's,
    GPU-hours per hour the other nodes lose, and since when (unix s, None: not told)."""

    host: str
    cause: str
    excess_s: float
    lost_gpu_hours_per_hour: float | None
    since_unix_s: float | None


@dataclass(frozen=True, slots=True)
class ClusterView:
    run: str
    median_comm: float | None
    named: list[Named]
    nodes: list[NodeRow] = field(default_factory=list)


def _selector(run: str, **extra: str) -> str:
    """``{run="…",…}`` with each value quoted as PromQL reads a string (backslash, quote, newline)."""
    def quoted(value: str) -> str:
        return json.dumps(value)  # a JSON string is a valid PromQL double-quoted string for these escapes

    return "{" + ",".join(f"{k}={quoted(v)}" for k, v in {"run": run, **extra}.items()) + "}"


def pick_run(api: PrometheusApi, run: str | None) -> tuple[str, int]:
    """The run to show and its node count. Raises ``ClusterError`` when there is none, several and
    none chosen, or the chosen one is not there; ``PrometheusError`` when Prometheus fails."""
    runs = {labels.get("run", ""): int(v) for labels, v in api.query(HOSTS)}
    if not runs:
        if api.query("count(dflash_node_step_seconds)"):
            raise ClusterError("the nodes report dflash_node_* series but the straggler rules are not loaded: add "
                               "rules/dflash-node.yml and rules/dflash-stragglers.yml to the server's rule_files "
                               "(as deploy/prometheus/prometheus-cluster.yml does)")
        raise ClusterError("no run: no node reports dflash_node_* series to this Prometheus; check that it scrapes "
                           "every node's daemon (up{job=\"dflash-sidecar\"}) and that the trainers publish phase "
                           "timings (dflash-sidecar explain on a node)")
    listing = ", ".join(f"{r} ({n} node{'s' if n != 1 else ''})" for r, n in sorted(runs.items()))
    if run is None:
        if len(runs) > 1:
            raise ClusterError(f"{len(runs)} runs report to this Prometheus: pass --run, one of {listing}")
        run = next(iter(runs))
    if run not in runs:
        raise ClusterError(f"no run {run!r} reports now; runs: {listing}")
    return run, runs[run]


def read_cluster(api: PrometheusApi, run: str | None, now_s: float | None = None) -> ClusterView:
    """The cluster view of ``run`` (the only run when None). Raises ``ClusterError`` (no run, one
    node only) or ``PrometheusError``."""
    run, count = pick_run(api, run)
    sel = _selector(run)
    steps = {lab["host"]: v for lab, v in api.query(STEP + sel)}
    if count < 2:
        raise ClusterError(f"run {run!r}: only one node reports ({', '.join(steps) or '?'}): the cluster verdict "
                           "compares nodes; is every node's daemon scraped by this Prometheus (targets/*.yml)?")
    shares: dict[str, dict[str, float]] = {}
    for lab, v in api.query(SHARES + sel):
        shares.setdefault(lab["host"], {})[lab.get("class", "")] = v
    ratios = {lab["host"]: v for lab, v in api.query(RATIO + sel)}
    verdicts = {lab["host"]: lab.get("verdict", "") for lab, v in api.query(f"{VERDICTS} == 1")}
    median = api.query(MEDIAN_SHARE + _selector(run, **{"class": "comm"}))
    lost = {lab["host"]: v for lab, v in api.query(LOST + sel)}
    now_s = time.time() if now_s is None else now_s
    named = [Named(lab["host"], lab.get("cause", ""), v, lost.get(lab["host"]), _since(api, run, lab["host"], now_s))
             for lab, v in api.query(NAMED + sel)]
    hosts = set(steps) | set(shares) | set(ratios)
    rows = [NodeRow(h, steps.get(h), ratios.get(h), shares.get(h, {}), verdicts.get(h)) for h in hosts]
    rows.sort(key=lambda r: (-(r.work_ratio or 0.0), r.host))
    named.sort(key=lambda n: -n.excess_s)
    return ClusterView(run, median[0][1] if median else None, named, rows)


def _since(api: PrometheusApi, run: str, host: str, now_s: float) -> float | None:
    """When the node's current stretch as the named node began (within ``SINCE_LOOKBACK_S``)."""
    step = 5.0
    series = api.query_range(HELD + _selector(run, host=host), now_s - SINCE_LOOKBACK_S, now_s, step)
    return stretch_start([t for _, ts in series for t in ts], step)


def stretch_start(times: list[float], step_s: float) -> float | None:
    """The first time of the last unbroken stretch of ``times`` (unix s, sampled every ``step_s``;
    a gap over 1.5 steps breaks it), None when there is none."""
    ordered = sorted(times)
    if not ordered:
        return None
    start = ordered[-1]
    for t in reversed(ordered[:-1]):
        if start - t > step_s * 1.5:
            break
        start = t
    return start


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
        f"{seconds // 60}m {seconds % 60:02d}s"


def render(view: ClusterView, now_s: float) -> str:
    """The cluster view as one screen of text."""
    comm = f"{view.median_comm:.0%}" if view.median_comm is not None else "?"
    lines = [f"run {view.run}: {len(view.nodes)} nodes; the median node waits {comm} of its step in collectives"]
    for n in view.named:
        since = "" if n.since_unix_s is None else (
            f", since {time.strftime('%H:%M:%S', time.gmtime(n.since_unix_s))} UTC "
            f"({_duration(now_s - n.since_unix_s)})")
        lost = "" if n.lost_gpu_hours_per_hour is None else \
            f": the other nodes lose {n.lost_gpu_hours_per_hour:.2f} GPU-hours per hour waiting"
        lines.append(f"{n.host} holds the others back: {n.cause}{since}")
        lines.append(f"  its own work takes {n.excess_s:.3f} s per step more than the median node's{lost}")
    if not view.named:
        lines.append("no node holds the others back")
    head = f"{'node':<16} {'step s':>7} {'work/med':>8} " + " ".join(f"{c[:6]:>7}" for c in PHASE_CLASSES) + \
        "  verdict"
    lines += ["", head]
    for r in view.nodes:
        step = f"{r.step_s:7.3f}" if r.step_s is not None else f"{'-':>7}"
        ratio = f"{r.work_ratio:8.2f}" if r.work_ratio is not None else f"{'-':>8}"
        parts = " ".join(f"{r.shares[c]:7.0%}" if c in r.shares else f"{'-':>7}" for c in PHASE_CLASSES)
        lines.append(f"{r.host:<16} {step} {ratio} {parts}  {r.verdict or '-'}")
    return "\n".join(lines)


def cluster_json(view: ClusterView) -> dict[str, Any]:
    """The cluster view as JSON-able data."""
    return asdict(view)


def run_cluster(url: str, run: str | None, as_json: bool, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """The command: prints the view; on an error, a line on ``err`` saying what to fix and 1 (2
    for a URL that is not http(s))."""
    try:
        api = PrometheusApi(url)
    except PrometheusError as exc:
        print(f"dflash-sidecar cluster: error: {exc}", file=err)
        return USAGE
    try:
        view = read_cluster(api, run)
    except (ClusterError, PrometheusError) as exc:
        print(f"dflash-sidecar cluster: error: {exc}", file=err)
        return FAILURE
    print(json.dumps(cluster_json(view), indent=2) if as_json else render(view, time.time()), file=out)
    return OK
