"""The insight in every output: Prometheus (promtool-clean), the W&B row, the console line,
``top``, the settings, and the daemon's per-window wiring."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import tempfile

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sidecar.aggregation.insight import compute_insight
from sidecar.aggregation.settings import InsightSettings
from sidecar.cli.top import render, samples_of
from sidecar.core import config as config_mod
from sidecar.core import pipeline as pipeline_mod
from sidecar.core.config import Config, ConfigError
from sidecar.core.daemon import Daemon
from sidecar.exporters.base import Exporter
from sidecar.exporters.console import ConsoleExporter
from sidecar.exporters.prometheus.collector import ExportState, SidecarCollector
from sidecar.exporters.wandb.insight_row import insight_row
from sidecar.model.insight import VERDICTS, GpuFacts
from sidecar.model.window import IngestReport
from tests.insight_synth import category, counter, gauge, pipeline, report

TARGET = {"data_wait": 4, "forward": 30, "pack": 3, "queue_put_wait": 30}
DRAFTER = {"queue_wait": 0.5, "forward": 20, "backward": 40, "optimizer": 8}


def drafter_bound_report():
    rep = pipeline(TARGET, DRAFTER, queue_fill=1.0)
    extra = [counter("drafter", "0", "loss_tokens", 5000), category("drafter", "0", "bucket", {"0": 3, "1": 3}),
             gauge("drafter", "0", "prefetch_depth", 1.0), gauge("drafter", "0", "prefetch_capacity", 2.0)]
    return report(list(rep.window.series) + extra)


def with_insight(rep: IngestReport, gpus: GpuFacts | None = None) -> IngestReport:
    """``rep`` as the daemon hands it on: with its window's insight."""
    return dataclasses.replace(rep, insight=compute_insight(rep.window, gpus=gpus))


def registry_for(state: ExportState) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SidecarCollector(state))
    return registry


def test_prometheus_families() -> None:
    assert registry_for(ExportState("box", 0.0)).get_sample_value(
        "dflash_pipeline_bottleneck", {"host": "box", "verdict": "unknown"}) is None  # before the first window
    reg = registry_for(ExportState("box", 0.0, report=with_insight(drafter_bound_report())))
    get = reg.get_sample_value
    for name in VERDICTS:
        assert get("dflash_pipeline_bottleneck", {"host": "box", "verdict": name}) == (name == "drafter-bound")
    assert get("dflash_pipeline_batches_per_second", {"host": "box", "role": "drafter"}) > 0
    assert get("dflash_pipeline_tokens_per_second", {"host": "box", "role": "target"}) > 0
    assert get("dflash_pipeline_worker_batches_per_second", {"host": "box", "role": "drafter", "worker": "1"}) > 0
    assert get("dflash_pipeline_worker_score_ratio", {"host": "box", "role": "drafter", "worker": "1"}) == 1.0
    assert get("dflash_pipeline_straggler", {"host": "box", "role": "drafter", "worker": "1"}) == 0.0
    assert get("dflash_pipeline_rate_cv_ratio", {"host": "box", "role": "target"}) == 0.0
    assert get("dflash_pipeline_queue_fill_ratio", {"host": "box"}) == 1.0
    assert get("dflash_pipeline_prefetch_fill_ratio", {"host": "box"}) == 0.5
    assert get("dflash_pipeline_bucket_entropy", {"host": "box"}) == 1.0
    assert get("dflash_pipeline_time_share_ratio", {"host": "box", "role": "target", "phase": "queue_put_wait"}) > 0.4
    for name in ("ready_deficit_ratio", "target_drafter_batch_ratio", "batch_tokens_mean", "loss_token_ratio"):
        assert get("dflash_pipeline_" + name, {"host": "box"}) is not None, name


def test_prometheus_omits_what_the_trainer_does_not_publish() -> None:
    reg = registry_for(ExportState("box", 0.0, report=with_insight(report([counter("drafter", "0", "batches", 3)]))))
    assert reg.get_sample_value("dflash_pipeline_queue_fill_ratio", {"host": "box"}) is None
    assert reg.get_sample_value("dflash_pipeline_bottleneck", {"host": "box", "verdict": "unknown"}) == 1.0


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_exposition_passes_promtool() -> None:
    rep = with_insight(drafter_bound_report(), GpuFacts({"0": frozenset({"hw_slowdown"})}))
    text = generate_latest(registry_for(ExportState("box", 0.0, report=rep)))
    assert b"dflash_pipeline_bottleneck{" in text
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, timeout=30, check=False)
    assert result.returncode == 0 and result.stdout == b"" and result.stderr == b"", result


