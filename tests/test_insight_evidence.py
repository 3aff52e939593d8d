"""The verdict's evidence rules on synthetic windows: GPU readings first, host time measured and
never a residual, unmapped time named but never deciding, senders weighed by the part of the
window they were alive, and ``idle`` without a live trainer."""

from __future__ import annotations

import dataclasses

import pytest

from sidecar.aggregation.insight import compute_insight
from sidecar.aggregation.settings import InsightSettings
from sidecar.aggregation.verdict import Hysteresis, confidence
from sidecar.core.pipeline import GpuStage
from sidecar.model.insight import GpuFacts, Verdict
from sidecar.model.window import IngestReport, SeriesView
from tests.insight_synth import gauge, report, sender, timing, worker

STEP = {"data_wait": 3, "forward": 14, "backward": 24, "optimizer": 5}


def verdict(rep: IngestReport, gpus: GpuFacts | None = None) -> Verdict:
    return compute_insight(rep.window, None, gpus, rep.senders).verdict


def snapshot(role: str, w: str, name: str, mean_ms: float, meaning: str) -> SeriesView:
    """A ``publish()`` profile entry: a per-batch mean once per interval."""
    window = {"count": 1.0, "sum": mean_ms, "mean": mean_ms, "p50": mean_ms, "p95": mean_ms, "max": mean_ms}
    return SeriesView(1, name, role, w, window, {"count": 1, "sum_s": mean_ms / 1000}, meaning, True, name,
                      "preset generic" if meaning else "")


def unmapped(view: SeriesView) -> SeriesView:
    return dataclasses.replace(view, meaning="", rule="")


def test_busy_gpus_are_compute_bound_whatever_the_host_shares_say() -> None:
    # the HF Trainer report: the loop leaves most of its step untimed, the GPUs read 97 %
    rep = report(worker("trainer", "0", {"data_wait": 2, "optimizer": 4}, 20))
    v = verdict(rep, GpuFacts(busy={"0": 0.97}))
    assert v.name == "compute-bound" and dict(v.evidence)["gpu_busy"] == pytest.approx(0.97)
    # with data waits over their threshold too: the GPUs, not the loader, are the limit
    rep = report(worker("trainer", "0", STEP | {"data_wait": 40}, 11))
    assert verdict(rep, GpuFacts(busy={"0": 0.96})).name == "compute-bound"
    # idle GPUs: the largest idle cause decides
    assert verdict(rep, GpuFacts(busy={"0": 0.3})).name == "input-bound"
    # a slow rank on busy GPUs costs no GPU time: compute-bound, not straggler; idle GPUs: straggler
    ranks = worker("trainer", "0", STEP, 10) + worker("trainer", "1", {k: v * 2 for k, v in STEP.items()}, 5)
    assert verdict(report(ranks), GpuFacts(busy={"0": 0.97, "1": 0.97})).name == "compute-bound"
    assert verdict(report(ranks), GpuFacts(busy={"0": 0.5, "1": 0.5})).name == "straggler"


def test_a_rank_waiting_in_its_all_reduce_on_busy_gpus_is_communication_bound() -> None:
    # DDP: 57 % of each step in the all-reduce; NCCL's kernels spin, NVML reads the GPUs 96 % busy
    ddp = report(worker("trainer", "0", {"data_wait": 1, "forward": 10, "backward": 14, "comm_wait": 57}, 10))
    v = verdict(ddp, GpuFacts(busy={"0": 0.96}))  # utilization alone: the trainer's comm_wait decides
    assert v.name == "communication-bound" and "no GPM SM activity" in v.detail, v
    assert dict(v.evidence)["trainer.comm_wait"] == pytest.approx(0.57, abs=0.01)
    assert v.confidence == confidence(dict(v.evidence)["trainer.comm_wait"], InsightSettings().comm_wait_ratio)
    # GPM: SM activity 15 % read beside utilization 96 %
    v = verdict(ddp, GpuFacts(busy={"0": 0.15}, utilization={"0": 0.96}))
    assert v.name == "communication-bound" and "15% by GPM SM activity" in v.detail, v
    assert dict(v.evidence)["gpu_busy"] == 0.15 and dict(v.evidence)["gpu_utilization"] == 0.96
    # SM activity high too: the GPUs compute (collectives overlapped), whatever comm_wait says
    assert verdict(ddp, GpuFacts(busy={"0": 0.95}, utilization={"0": 0.99})).name == "compute-bound"
    # utilization alone with a comm_wait under its threshold: still compute-bound
    busy = report(worker("trainer", "0", {"data_wait": 1, "forward": 30, "backward": 50, "comm_wait": 10}, 10))
    assert verdict(busy, GpuFacts(busy={"0": 0.96})).name == "compute-bound"


