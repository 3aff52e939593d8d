"""The bottleneck verdict rules, one synthetic window per case (throttled: synthetic GPU facts)."""

from __future__ import annotations

import dataclasses

import pytest

from sidecar.aggregation.insight import compute_insight
from sidecar.aggregation.settings import InsightSettings
from sidecar.model.insight import VERDICT_CODES, GpuFacts, Verdict
from tests.insight_synth import gauge, pipeline, report, worker

# ms per batch; shares follow from the cycle (e.g. target 4+30+3+3 = 40 ms: forward 0.75).
TARGET = {"data_wait": 4, "forward": 30, "pack": 3, "queue_put_wait": 3}
DRAFTER = {"queue_wait": 1, "forward": 8, "backward": 14, "optimizer": 4}


def verdict_of(rep, settings=None, gpus=None) -> Verdict:
    return compute_insight(rep.window, settings, gpus).verdict


def evidence(v: Verdict) -> dict[str, float]:
    return dict(v.evidence)


def test_balanced_when_neither_side_waits() -> None:
    v = verdict_of(pipeline(TARGET, DRAFTER, queue_fill=0.9))
    assert v.name == "balanced" and v.code == VERDICT_CODES["balanced"]
    assert set(evidence(v)) == {"ready_deficit", "target.queue_put_wait", "queue_fill"}


def test_target_bound() -> None:
    v = verdict_of(pipeline({"data_wait": 4, "forward": 80, "pack": 3}, DRAFTER | {"queue_wait": 30},
                            queue_fill=0.1))
    assert v.name == "target-bound"
    ev = evidence(v)
    assert ev["ready_deficit"] == pytest.approx(30 / 56) and ev["target.forward"] == pytest.approx(80 / 87)


def test_drafter_bound() -> None:
    v = verdict_of(pipeline(TARGET | {"queue_put_wait": 60}, {"forward": 20, "backward": 40, "optimizer": 8},
                            queue_fill=1.0))
    assert v.name == "drafter-bound"
    assert evidence(v)["target.queue_put_wait"] == pytest.approx(60 / 97)


def test_drafter_bound_from_queue_fill_without_put_wait_timing() -> None:
    target = {"forward": 30, "pack": 3}
    assert verdict_of(pipeline(target, DRAFTER, queue_fill=0.95)).name == "drafter-bound"
    assert verdict_of(pipeline(target, DRAFTER, queue_fill=0.5)).name == "balanced"


def test_queue_starved_by_slow_handoff() -> None:
    v = verdict_of(pipeline({"data_wait": 4, "forward": 30, "pack": 45}, DRAFTER | {"queue_wait": 30}))
    assert v.name == "queue-starved" and evidence(v)["target.pack"] == pytest.approx(45 / 79)


def test_queue_starved_when_both_sides_wait() -> None:
    v = verdict_of(pipeline(TARGET | {"queue_put_wait": 20}, DRAFTER | {"queue_wait": 20}))
    assert v.name == "queue-starved" and "queue too small" in v.detail


def test_queue_starved_without_target_timings() -> None:
    rep = report(worker("drafter", "0", DRAFTER | {"queue_wait": 40}, 10))
    v = verdict_of(rep)
    assert v.name == "queue-starved" and v.detail == "no target timings"


def test_input_bound_targets_wait_on_data() -> None:
    # one word, one meaning: the data loader is input-bound in the DFlash rules too (was host-bound)
    v = verdict_of(pipeline({"data_wait": 60, "forward": 30, "pack": 3}, DRAFTER | {"queue_wait": 30}))
    assert v.name == "input-bound" and evidence(v)["target.data_wait"] == pytest.approx(60 / 93)
    assert v.detail == "formerly host-bound"


def test_input_bound_drafters_wait_on_data() -> None:
    v = verdict_of(pipeline(TARGET | {"queue_put_wait": 30}, DRAFTER | {"data_wait": 20}))
    assert v.name == "input-bound" and "drafter.data_wait" in evidence(v)


def test_straggler_in_the_limiting_role() -> None:
    slow = {k: v * 2.5 for k, v in DRAFTER.items()}
    v = verdict_of(pipeline(TARGET | {"queue_put_wait": 15}, DRAFTER, drafter_override={"0": slow}))
    assert v.name == "straggler" and "drafter/0" in v.detail
    assert evidence(v)["drafter.0.score"] == pytest.approx(0.4, rel=0.05)


def test_straggler_outside_the_limiting_role_does_not_decide() -> None:
    # Drafters starve because targets are slow; a slow drafter is not what limits the run.
    slow = {k: v * 2.5 for k, v in DRAFTER.items()}
    v = verdict_of(pipeline({"forward": 80}, DRAFTER | {"queue_wait": 30}, drafter_override={"0": slow}))
    assert v.name == "target-bound"