def test_wandb_row_is_flat_floats() -> None:
    insight = compute_insight(drafter_bound_report().window)
    row = insight_row(insight)
    assert all(isinstance(k, str) and isinstance(v, float) for k, v in row.items())
    assert row["pipeline/verdict_code"] == 3.0 and row["pipeline/bottleneck/drafter-bound"] == 1.0
    assert row["pipeline/evidence/target.queue_put_wait"] == pytest.approx(30 / 67)
    assert row["pipeline/tokens_per_s/drafter"] > 0 and row["pipeline/batches_per_s/target"] > 0
    assert row["pipeline/time_share/drafter/backward"] > 0.5
    assert row["pipeline/worker/drafter/0/score"] == pytest.approx(1.0)
    assert row["pipeline/queue_fill"] == 1.0 and row["pipeline/bucket_entropy_bits"] == 1.0
    assert "pipeline/rate_cv/target" in row and row["pipeline/throttled_gpus"] == 0.0
    assert "pipeline/queue_fill" not in insight_row(compute_insight(report([]).window))


def test_console_line_carries_verdict_and_evidence() -> None:
    rep = drafter_bound_report()
    console = ConsoleExporter()
    assert "verdict" not in console.line(rep)  # no insight attached yet
    line = console.line(with_insight(rep))
    assert "verdict drafter-bound (target.queue_put_wait=0.45 queue_fill=1.00" in line
    assert "drafter " in line and "b/s" in line and "queue fill 1.00" in line


def test_settings() -> None:
    cfg = config_mod.load({})
    assert config_mod.section(InsightSettings, cfg) == InsightSettings()  # one set of defaults
    cfg = config_mod.load({"insight_starved_ratio": "0.3", "insight_throttle_reasons": ["sw_power_cap"],
                           "insight_drafter_role": "student"})
    settings = config_mod.section(InsightSettings, cfg)
    assert settings.starved_ratio == 0.3 and settings.throttle_reasons == ("sw_power_cap",)
    assert settings.drafter_role == "student"
    with pytest.raises(ConfigError, match="insight_straggler_score"):
        config_mod.load({"insight_straggler_score": "1.5"})
    sample = config_mod.sample_toml()
    assert "# insight_starved_ratio = 0.15" in sample and "insight_throttle_reasons" in sample


class Recorder(Exporter):
    """An exporter that keeps every report it is given."""

    def __init__(self) -> None:
        self.reports: list[IngestReport] = []

    def consume(self, report: IngestReport) -> None:
        self.reports.append(report)


def daemon_with_facts(facts) -> tuple[Daemon, Recorder]:
    daemon = Daemon(Config(state_dir=tempfile.mkdtemp(prefix="ledger-")), host="box")  # the run ledger's file
    daemon.gpus.facts = facts  # type: ignore[method-assign]  # what the window's GPU stage reads
    recorder = Recorder()
    daemon.pipeline.listeners.append(recorder)
    return daemon, recorder


def on_window(daemon: Daemon, report: IngestReport) -> None:
    """What the pipeline does with a window the window stage made: its stages, then the fan-out."""
    daemon.pipeline.fan_out(daemon.pipeline.finish(report))


def test_daemon_computes_the_insight_once_per_window() -> None:
    hot = GpuFacts({"6": frozenset({"hw_thermal_slowdown"})}, {"6": "drafter"})
    daemon, recorder = daemon_with_facts(lambda *_: hot)
    rep = drafter_bound_report()
    on_window(daemon, rep)
    [report] = recorder.reports
    assert report.insight is not None and report.insight.verdict.name == "throttled"
    assert rep.insight is None and report.window is rep.window  # the ingest's report is not mutated
    assert daemon.prometheus.state.report is report  # every exporter gets the same window
    text = generate_latest(registry_for(daemon.prometheus.state)).decode()
    assert 'dflash_pipeline_bottleneck{host="box",verdict="throttled"} 1.0' in text
    assert "verdict throttled" in ConsoleExporter().line(report)