def test_a_loop_without_phase_timings_is_judged_by_its_gpus_alone() -> None:
    # the HF Trainer's own logs (loss, grad norm, samples/s): no phase timing at all
    logs = [gauge("trainer", "0", "loss", 2.2), gauge("trainer", "0", "grad_norm", 1.3),
            gauge("trainer", "0", "samples_per_s", 160.0)]
    rep = report(logs)
    assert verdict(rep).name == "unknown"  # no GPU reading: nothing tells anything
    # a single-GPU box (no group, no process tied to a role): the one role's GPUs, busy
    v = verdict(rep, GpuFacts(busy={"0": 0.97}))
    assert v.name == "compute-bound" and v.evidence == (("gpu_busy", 0.97),), v
    assert v.confidence == confidence(0.97, 0.85) and "no phase timings" in v.detail
    # its GPU group 70 % idle: no false health, never a wait verdict; said as unexplained idle, the
    # detail naming the timings that would tell why
    gpus = GpuFacts(roles={"0": "trainer", "1": "trainer"}, busy={"0": 0.2, "1": 0.4})
    insight = compute_insight(rep.window, None, gpus, rep.senders)
    v = insight.verdict
    assert v.name == "unexplained-idle" and v.confidence == 1.0, v
    assert dict(v.evidence) == pytest.approx({"trainer.gpu_idle": 0.7, "trainer.unexplained": 0.7, "gpu_busy": 0.3,
                                              "trainer.unattributed": 0.7})
    assert "70% idle, 70% that no timing explains" in v.detail and "data wait" in v.detail
    assert insight.gpu_idle["trainer"]["unexplained"] == pytest.approx(0.7)
    # a little idle (20 %) stays balanced at a low confidence, its idle named unattributed
    little = verdict(rep, GpuFacts(roles={"0": "trainer"}, busy={"0": 0.8}))
    assert little.name == "balanced" and little.confidence == pytest.approx(0.4), little
    assert "20% idle that no timing explains" in little.detail and "data_wait_ms" in little.detail
    # a throttled GPU of the role still overrides
    hot = GpuFacts(clock_events={"0": frozenset({"hw_slowdown"})}, busy={"0": 0.97})
    assert verdict(rep, hot).name == "throttled"
    # GPUs of another role's group are not this loop's
    assert verdict(rep, GpuFacts(roles={"0": "eval"}, busy={"0": 0.97})).name == "unknown"
    # a live sender that sent nothing mapped yet (every name unmapped): its GPUs are still read
    quiet = report([], senders=(sender("trainer", "0"),))
    assert verdict(quiet, GpuFacts(busy={"0": 0.97})).name == "compute-bound"
    assert verdict(quiet, GpuFacts(roles={"0": "trainer"}, busy={"0": 0.97})).name == "compute-bound"
    gone = report(logs, senders=(sender("trainer", "0", last_seen_age_s=30.0),))
    assert verdict(gone, GpuFacts(busy={"0": 0.97})).name == "idle"


