"""The page for W&B's open-metrics scraper (``/metrics/wandb``) and the trainer's helper for it,
in process: the page against ``/metrics`` for one synthetic state, its bounds, its route on a
real server, and the settings the helper gives checked by the real ``wandb.Settings``. The real
scraper (wandb-core) against a running daemon is tests/test_wandb_open_metrics_offline.py."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from sidecar.aggregation.insight import compute_insight
from sidecar.core.config import Config
from sidecar.core.scrape_state import ScrapeState
from sidecar.exporters.prometheus.collector import ExportState, SidecarCollector
from sidecar.exporters.prometheus.server import serve
from sidecar.exporters.prometheus.wandb_page import (
    MAX_NAMES_PER_PROJECTION,
    PROJECTIONS,
    REFUSED,
    WandbPage,
    family_templates,
)
from sidecar.model.gpu import GpuReading, GpuSnapshot, GpuView, GroupAggregate, NvmlState, NvmlStatus
from sidecar.model.insight import VERDICT_CODES, GpuFacts
from tests.daemon_harness import free_port, require_tool
from tests.insight_synth import pipeline, report, worker
from trainer_shim.integrations import wandb_metrics

HOST = "box1"


def _state() -> ExportState:
    base = pipeline({"forward": 70.0, "pack": 5.0}, {"queue_wait": 20.0, "forward": 30.0, "backward": 45.0},
                    queue_fill=0.25)
    facts = GpuFacts(roles={"0": "target", "1": "drafter"}, busy={"0": 0.9, "1": 0.55})
    insight = compute_insight(base.window, gpus=facts)
    snapshot = GpuSnapshot(time.monotonic(), 0.002, 12, (GpuReading(0, "GPU-0", "fake", utilization_ratio=0.9),
                                                          GpuReading(1, "GPU-1", "fake", utilization_ratio=0.55)))
    groups = (GroupAggregate("target", (0,), 1, 0.9, 310.0, 61.0, 7 * 2**30),
              GroupAggregate("drafter", (1,), 1, 0.55, 205.5, 48.0, 30 * 2**30))
    view = GpuView(snapshot, NvmlStatus(NvmlState.AVAILABLE), groups)
    return ExportState(host=HOST, started_unix_s=1.0, report=dataclasses.replace(base, insight=insight),
                       scrape_state=ScrapeState(gpus=SimpleNamespace(view=lambda: view)))


def _page(state: ExportState) -> dict[str, tuple[dict[str, str], float]]:
    text = WandbPage(SidecarCollector(state)).render().decode()
    return {s.name: (s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples}


def test_page_values_are_those_of_metrics_with_the_labels_in_the_names() -> None:
    state = _state()
    registry = CollectorRegistry(auto_describe=False, support_collectors_without_names=True)
    registry.register(SidecarCollector(state))
    page = _page(state)

    def metrics(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"host": HOST, **labels})

    insight = state.report.insight  # type: ignore[union-attr]
    assert insight is not None
    assert page["dflash_verdict_code"][1] == VERDICT_CODES[insight.verdict.name]
    for verdict in VERDICT_CODES:
        assert page["dflash_bottleneck_" + verdict.replace("-", "_")][1] == metrics(
            "dflash_pipeline_bottleneck", verdict=verdict)
    pairs = {
        "dflash_role_drafter_batches_per_second": metrics("dflash_pipeline_batches_per_second", role="drafter"),
        "dflash_role_target_tokens_per_second": metrics("dflash_pipeline_tokens_per_second", role="target"),
        "dflash_role_drafter_time_share_queue_wait_ratio": metrics("dflash_pipeline_time_share_ratio",
                                                                   role="drafter", phase="queue_wait"),
        "dflash_pipeline_queue_fill_ratio": metrics("dflash_pipeline_queue_fill_ratio"),
        "dflash_verdict_confidence_ratio": metrics("dflash_pipeline_verdict_confidence_ratio"),
        "dflash_group_drafter_gpu_idle_ratio": metrics("dflash_pipeline_gpu_idle_ratio", group="drafter"),
        "dflash_group_drafter_gpu_idle_queue_ratio": metrics("dflash_pipeline_gpu_idle_reason_ratio",
                                                             group="drafter", reason="queue"),
        "dflash_group_target_power_watts": metrics("dflash_group_power_watts", group="target"),
        "dflash_group_drafter_memory_free_min_bytes": metrics("dflash_group_memory_free_min_bytes", group="drafter"),
        "dflash_group_target_gpu_utilization_ratio": metrics("dflash_group_gpu_utilization_ratio", group="target"),
        "dflash_sidecar_senders": metrics("dflash_sidecar_senders"),
    }
    assert None not in pairs.values(), pairs
    assert {name: page[name][1] for name in pairs} == pairs
    assert page["dflash_group_drafter_gpu_idle_ratio"][1] == pytest.approx(0.45)
    # One sample per family, whose only label is the (constant) host: W&B keys end in .0.
    assert all(labels == {"host": HOST} for labels, _ in page.values())
    assert page[REFUSED][1] == 0.0


def test_page_passes_promtool() -> None:
    promtool = require_tool("promtool")
    text = WandbPage(SidecarCollector(_state())).render()
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60, check=False)
    assert (proc.returncode, proc.stdout + proc.stderr) == (0, b"")


def test_page_is_bounded_and_keeps_the_names_it_gave() -> None:
    n = MAX_NAMES_PER_PROJECTION
    roles = [f"r{i}" for i in range(n + 3)] + ["a-b", "a_b"]

    def state_of(role_names: list[str]) -> ExportState:
        series = [s for r in role_names for s in worker(r, "0", {"forward": 10.0}, 50)]
        base = report(series)
        return ExportState(host=HOST, started_unix_s=1.0,
                           report=dataclasses.replace(base, insight=compute_insight(base.window)))

    state = state_of(roles[n - 2:])  # the last few roles first: they are admitted first
    page = WandbPage(SidecarCollector(state))
    first = {s.name for f in page.families() for s in f.samples}
    assert "dflash_role_a_b_batches_per_second" in first
    state.report = state_of(roles).report
    families = {s.name: s.value for f in page.families() for s in f.samples}
    per_role = sorted(name for name in families if name.endswith("_batches_per_second"))
    assert len(per_role) == n
    assert {name for name in first if name.endswith("_batches_per_second")} <= set(per_role)  # kept
    # Per projection over roles: n + 5 roles, n admitted, "a-b"/"a_b" collide once.
    role_projections = sum(1 for p in PROJECTIONS if p.fold and p.fold[0] == "role" and "phase" not in p.fold)
    assert families[REFUSED] >= 5 * role_projections


def test_verdict_codes_come_from_the_model_list() -> None:
    state = _state()
    legend = json.loads(WandbPage(SidecarCollector(state)).legend())
    assert legend["verdict_codes"] == {str(code): name for name, code in VERDICT_CODES.items()}
    assert {"dflash_verdict_code", "dflash_role_drafter_batches_per_second"} <= set(legend["families"])


def test_route_serves_the_page_and_its_legend() -> None:
    state = _state()
    addr = f"127.0.0.1:{free_port()}"
    server, _ = serve(state, addr)
    try:
        with urllib.request.urlopen(wandb_metrics.page_url(addr), timeout=5) as resp:
            text = resp.read().decode()
        assert "dflash_role_drafter_batches_per_second" in text and "dflash_pipeline_batches_per_second" not in text
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as resp:
            assert "dflash_pipeline_batches_per_second" in resp.read().decode()

        class Config:
            def __init__(self) -> None:
                self.items: dict[str, Any] = {}

            def update(self, items: dict[str, Any], allow_val_change: bool = False) -> None:
                self.items.update(items)

        class Run:
            config = Config()

        thread = wandb_metrics.describe_run(Run(), addr)
        assert thread is not None
        thread.join(10)
        assert Run.config.items[wandb_metrics.CONFIG_KEY]["8"] == "input-bound"
    finally:
        server.shutdown()
        server.server_close()


def test_helper_never_raises_into_the_trainer(monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    environ = {"WANDB_X_STATS_OPEN_METRICS_ENDPOINTS": "not json"}
    assert wandb_metrics.enable_in_environment(environ=environ) is False
    assert environ == {"WANDB_X_STATS_OPEN_METRICS_ENDPOINTS": "not json"}  # left as the trainer set it

    class Finished:
        class config:  # noqa: N801 - a run's attribute
            @staticmethod
            def update(*args: Any, **kwargs: Any) -> None:
                raise RuntimeError("run finished")

    monkeypatch.setattr(wandb_metrics, "DESCRIBE_GIVE_UP_S", 0.5)
    monkeypatch.setattr(wandb_metrics, "DESCRIBE_RETRY_S", (0.1,))
    absent = wandb_metrics.describe_run(Finished(), f"127.0.0.1:{free_port()}")  # no daemon there
    assert absent is not None
    absent.join(5)
    assert not absent.is_alive() and "could not name the verdict codes in the W&B run from" in caplog.text
    addr = f"127.0.0.1:{free_port()}"
    server, _ = serve(_state(), addr)
    try:
        finished = wandb_metrics.describe_run(Finished(), addr)  # the daemon answers, the run refuses
        assert finished is not None
        finished.join(5)
        assert not finished.is_alive() and "run finished" in caplog.text
    finally:
        server.shutdown()
        server.server_close()


def test_metrics_md_lists_every_family_of_the_page() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "METRICS.md").read_text()
    section = text.split("## The W&B open-metrics page", 1)[1].split("\n## ", 1)[0]
    missing = [t for t in [*family_templates(), REFUSED] if f"`{t}`" not in section]
    assert missing == []


def test_default_address_is_the_daemons() -> None:
    assert wandb_metrics.DEFAULT_ADDR == Config().prometheus_addr


def test_settings_are_accepted_by_wandb_and_keep_the_trainers_own() -> None:
    wandb = pytest.importorskip("wandb")
    settings = wandb.Settings(**wandb_metrics.open_metrics_settings("127.0.0.1:9500"))
    assert settings.x_stats_open_metrics_endpoints == {"sidecar": "http://127.0.0.1:9500/metrics/wandb"}
    assert settings.x_stats_open_metrics_filters is None  # none: W&B takes every family of the page
    own = {"x_stats_open_metrics_endpoints": {"dcgm": "http://127.0.0.1:9400/metrics"},
           "x_stats_open_metrics_filters": ["^dcgm\\.DCGM_FI_DEV_GPU_UTIL"]}
    merged = wandb.Settings(**{**own, **wandb_metrics.open_metrics_settings(base=own)})
    assert merged.x_stats_open_metrics_endpoints == {"dcgm": "http://127.0.0.1:9400/metrics",
                                                     "sidecar": "http://127.0.0.1:9478/metrics/wandb"}
    patterns = list(merged.x_stats_open_metrics_filters)
    # wandb-core matches each pattern against "<endpoint>.<family>" (Go regexp.MatchString).
    assert any(re.search(p, "sidecar.dflash_verdict_code") for p in patterns)
    assert any(re.search(p, "dcgm.DCGM_FI_DEV_GPU_UTIL") for p in patterns)
    assert not any(re.search(p, "dcgm.DCGM_FI_DEV_POWER_USAGE") for p in patterns)
    mapping = wandb_metrics.open_metrics_settings(base={"x_stats_open_metrics_filters": {"dcgm\\..*": {"gpu": "0"}}})
    proto = wandb.Settings(**mapping).to_proto()  # an entry without label filters would vanish here
    assert dict(proto.x_stats_open_metrics_filters.mapping.value["^sidecar\\."].value) == {"host": ".*"}


def test_environment_reaches_wandb_settings() -> None:
    wandb = pytest.importorskip("wandb")
    environ = {"WANDB_X_STATS_OPEN_METRICS_ENDPOINTS": json.dumps({"dcgm": "http://127.0.0.1:9400/metrics"})}
    wandb_metrics.enable_in_environment("127.0.0.1:9501", environ=environ)
    settings = wandb.Settings()
    settings.update_from_env_vars(environ)
    assert settings.x_stats_open_metrics_endpoints == {"dcgm": "http://127.0.0.1:9400/metrics",
                                                       "sidecar": "http://127.0.0.1:9501/metrics/wandb"}
    assert "WANDB_X_STATS_OPEN_METRICS_FILTERS" not in environ


@pytest.mark.parametrize("framework", ["hf", "lightning"])
def test_callbacks_opt_in(framework: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    module = importlib.import_module(f"trainer_shim.integrations.{framework}")
    key = "WANDB_X_STATS_OPEN_METRICS_ENDPOINTS"
    monkeypatch.setenv(key, "{}")
    monkeypatch.delenv(key)  # both recorded: whatever the callback sets is undone after the test
    module.SidecarCallback()
    assert key not in os.environ  # off by default
    module.SidecarCallback(wandb_open_metrics="127.0.0.1:9502")
    assert json.loads(os.environ[key]) == {"sidecar": "http://127.0.0.1:9502/metrics/wandb"}
