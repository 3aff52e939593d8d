"""deploy/grafana: the dashboard reads only names the daemon exports or the rules record, and every
expression in it is valid PromQL."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.deploy_support import (
    DASHBOARD,
    GRAFANA_VARIABLE,
    known_series_names,
    load_metric_names,
    promql_metric_names,
    require_tool,
    run,
)

LABEL_VALUES = re.compile(r"^label_values\((?:(?P<expr>.+),\s*)?(?P<label>\w+)\)$")


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_panels(panels: list[dict]) -> Iterator[dict]:
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def expressions(dash: dict) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    for panel in all_panels(dash["panels"]):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for var in dash["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = LABEL_VALUES.match(query)
        assert m, f"variable {var['name']}: only label_values(...) queries are checked, got {query!r}"
        yield f"variable {var['name']}", m.group("expr") or "up"


def test_dashboard_is_well_formed() -> None:
    dash = dashboard()
    assert dash["uid"] == "dflash-sidecar" and dash["title"]
    panels = list(all_panels(dash["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "host"} <= variables
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        for target in panel["targets"]:
            for var in GRAFANA_VARIABLE.findall(target["expr"]):
                assert var.strip("${}") in variables | {"__rate_interval", "__interval", "__range"}, \
                    f"{panel['title']}: unknown variable {var}"


def test_dashboard_covers_the_issue() -> None:
    """GPU panels per group, pipeline panels, a verdict timeline, daemon health."""
    dash = dashboard()
    titles = {p["title"] for p in all_panels(dash["panels"])}
    assert {"Overview", "Pipeline", "GPUs per group", "Daemon health"} <= titles
    kinds = {(p["type"], p["title"]) for p in all_panels(dash["panels"])}
    assert ("state-timeline", "Bottleneck verdict timeline") in kinds
    used = set().union(*(promql_metric_names(e) for _, e in expressions(dash)))
    for name in ("dflash_group_gpu_utilization_ratio", "dflash_group_power_watts", "dflash_pipeline_queue_fill_ratio",
                 "host_verdict:dflash_pipeline_bottleneck:max", "dflash_sidecar_resident_memory_bytes",
                 "host_reason:dflash_sidecar_records_dropped:rate5m", "dflash_nvml_data_age_seconds"):
        assert name in used, name


def test_dashboard_reads_only_exported_or_recorded_names() -> None:
    known = known_series_names()
    for where, expr in expressions(dashboard()):
        unknown = promql_metric_names(expr) - known
        assert not unknown, f"{where} reads {sorted(unknown)}: not in deploy/metric_names.txt nor recorded " \
                            f"by deploy/prometheus/rules: {expr}"


def test_name_check_catches_an_unknown_name(tmp_path: Path) -> None:
    """The check above would see a misspelt or removed metric."""
    assert promql_metric_names('rate(dflash_sidecar_record_accepted_total{host=~"$host"}[$__rate_interval])') \
        - known_series_names() == {"dflash_sidecar_record_accepted_total"}
    assert "dflash_sidecar_records_accepted_total" in known_series_names()
    assert load_metric_names()["dflash_trainer_forward_seconds"][0] == "summary"


def test_dashboard_expressions_are_valid_promql(tmp_path: Path) -> None:
    """promtool parses each expression (Grafana's variables replaced by plausible values)."""
    promtool = require_tool("promtool", "prometheus")
    substitutes = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}

    def concrete(expr: str) -> str:
        for var, value in substitutes.items():
            expr = expr.replace(var, value)
        return GRAFANA_VARIABLE.sub(".*", expr)

    rules = [{"record": f"dashboard:check:expr{i}", "expr": concrete(expr)}
             for i, (_, expr) in enumerate(expressions(dashboard()))]
    path = tmp_path / "dashboard-exprs.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = run([promtool, "check", "rules", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("expr", ['up{job="x"', "rate(x[5m]"])
def test_promql_check_rejects_bad_syntax(expr: str, tmp_path: Path) -> None:
    promtool = require_tool("promtool", "prometheus")
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "bad", "rules": [{"record": "a:b:c", "expr": expr}]}]}))
    assert run([promtool, "check", "rules", str(path)]).returncode != 0