def test_untimed_work_is_not_host_time() -> None:
    # a loop that times only its data wait and optimizer (no forward/backward): the gap is the
    # model's own untimed work, not host overhead
    rep = report(worker("trainer", "0", {"data_wait": 2, "optimizer": 4}, 20))
    v = verdict(rep)
    assert v.name == "balanced" and "not host time" in v.detail
    gap = compute_insight(rep.window, None, GpuFacts(busy={"0": 0.4}), rep.senders).gpu_idle["trainer"]
    assert gap["host"] == 0 and gap["unexplained"] == pytest.approx(0.6 - 0.04, abs=0.01)
    # the same with its compute timed and a real gap: host-bound
    rep = report(worker("trainer", "0", STEP, 10))  # 46 of 100 ms timed
    v = verdict(rep)
    assert v.name == "host-bound" and dict(v.evidence)["trainer.other"] == pytest.approx(0.54)


def test_unmapped_timings_are_unattributed_and_named_never_host_bound() -> None:
    # every moment of the step timed, the optimizer under a name no preset knows (~40 %)
    phases = {"data_wait": 5, "forward": 20, "backward": 35}
    series = worker("trainer", "0", phases, 10) + [unmapped(timing("trainer", "0", "t_update_ms", 40, 10))]
    v = verdict(report(series))
    assert v.name == "balanced", v
    assert dict(v.evidence)["trainer.unattributed"] == pytest.approx(0.4)
    assert "40% of the step in t_update_ms, unmapped: add a rule" in v.detail
    assert v.confidence <= 0.6
    # snapshots: the same loop publishing per-batch means with its step
    snap = [snapshot("trainer", "0", f"{p}_ms", ms, p) for p, ms in phases.items()]
    snap += [snapshot("trainer", "0", "t_update_ms", 40, ""), snapshot("trainer", "0", "step_ms", 101, "step")]
    insight = compute_insight(report(snap).window, None, None, report(snap).senders)
    assert insight.verdict.name == "balanced"
    assert insight.roles["trainer"].time_share["other"] == pytest.approx(0.01, abs=0.001)
    assert insight.roles["trainer"].unmapped == pytest.approx({"t_update_ms": 40 / 101})


def test_the_first_and_last_windows_count_the_part_the_sender_was_alive() -> None:
    # the loop ran back to back (no host gap) for 0.3 s of the window, then exited
    phases = {"data_wait": 5, "forward": 20, "backward": 20, "optimizer": 5}
    series = worker("trainer", "0", phases, 6)  # 300 ms of work
    last = report(series, senders=(sender("trainer", "0", last_seen_age_s=0.7),))
    insight = compute_insight(last.window, None, None, last.senders)
    assert insight.verdict.name == "balanced", insight.verdict
    assert insight.roles["trainer"].time_share["other"] == pytest.approx(0.0, abs=0.01)
    first = report(series, senders=(sender("trainer", "0", first_seen_age_s=0.3),))
    assert verdict(first).name == "balanced"
    # without the accounting (0 s alive told nowhere) the same window reads 70 % untimed
    assert compute_insight(last.window).verdict.name == "host-bound"


def test_no_live_sender_is_idle_and_hysteresis_takes_it_at_once() -> None:
    rep = report(worker("trainer", "0", STEP, 10), senders=(sender("trainer", "0", last_seen_age_s=30.0),))
    v = verdict(rep)
    assert v.name == "idle" and v.detail == "no live trainer" and v.code == 11
    assert verdict(report([], senders=())).name == "idle"
    h = Hysteresis()
    h.update(Verdict("host-bound", confidence=1.0))
    assert h.update(v).name == "idle"
    assert h.update(Verdict("input-bound", confidence=0.6)).name == "input-bound"  # after idle: at once


def _screen(rep: IngestReport) -> tuple[str, str, str]:
    """(console line, /metrics text, ``top`` frame) for one window as the daemon exports it."""
    from prometheus_client import CollectorRegistry, generate_latest
    from rich.console import Console

    from sidecar.cli.top import render, samples_of
    from sidecar.exporters.console import ConsoleExporter
    from sidecar.exporters.prometheus.collector import ExportState, SidecarCollector

    window = dataclasses.replace(rep, insight=compute_insight(rep.window, None, None, rep.senders))
    registry = CollectorRegistry()
    registry.register(SidecarCollector(ExportState("box", 0.0, report=window)))
    text = generate_latest(registry).decode()
    samples = samples_of(text)
    console = Console(width=160, record=True)
    console.print(render(samples))
    return ConsoleExporter().line(window), text, console.export_text()


