"""``promtool test rules`` input for the straggler rules (deploy/prometheus/rules/dflash-node.yml
and dflash-stragglers.yml) at any number of nodes, generated: ``rule_test_yaml(nodes)`` is the YAML of
a ``promtool test rules`` file whose cases are the issue's (one node slow by compute, one by its
data loader, one throttled, all balanced for ten minutes with noise, two runs sharing one
Prometheus, one node alone, a node restarting). ``deploy/prometheus/tests/stragglers_test.yml`` is
``rule_test_yaml(4)``, kept current by tests/test_cluster_rules.py, which runs it at 2 to 64 nodes too.

Each node reports one rank's step time (1 s) and its split by phase class, as the daemon's
``dflash_node_*`` families do, every 15 s; a healthy node waits 55 % of its step in the all-reduce.
"""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "rules"
STATIC = ROOT / "deploy" / "prometheus" / "tests" / "stragglers_test.yml"
SAMPLES = 48
"""15 s samples: 12 minutes."""
GPUS = 2
"""GPUs per node (``dflash_gpu_utilization_ratio`` series)."""

HEALTHY = {"comm": 0.55, "data": 0.02, "compute": 0.40, "host": 0.02, "unattributed": 0.01}
SLOW_COMPUTE = {"comm": 0.02, "data": 0.02, "compute": 0.93, "host": 0.02, "unattributed": 0.01}
SLOW_INPUT = {"comm": 0.02, "data": 0.55, "compute": 0.40, "host": 0.02, "unattributed": 0.01}
KINDS = {"healthy": (HEALTHY, "communication-bound"), "compute": (SLOW_COMPUTE, "balanced"),
         "input": (SLOW_INPUT, "input-bound"), "throttled": (SLOW_COMPUTE, "throttled")}
"""Node kind -> (its step split, its own verdict). A node slow by compute reads ``balanced`` on
its own (it hardly waits, and without GPU readings nothing says compute-bound)."""


def _round(value: float) -> float:
    """``round(v, 0.001)`` as PromQL computes it (the tests compare rounded values)."""
    return math.floor(value * 1000 + 0.5) / 1000


def _values(value: float, noise: float, rng: random.Random, gap: range = range(0)) -> str:
    return " ".join("_" if i in gap else f"{value + rng.uniform(-noise, noise):.4f}" for i in range(SAMPLES + 1))


def node_series(run: str, host: str, kind: str, noise: float = 0.0, rng: random.Random | None = None,
                gap: range = range(0)) -> list[dict[str, str]]:
    """The input series of one node: step time, step split, its verdict, its GPUs."""
    rng = rng or random.Random(0)
    shares, verdict = KINDS[kind]
    base = f'job="dflash-sidecar",instance="{host}:9478",host="{host}"'
    out = [{"series": f'dflash_node_step_seconds{{{base},run="{run}"}}', "values": _values(1.0, noise, rng, gap)}]
    out += [{"series": f'dflash_node_step_share_ratio{{{base},run="{run}",class="{c}"}}',
             "values": _values(v, noise, rng, gap)} for c, v in shares.items()]
    out.append({"series": f'dflash_pipeline_bottleneck{{{base},verdict="{verdict}"}}',
                "values": _values(1.0, 0.0, rng, gap)})
    out += [{"series": f'dflash_gpu_utilization_ratio{{{base},gpu="{g}"}}', "values": _values(0.9, 0.0, rng, gap)}
            for g in range(GPUS)]
    return out


def _named(run: str, kinds: list[str]) -> list[tuple[str, float, float]]:
    """(host, excess seconds per step, lost GPU-hours per hour) of the nodes the rules must name."""
    works = [1.0 - KINDS[k][0]["comm"] for k in kinds]
    median = statistics.median(works)
    out = []
    for i, (kind, work) in enumerate(zip(kinds, works, strict=True)):
        if kind != "healthy":
            excess = work - median
            out.append((f"{run}-n{i}", excess, excess * GPUS * (len(kinds) - 1)))
    return out


def _cause(kind: str) -> str:
    return {"compute": "compute-bound", "input": "input-bound", "throttled": "throttled"}[kind]


def _alert(run: str, host: str, cause: str, excess: float) -> dict:
    rule = next(r for g in yaml.safe_load((RULES / "dflash-stragglers.yml").read_text())["groups"]
                for r in g["rules"] if r.get("alert") == "DflashNodeStraggler")
    subs = {"{{ $labels.host }}": host, "{{ $labels.run }}": run, "{{ $labels.cause }}": cause,
            '{{ printf "%.3f" $value }}': f"{excess:.3f}"}
    notes = {}
    for key, text in rule["annotations"].items():
        for placeholder, value in subs.items():
            text = text.replace(placeholder, value)
        notes[key] = text
    return {"exp_labels": {"severity": "warning", "run": run, "host": host, "cause": cause},
            "exp_annotations": notes}


def _slow_case(name: str, nodes: int, slow: int, kind: str) -> dict:
    run = "r"
    kinds = ["healthy"] * nodes
    kinds[slow] = kind
    series = [s for i, k in enumerate(kinds) for s in node_series(run, f"{run}-n{i}", k)]
    named = _named(run, kinds)
    cause = _cause(kind)
    excess = [{"labels": f'{{run="{run}",host="{h}",cause="{cause}"}}', "value": _round(e)} for h, e, _ in named]
    lost = [{"labels": f'{{run="{run}",host="{h}",cause="{cause}"}}', "value": _round(g)} for h, _, g in named]
    return {"name": f"{nodes} nodes, {name}", "interval": "15s", "input_series": series,
            "promql_expr_test": [
                {"expr": "round(run_host_cause:dflash_node_straggler:excess_seconds, 0.001)", "eval_time": t,
                 "exp_samples": excess} for t in ("30s", "5m")] + [
                {"expr": "round(run_host_cause:dflash_node_straggler:lost_gpu_hours_per_hour, 0.001)",
                 "eval_time": "5m", "exp_samples": lost}],
            "alert_rule_test": [{"alertname": "DflashNodeStraggler", "eval_time": "1m", "exp_alerts": []},
                                {"alertname": "DflashNodeStraggler", "eval_time": "5m",
                                 "exp_alerts": [_alert(run, h, cause, e) for h, e, _ in named]}]}


