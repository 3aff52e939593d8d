"""Tests of the deploy tests' helpers (``tests.deploy_support``)."""

from __future__ import annotations

import re

import pytest

from tests.deploy_support import load_metric_names, promql_metric_names, require_tool


@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (host, role) (rate(dflash_sidecar_records_accepted_total{role="x", job=~"a|b"}[5m]))',
     {"dflash_sidecar_records_accepted_total"}),
    ("host:x:rate5m / (host:x:rate5m + host:y:rate5m)", {"host:x:rate5m", "host:y:rate5m"}),
    ("a == 0 and b > 0 and on (host) group_left(role) c > 0.5e-3", {"a", "b", "c"}),
    ("sum(a) by (host) > bool 1 unless ignoring(gpu) b offset 5m", {"a", "b"}),
    ('max by (host) (avg_over_time(q[$__rate_interval])) < 0.1 and on (host) min(g{host=~"$host"}) < 1e-12',
     {"q", "g"}),
    ('time() - max by (host, role, worker) (last_seen)', {"last_seen"}),
    ('label_replace(up{job="x"}, "node", "$1", "instance", "(.*):.*")', {"up"}),
    ('changes(s[1h]) + abs(t - 0.0625) < bool 1e-12', {"s", "t"}),
])
def test_promql_metric_names(expr: str, names: set[str]) -> None:
    assert promql_metric_names(expr) == names


def test_promql_metric_names_refuses_name_matchers() -> None:
    with pytest.raises(ValueError):
        promql_metric_names('{__name__=~"dflash_.+"}')


def test_metric_names_file_is_well_formed() -> None:
    names = load_metric_names()
    assert all(source in {"daemon", "trainer", "nvml", "insight", "wandb", "prometheus", "dcgm", "ledger", "capture"}
               for _, source in names.values())
    for name, (kind, source) in names.items():
        if source == "dcgm":  # dcgm-exporter's own spelling: upper case, counters without _total
            assert re.fullmatch(r"DCGM_FI_[A-Z0-9_]+", name), name
            continue
        assert re.fullmatch(r"[a-z_:][a-z0-9_:]*", name), name
        assert name == "up" or name.startswith("dflash_"), f"{name}: not a dflash_ name"
        assert (kind == "counter") == name.endswith("_total"), f"{name}: counters and only counters end in _total"


def test_require_tool_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must install it"):
        require_tool("no-such-tool-dflash", "nothing")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="Debian package: nothing"):
        require_tool("no-such-tool-dflash", "nothing")
