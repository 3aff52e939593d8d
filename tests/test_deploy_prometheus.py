"""deploy/prometheus: scrape configs, recording and alerting rules, their promtool unit tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.deploy_support import (
    PROMETHEUS_DIR,
    RULE_FILES,
    known_series_names,
    promql_metric_names,
    require_tool,
    run,
)

CONFIGS = ("prometheus.yml", "prometheus-cluster.yml", "prometheus-federation.yml")
RULE_TESTS = sorted((PROMETHEUS_DIR / "tests").glob("*_test.yml"))


def rules() -> list[dict]:
    return [rule for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"]]


@pytest.fixture
def deployed_copy(tmp_path: Path) -> Path:
    """deploy/prometheus copied the way a user installs it: each ``*.example`` file put in place."""
    copy = tmp_path / "prometheus"
    shutil.copytree(PROMETHEUS_DIR, copy)
    for example in copy.rglob("*.example"):
        shutil.copy(example, example.with_suffix(""))
    return copy


@pytest.mark.parametrize("config", CONFIGS)
def test_promtool_check_config(config: str, deployed_copy: Path) -> None:
    promtool = require_tool("promtool", "prometheus")
    result = run([promtool, "check", "config", config], cwd=deployed_copy)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNING" not in output, output


def test_promtool_check_rules() -> None:
    promtool = require_tool("promtool", "prometheus")
    result = run([promtool, "check", "rules", *map(str, RULE_FILES)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr


@pytest.mark.parametrize("test_file", RULE_TESTS, ids=lambda p: p.name)
def test_promtool_test_rules(test_file: Path) -> None:
    promtool = require_tool("promtool", "prometheus")
    result = run([promtool, "test", "rules", test_file.name], cwd=test_file.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_rule_has_a_unit_test() -> None:
    """Each alert is expected to fire in some test, and each recording rule is queried in one."""
    fired: set[str] = set()
    queried: set[str] = set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            fired |= {t["alertname"] for t in case.get("alert_rule_test", []) if t.get("exp_alerts")}
            for t in case.get("promql_expr_test", []):
                queried |= promql_metric_names(t["expr"])
    alerts = {r["alert"] for r in rules() if "alert" in r}
    records = {r["record"] for r in rules() if "record" in r}
    assert alerts - fired == set(), "alerts without a firing test"
    assert records - queried == set(), "recording rules never queried"


def test_rules_read_only_known_names() -> None:
    known = known_series_names()
    for rule in rules():
        unknown = promql_metric_names(rule["expr"]) - known
        assert not unknown, f"{rule.get('record') or rule.get('alert')} reads {sorted(unknown)}: " \
                            "not in deploy/metric_names.txt nor recorded"


def test_rule_conventions() -> None:
    for rule in rules():
        if "record" in rule:
            level, metric, operation = rule["record"].split(":")
            assert metric.startswith("dflash_") and operation, rule["record"]
        else:
            assert rule["alert"].startswith("Dflash"), rule["alert"]
            assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
            assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]


def test_cluster_rules_read_only_recorded_series() -> None:
    """dflash-cluster.yml must work on a global Prometheus that federates only recorded series."""
    recorded = {r["record"] for r in rules() if "record" in r}
    cluster = yaml.safe_load((PROMETHEUS_DIR / "rules" / "dflash-cluster.yml").read_text())
    for rule in cluster["groups"][0]["rules"]:
        assert promql_metric_names(rule["expr"]) <= recorded, rule["record"]


def test_scrape_configs_name_nodes_by_host() -> None:
    """Every scrape of a daemon maps a `node` target label onto `host`, then drops `node`."""
    for name in ("prometheus.yml", "prometheus-cluster.yml"):
        config = yaml.safe_load((PROMETHEUS_DIR / name).read_text())
        jobs = {job["job_name"]: job for job in config["scrape_configs"]}
        relabel = jobs["dflash-sidecar"]["metric_relabel_configs"]
        assert relabel == [{"source_labels": ["node"], "regex": "(.+)", "target_label": "host"},
                           {"regex": "node", "action": "labeldrop"}], name