def test_throttled_gpu_of_the_limiting_role() -> None:
    rep = pipeline({"forward": 80}, DRAFTER | {"queue_wait": 30})
    gpus = GpuFacts({"0": frozenset({"hw_thermal_slowdown"}), "6": frozenset()}, {"0": "target", "6": "drafter"})
    v = verdict_of(rep, gpus=gpus)
    assert v.name == "throttled" and v.code == VERDICT_CODES["throttled"]
    assert evidence(v)["throttled_gpus"] == 1.0 and "gpu0:hw_thermal_slowdown" in v.detail
    assert "otherwise target-bound" in v.detail
    assert compute_insight(rep.window, gpus=gpus).throttled_gpus == {"0": ("hw_thermal_slowdown",)}


def test_throttled_gpu_of_another_role_does_not_decide() -> None:
    rep = pipeline({"forward": 80}, DRAFTER | {"queue_wait": 30})
    gpus = GpuFacts({"6": frozenset({"hw_slowdown"})}, {"6": "drafter"})
    assert verdict_of(rep, gpus=gpus).name == "target-bound"


def test_throttled_gpu_of_unknown_role_or_balanced_pipeline() -> None:
    gpus = GpuFacts({"3": frozenset({"sw_thermal_slowdown"})})
    assert verdict_of(pipeline({"forward": 80}, DRAFTER | {"queue_wait": 30}), gpus=gpus).name == "throttled"
    balanced = pipeline(TARGET, DRAFTER, queue_fill=0.9)
    assert verdict_of(balanced, gpus=GpuFacts({"7": frozenset({"hw_slowdown"})}, {"7": "drafter"})).name == "throttled"


def test_benign_clock_events_are_not_throttling() -> None:
    gpus = GpuFacts({"0": frozenset({"gpu_idle", "sw_power_cap", "applications_clocks_setting"})})
    assert verdict_of(pipeline(TARGET, DRAFTER, queue_fill=0.9), gpus=gpus).name == "balanced"
    settings = InsightSettings(throttle_reasons=frozenset({"sw_power_cap"}))
    assert verdict_of(pipeline(TARGET, DRAFTER, queue_fill=0.9), settings, gpus).name == "throttled"


def test_throttled_takes_precedence_over_straggler() -> None:
    slow = {k: v * 2.5 for k, v in DRAFTER.items()}
    rep = pipeline(TARGET | {"queue_put_wait": 15}, DRAFTER, drafter_override={"0": slow})
    v = verdict_of(rep, gpus=GpuFacts({"6": frozenset({"hw_thermal_slowdown"})}, {"6": "drafter"}))
    assert v.name == "throttled"


def test_thresholds_are_configurable() -> None:
    rep = pipeline(TARGET, DRAFTER | {"queue_wait": 4}, queue_fill=0.5)  # ready deficit 4/30
    assert verdict_of(rep).name == "balanced"
    assert verdict_of(rep, InsightSettings(starved_ratio=0.1)).name == "target-bound"
    slow = {k: v * 1.25 for k, v in DRAFTER.items()}
    rep = pipeline(TARGET | {"queue_put_wait": 15}, DRAFTER, drafter_override={"0": slow})
    assert verdict_of(rep).name == "drafter-bound"  # score 0.8 >= 0.7
    assert verdict_of(rep, InsightSettings(straggler_score=0.9)).name == "straggler"


def test_role_names_are_configurable() -> None:
    rep = pipeline({"forward": 80}, DRAFTER | {"queue_wait": 30}, roles=("teacher", "student"))
    assert verdict_of(rep).name not in ("target-bound", "drafter-bound", "queue-starved")  # single-role rules
    settings = InsightSettings(target_role="teacher", drafter_role="student")
    v = verdict_of(rep, settings)
    assert v.name == "target-bound" and "teacher.forward" in evidence(v)


def test_unknown_for_short_or_empty_windows() -> None:
    assert verdict_of(report([])).name == "unknown"
    short = pipeline(TARGET, DRAFTER, duration_s=0.05)
    v = verdict_of(short)
    assert v.name == "unknown" and v.detail == "window too short" and v.code == 0
    other = report([gauge("trainer", "0", "queue_depth", 1.0)])
    v = verdict_of(other)
    assert v.name == "unknown" and "no phase timings from role(s) trainer" in v.detail


def test_verdict_text_and_settings_are_immutable() -> None:
    v = Verdict("drafter-bound", (("target.queue_put_wait", 0.6412), ("queue_fill", 1.0)))
    assert v.text() == "drafter-bound (target.queue_put_wait=0.64 queue_fill=1.00)"
    assert Verdict("balanced").text() == "balanced"
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.name = "balanced"  # type: ignore[misc]
    assert list(VERDICT_CODES) == ["unknown", "balanced", "target-bound", "drafter-bound", "queue-starved",
                                   "host-bound", "throttled", "straggler", "input-bound", "communication-bound",
                                   "compute-bound", "idle", "unexplained-idle"]