def test_idle_and_the_first_window_show_no_confidence_and_no_nan() -> None:
    gone = report(worker("trainer", "0", STEP, 10), senders=(sender("trainer", "0", last_seen_age_s=30.0),))
    line, text, top = _screen(gone)
    assert "verdict idle (no live trainer)" in line and "confidence" not in line
    assert 'dflash_pipeline_bottleneck{host="box",verdict="idle"} 1.0' in text
    assert "dflash_pipeline_verdict_confidence_ratio{" not in text
    assert "bottleneck: idle (no live trainer)" in top and "confidence" not in top and "nan" not in top.lower()
    line, text, top = _screen(report([], senders=(sender("trainer", "0"),)))  # a first window: nothing mapped yet
    assert "verdict unknown" in line and "confidence" not in line
    assert "bottleneck: unknown" in top and "confidence" not in top and "nan" not in top.lower()
    _, _, top = _screen(report(worker("trainer", "0", STEP, 10)))
    assert "bottleneck: host-bound (confidence" in top and "nan" not in top.lower()


def test_gpu_busy_is_the_mean_over_the_window_not_the_last_poll() -> None:
    from sidecar.aggregation.gpu_groups import GpuAggregates, GpuGroups
    from sidecar.model.gpu import GpuReading, GpuSnapshot

    def poll(t: float, util: float, sm: float | None = None) -> GpuSnapshot:
        return GpuSnapshot(t, 0.001, 3, (GpuReading(0, "GPU-0", "fake", utilization_ratio=util,
                                                    sm_activity_ratio=sm),))

    polls = (poll(1.0, 0.2), poll(2.0, 0.2), poll(3.0, 0.2), poll(4.0, 0.98))  # busy only at the last poll
    asked: list[float] = []

    def recent(seconds: float) -> tuple[GpuSnapshot, ...]:
        asked.append(seconds)
        return polls

    gpus = GpuAggregates(GpuGroups.parse(["trainer=0"]), lambda: polls[-1], None, recent)
    facts = gpus.facts(4.0)
    assert facts is not None and facts.busy["0"] == pytest.approx(0.395) and asked == [4.0]
    assert gpus.facts().busy["0"] == pytest.approx(0.98)  # type: ignore[union-attr]  # no window: latest poll
    sm = GpuAggregates(GpuGroups.parse(()), lambda: poll(2.0, 1.0, 0.5), None,
                       lambda s: (poll(1.0, 1.0, 0.3), poll(2.0, 1.0, 0.5)))
    assert sm.facts(2.0).busy["0"] == pytest.approx(0.4)  # type: ignore[union-attr]  # GPM SM activity first
    # the window's GPU stage reads them over the window, into the report; the insight reads the report
    window = GpuStage(gpus)(report(worker("trainer", "0", STEP, 10), duration_s=4.0))
    facts = window.gpu.facts if window.gpu is not None else None
    assert facts is not None and facts.busy["0"] == pytest.approx(0.395)
    assert asked == [4.0, 4.0] and gpus.view().facts is None  # a view between windows has none


def test_the_insight_reads_the_gpus_from_the_window_report() -> None:
    from sidecar.core.pipeline import InsightStage
    from sidecar.model.gpu import NVML_DISABLED, GpuView

    hot = GpuView(None, NVML_DISABLED, facts=GpuFacts(clock_events={"0": frozenset({"hw_slowdown"})}))
    window = report(worker("trainer", "0", STEP, 10))
    stage = InsightStage(InsightSettings())
    assert stage(dataclasses.replace(window, gpu=hot)).insight.throttled_gpus == {"0": ("hw_slowdown",)}  # type: ignore[union-attr]
    assert not stage(window).insight.throttled_gpus  # type: ignore[union-attr]  # no GPU part: none
