"""The DFlash rules, evidence first: where the target and drafter GPUs have busy readings, busy
GPUs are ``compute-bound`` whatever the queue and host-side shares say, and idle GPUs get their
role's largest idle cause; a role idle on the queue leaves the verdict to the queue rules."""

from __future__ import annotations

import pytest

from sidecar.aggregation.insight import compute_insight
from sidecar.model.insight import GpuFacts, Verdict
from tests.insight_synth import pipeline

TARGET = {"data_wait": 4, "forward": 30, "pack": 3, "queue_put_wait": 3}
DRAFTER = {"queue_wait": 1, "forward": 8, "backward": 14, "optimizer": 4}
ROLES = {"0": "target", "1": "target", "6": "drafter"}


def gpus(target: float | None, drafter: float | None, throttled: str | None = None) -> GpuFacts:
    busy = {g: b for g, r in ROLES.items() if (b := target if r == "target" else drafter) is not None}
    events = {throttled: frozenset({"hw_slowdown"})} if throttled else {}
    return GpuFacts(events, {g: r for g, r in ROLES.items() if g in busy}, busy)


def verdict(rep, facts: GpuFacts | None) -> Verdict:
    return compute_insight(rep.window, gpus=facts).verdict


def test_busy_gpus_are_compute_bound_whatever_the_data_wait_says() -> None:
    # the host-side shares say the targets wait on the loader (input-bound without GPU readings)
    rep = pipeline({"data_wait": 60, "forward": 30, "pack": 3}, DRAFTER | {"queue_wait": 30})
    assert verdict(rep, None).name == "input-bound"
    v = verdict(rep, gpus(0.96, 0.93))
    assert v.name == "compute-bound"
    ev = dict(v.evidence)
    assert ev["target.gpu_busy"] == pytest.approx(0.96) and ev["drafter.gpu_busy"] == pytest.approx(0.93)
    assert "ready_deficit" in ev  # the queue's numbers stay in the evidence


def test_one_busy_group_alone_is_not_compute_bound() -> None:
    # targets busy, drafters idle on the empty queue: the queue rules locate the limit
    rep = pipeline({"data_wait": 4, "forward": 80, "pack": 3}, DRAFTER | {"queue_wait": 30}, queue_fill=0.1)
    assert verdict(rep, gpus(0.97, 0.40)).name == "target-bound"
    # a reading for one role only cannot say every GPU of the pipeline is busy
    assert verdict(rep, gpus(0.97, None)).name == "target-bound"


def test_idle_gpus_get_their_roles_largest_idle_cause() -> None:
    # drafters wait on their own loader; neither side waits on the queue: balanced without GPUs
    rep = pipeline(TARGET, DRAFTER | {"data_wait": 20}, queue_fill=0.5)
    assert verdict(rep, None).name == "balanced"
    v = verdict(rep, gpus(0.95, 0.45))
    assert v.name == "input-bound" and dict(v.evidence)["drafter.gpu_busy"] == pytest.approx(0.45)
    assert dict(v.evidence)["drafter.data_wait"] == pytest.approx(20 / 47)
    # collectives between the drafters
    comm = pipeline(TARGET, DRAFTER | {"comm_wait": 25}, queue_fill=0.5)
    assert verdict(comm, None).name == "balanced"
    assert verdict(comm, gpus(0.95, 0.45)).name == "communication-bound"


def test_idle_on_the_queue_is_left_to_the_queue_rules() -> None:
    # targets idle, blocked on a full queue (more than on their loader): drafter-bound
    rep = pipeline(TARGET | {"queue_put_wait": 60, "data_wait": 30}, {"forward": 20, "backward": 40, "optimizer": 8},
                   queue_fill=1.0)
    assert verdict(rep, gpus(0.40, 0.97)).name == "drafter-bound"


def test_straggler_does_not_override_busy_gpus_throttling_does() -> None:
    slow = {k: v * 2.5 for k, v in DRAFTER.items()}
    rep = pipeline(TARGET | {"queue_put_wait": 15}, DRAFTER, drafter_override={"0": slow})
    assert verdict(rep, None).name == "straggler"
    assert verdict(rep, gpus(0.95, 0.95)).name == "compute-bound"
    v = verdict(rep, gpus(0.95, 0.95, throttled="6"))
    assert v.name == "throttled" and "otherwise compute-bound" in v.detail