def test_daemon_survives_a_failing_insight(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object) -> GpuFacts:
        raise RuntimeError("nvml wedged")

    daemon, recorder = daemon_with_facts(broken)
    rep = drafter_bound_report()
    on_window(daemon, rep)  # the GPUs' reading fails: the window goes on, its insight without GPUs
    assert recorder.reports[0].insight is not None and recorder.reports[0].gpu.facts is None  # type: ignore[union-attr]
    monkeypatch.setattr(pipeline_mod, "compute_insight", broken)
    on_window(daemon, rep)  # the insight fails: the raw exports go on
    report = recorder.reports[1]
    assert report.insight is None and report.window is rep.window and daemon.insight.failures == 1
    assert daemon.prometheus.state.report is report


def test_explain_names_the_gpu_input_the_latest_windows_insight_lacked() -> None:
    """``/explain`` says why the insight lacked GPU data from the latest window's GPU part (what
    that insight read), not from the GPUs at the time of the request."""
    facts: list[GpuFacts | None] = [GpuFacts(roles={"0": "drafter"}, busy={"0": 0.9})]
    daemon, _ = daemon_with_facts(lambda *_: facts[-1])

    def gpu_inputs() -> list[str]:
        missing = daemon.scrape_state.explain()["missing"]  # type: ignore[index]
        return [item["input"] for lack in missing.values() for item in lack if item["input"].startswith("GPU ")]

    assert gpu_inputs() == ["GPU busy share (no window yet)", "GPU clock-event reasons (no window yet)"]
    on_window(daemon, drafter_bound_report())
    facts.append(None)  # the GPUs now: no reading; the latest window's insight had one
    assert gpu_inputs() == []
    on_window(daemon, drafter_bound_report())
    assert [i.split(" (")[0] for i in gpu_inputs()] == ["GPU busy share", "GPU clock-event reasons"]
    assert all(" (NVML " in i for i in gpu_inputs())
    off = Daemon(Config(state_dir=tempfile.mkdtemp(prefix="ledger-"), gpu_metrics=False), host="box")
    assert "GPU busy share (NVML disabled: --no-gpu-metrics)" in str(off.scrape_state.explain())


def test_top_shows_verdict_queue_and_roles() -> None:
    from rich.console import Console

    slow = {k: v * 3 for k, v in DRAFTER.items()}
    rep = with_insight(pipeline(TARGET, DRAFTER, queue_fill=1.0, drafter_override={"0": slow}))
    text = generate_latest(registry_for(ExportState("box", 0.0, report=rep))).decode()
    samples = samples_of(text)
    console = Console(width=160, record=True)
    console.print(render(samples))
    out = console.export_text()
    assert "bottleneck: straggler" in out and "queue fill 100%" in out
    assert "pipeline roles" in out and "queue_put_wait" in out and "yes" in out


def test_thresholds_come_from_flags_and_are_reloadable(tmp_path) -> None:
    from sidecar.cli.main import build_parser

    ns = build_parser().parse_args(["run", "--insight-starved-ratio", "0.2", "--insight-throttle-reasons",
                                    "hw_slowdown"])
    loaded = config_mod.load(config_mod.given(vars(ns)))
    assert loaded.throttle_reasons == ("hw_slowdown",) and loaded.starved_ratio == 0.2
    with pytest.raises(ConfigError, match="invalid --insight-throttle-reasons: 'x': expected one of gpu_idle"):
        config_mod.load({"insight_throttle_reasons": ["x"]})  # a typo would never match a reason
    path = tmp_path / "sidecar.toml"
    path.write_text("insight_starved_ratio = 0.2\n")
    daemon = Daemon(config_mod.load({"config_file": str(path)}), host="box")
    recorder = Recorder()
    daemon.pipeline.listeners.append(recorder)
    rep = pipeline({"forward": 80}, {"queue_wait": 15, "forward": 10, "backward": 20})  # ready deficit 1/3
    on_window(daemon, rep)
    insight = recorder.reports[-1].insight
    assert insight is not None and insight.verdict.name == "target-bound"
    path.write_text("insight_starved_ratio = 0.5\n")
    daemon.reload()
    assert daemon.config.starved_ratio == 0.5
    for _ in range(2):  # hysteresis: a change of low confidence takes two windows
        rep = pipeline({"forward": 80}, {"queue_wait": 15, "forward": 10, "backward": 20})
        on_window(daemon, rep)
    insight = recorder.reports[-1].insight
    assert insight is not None and insight.verdict.name == "balanced"