def _quiet(name: str, series: list[dict[str, str]], times: tuple[str, ...]) -> dict:
    """A case in which nothing may be named at any of ``times``, nor alert at the last."""
    return {"name": name, "interval": "15s", "input_series": series,
            "promql_expr_test": [{"expr": "run_host_cause:dflash_node_straggler:excess_seconds", "eval_time": t,
                                  "exp_samples": []} for t in times],
            "alert_rule_test": [{"alertname": "DflashNodeStraggler", "eval_time": times[-1], "exp_alerts": []}]}


def _shapes(nodes: int) -> dict:
    """Every recorded series of the rules, counted on a balanced run: what each level holds."""
    series = [s for i in range(nodes) for s in node_series("r", f"r-n{i}", "healthy")]
    counts = {"run_host:dflash_node_step_seconds:avg1m": nodes,
              "run_host_class:dflash_node_step_share_ratio:avg1m": 5 * nodes,
              "host_cause:dflash_node_verdict:avg1m": 0,  # communication-bound names no cause of its own
              "run:dflash_node_hosts:count": 1, "run_host_class:dflash_node_step_seconds:avg1m": 5 * nodes,
              "run_class:dflash_node_step_seconds:median": 5, "run_class:dflash_node_step_share_ratio:median": 5,
              "run_host:dflash_node_work_seconds:avg1m": nodes, "run:dflash_node_work_seconds:median": 1,
              "run_host:dflash_node_work_seconds:ratio_median": nodes,
              "run_host:dflash_node_straggler:excess_seconds": 0, "run_host_cause:dflash_node_class_cause:max": nodes,
              "run_host_cause:dflash_node_cause:max": nodes, "run_host:dflash_node_gpus:count": nodes,
              "run_host_cause:dflash_node_straggler:lost_gpu_hours_per_hour": 0}
    tests = [{"expr": f"count({name}) or vector(0)", "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": n}]}
             for name, n in counts.items()]
    gpus = "run_host:dflash_node_gpus:count"
    tests.append({"expr": gpus, "eval_time": "5m", "exp_samples": [
        {"labels": f'{gpus}{{run="r",host="r-n{i}"}}', "value": GPUS} for i in range(nodes)]})
    return {"name": f"{nodes} nodes, every recorded series", "interval": "15s", "input_series": series,
            "promql_expr_test": tests}


def rule_test_yaml(nodes: int) -> str:
    """The YAML of a ``promtool test rules`` file at ``nodes`` nodes per run (>= 2), with the rule
    files named relative to deploy/prometheus/tests/."""
    if nodes < 2:
        raise ValueError("the straggler rules compare at least 2 nodes")
    rng = random.Random(nodes)
    balanced = [s for i in range(nodes) for s in node_series("r", f"r-n{i}", "healthy", 0.03, rng)]
    two_runs = [s for i in range(nodes) for s in node_series("a", f"a-n{i}", "compute" if i == 0 else "healthy")]
    two_runs += [s for i in range(nodes) for s in
                 node_series("b", f"b-n{i}", "input" if i == nodes - 1 else "healthy")]
    restart = [s for i in range(nodes) for s in node_series("r", f"r-n{i}", "healthy", gap=range(12, 20) if i == 1
                                                            else range(0))]
    named = [*[(h, "compute-bound", e) for h, e, _ in _named("a", ["compute"] + ["healthy"] * (nodes - 1))],
             *[(h, "input-bound", e) for h, e, _ in _named("b", ["healthy"] * (nodes - 1) + ["input"])]]
    cases = [
        _shapes(nodes),
        _slow_case("the last node slow by compute", nodes, nodes - 1, "compute"),
        _slow_case("the first node slow by its data loader", nodes, 0, "input"),
        _slow_case("one node throttled", nodes, 1, "throttled"),
        _quiet(f"{nodes} nodes balanced, noisy, for ten minutes", balanced, ("1m", "3m", "5m", "8m", "10m")),
        _quiet("one node alone, slow", node_series("r", "r-n0", "compute"), ("1m", "5m")),
        _quiet(f"{nodes} nodes, one restarting (3 to 5 minutes)", restart, ("2m", "4m", "5m30s", "6m", "10m")),
        {"name": f"two runs of {nodes} nodes sharing one Prometheus", "interval": "15s", "input_series": two_runs,
         "promql_expr_test": [{"expr": "round(run_host_cause:dflash_node_straggler:excess_seconds, 0.001)",
                               "eval_time": "5m", "exp_samples": [
                                   {"labels": f'{{run="{h[0]}",host="{h}",cause="{c}"}}', "value": _round(e)}
                                   for h, c, e in named]}]},
    ]
    files = ["../rules/dflash-recording.yml", "../rules/dflash-node.yml", "../rules/dflash-stragglers.yml"]
    doc = {"rule_files": files, "evaluation_interval": "15s", "tests": cases}
    head = (f"# promtool test rules: the straggler rules at {nodes} nodes per run. Generated by\n"
            f"# tests/straggler_rules.py (rule_test_yaml({nodes})); edit that, not this file.\n")
    return head + yaml.safe_dump(doc, sort_keys=False, width=200)
