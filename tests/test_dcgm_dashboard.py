"""dcgm-exporter's dashboard (Grafana 12239) on the sidecar: a real daemon with ``--dcgm-compat``
on the fake NVML driver, a real Prometheus scraping it, and every panel and variable query of
the dashboard (``tests/data/dcgm_dashboard_12239.json``, copied from the dashboard) evaluated
through Prometheus's HTTP API. Also the compat page through promtool and the SIGHUP switch."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

import pytest

from sidecar.exporters.prometheus.dcgm import DCGM_LABELS
from tests.daemon_harness import DaemonProc, require_tool, wait_for
from tests.deploy_support import exposition_families, load_metric_names
from tests.fake_nvml.control import FakeNvml
from tests.fake_nvml.helpers import library_or_skip
from tests.soak.prom import Prometheus

DASHBOARD = json.loads((Path(__file__).parent / "data" / "dcgm_dashboard_12239.json").read_text())
GIB = 2**30


@pytest.fixture
def fake(tmp_path: Path) -> FakeNvml:
    control = FakeNvml(tmp_path / "nvml-control.txt", library_or_skip("full"), {"devices": 2})
    control.gpu("*", utilization_gpu=80, memory_used=30 * GIB, power_mw=450_000, temperature_gpu=61,
                clock_sm_mhz=1980, gpm_any_tensor_util=55)
    return control


def _gpu_env(fake: FakeNvml) -> dict[str, str]:
    return {"LD_LIBRARY_PATH": str(fake.library.parent), "FAKE_NVML_CONTROL": str(fake.path)}


def _grafana(expr: str, values: dict[str, list[str]]) -> str:
    """``expr`` with ``$var`` replaced as Grafana does for a multi-value regex variable (each
    value regex-escaped, the backslash doubled inside the PromQL string)."""
    def escaped(value: str) -> str:
        return re.escape(value).replace("\\", "\\\\")
    return re.sub(r"\$(\w+)", lambda m: "(" + "|".join(escaped(v) for v in values[m.group(1)]) + ")", expr)


def test_every_panel_query_of_dashboard_12239_returns_data(tmp_path: Path, fake: FakeNvml) -> None:
    prometheus = require_tool("prometheus")
    d = DaemonProc(tmp_path, "--dcgm-compat", "--nvml-interval", "0.5", gpu=True, extra_env=_gpu_env(fake))
    prom = Prometheus(prometheus, tmp_path, d.port)
    try:
        def variable(query: str) -> list[str]:
            metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", query).groups()  # type: ignore[union-attr]
            try:
                return list(prom.api(f"label/{label}/values", **{"match[]": metric}))
            except OSError:  # Prometheus not up yet
                return []

        values = {v["name"]: wait_for(lambda q=v["query"]: variable(q), timeout_s=40, interval_s=0.5,
                                      what=f"variable {v['name']}") for v in DASHBOARD["variables"]}
        assert values["instance"] == [f"127.0.0.1:{d.port}"] and values["gpu"] == ["0", "1"]
        for panel in DASHBOARD["panels"]:
            expr = _grafana(panel["expr"], values)

            series = wait_for(lambda expr=expr: prom.query(expr), timeout_s=20, interval_s=0.5,
                              what=f"panel {panel['title']!r}: {expr}")
            if "{{gpu}}" in panel["legend"]:  # a graph per GPU, labelled as the dashboard's legend wants
                assert sorted(s["metric"]["gpu"] for s in series) == ["0", "1"], panel["title"]
                for s in series:
                    missing = set(DCGM_LABELS) - set(s["metric"])
                    assert not missing, (panel["title"], missing)
                    assert s["metric"]["modelName"] == "NVIDIA H100 80GB HBM3 (fake)"
            else:
                assert len(series) == 1, panel["title"]
            assert all(float(s["value"][1]) > 0 for s in series), (panel["title"], series)
        power = prom.query(_grafana(DASHBOARD["panels"][3]["expr"], values))
        assert float(power[0]["value"][1]) == 900.0  # W: 2 GPUs x 450 W
        clocks = prom.query(_grafana(DASHBOARD["panels"][4]["expr"], values))
        assert {float(s["value"][1]) for s in clocks} == {1.98e9}  # the panel's "* 1000000" from MHz

        page = d.text()
        promtool = require_tool("promtool")
        out = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, text=True)
        foreign = [line for line in (out.stdout + out.stderr).splitlines() if not line.startswith("DCGM_FI_")]
        assert not foreign, foreign  # only dcgm-exporter's own label names (modelName) are flagged
        listed = {name: kind for name, (kind, source) in load_metric_names().items() if source == "dcgm"}
        scraped = {name: kind for name, kind in exposition_families(page).items() if name.startswith("DCGM_")}
        assert scraped == listed  # the fake supports every field: deploy/metric_names.txt lists exactly these
    finally:
        prom.stop()
        d.stop()


def test_compat_is_off_by_default_and_sighup_turns_it_on(tmp_path: Path, fake: FakeNvml) -> None:
    cfg = tmp_path / "sidecar.toml"
    cfg.write_text("dcgm_compat = false\n")
    d = DaemonProc(tmp_path, "--config", str(cfg), "--nvml-interval", "0.5", gpu=True, extra_env=_gpu_env(fake))
    try:
        wait_for(lambda: d.value("dflash_gpu_temperature_celsius", gpu="0") == 61.0, what="GPU readings")
        assert "DCGM_FI_" not in d.text()
        cfg.write_text("dcgm_compat = true\n")
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: d.value("DCGM_FI_DEV_GPU_TEMP", gpu="1") == 61.0, what="compat families after SIGHUP")
        assert "config reloaded (dcgm_compat)" in d.log()
    finally:
        d.stop()
