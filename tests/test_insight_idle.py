"""GPU idle attribution and the single-role verdicts on synthetic windows, and where they show:
Prometheus, the W&B row, ``top``; plus the explain report's missing inputs."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from rich.console import Console

from sidecar.aggregation.insight import compute_insight as compute_window
from sidecar.aggregation.settings import InsightSettings
from sidecar.cli.top import render, samples_of
from sidecar.exporters.prometheus.collector import ExportState, SidecarCollector
from sidecar.exporters.wandb.insight_row import insight_row
from sidecar.model.insight import GpuFacts, PipelineInsight
from sidecar.model.settings import RoleSettings
from sidecar.model.window import IngestReport
from sidecar.processing.explain import explain_data
from sidecar.processing.mapping import Mapper
from sidecar.processing.settings import MappingSettings
from tests.insight_synth import pipeline, report, worker
from tests.window_drive import drive


def compute_insight(rep: IngestReport, settings: InsightSettings | None = None,
                    gpus: GpuFacts | None = None) -> PipelineInsight:
    return compute_window(rep.window, settings, gpus)


ROLES = RoleSettings()
"""The default role names (the daemon passes its config, a ``RoleSettings``)."""

LOOP = {"data_wait": 3, "forward": 14, "backward": 24, "optimizer": 5, "comm_wait": 3}


def loop(phases: dict[str, float], ranks: int = 2, slow: dict[str, float] | None = None, cycle_ms: float = 50.0):
    """A plain loop: each rank runs ``phases`` (ms per step) in steps of ``cycle_ms`` for 1 s."""
    series = []
    for r in range(ranks):
        own = (slow or phases) if r == ranks - 1 else phases
        series += worker("trainer", str(r), own, round(1000 / max(cycle_ms, sum(own.values()))))
    return report(series)


@pytest.mark.parametrize(("phases", "expected", "evidence"), [
    (LOOP, "balanced", "trainer.data_wait"),
    (LOOP | {"data_wait": 30}, "input-bound", "trainer.data_wait"),
    (LOOP | {"comm_wait": 28}, "communication-bound", "trainer.comm_wait"),
    (LOOP | {"data_wait": 0, "queue_wait": 30}, "input-bound", "trainer.queue_wait"),  # a learner on its actors
    (LOOP | {"data_wait": 10, "queue_wait": 10}, "input-bound", "trainer.data_wait"),
])
def test_single_role_verdicts(phases: dict[str, float], expected: str, evidence: str) -> None:
    v = compute_insight(loop(phases, cycle_ms=sum(phases.values()))).verdict
    assert v.name == expected and evidence in dict(v.evidence) and 0.5 <= v.confidence <= 1.0


def test_a_learner_blocked_on_its_actors_queue_is_input_bound_not_balanced() -> None:
    """A new user's RL learner (TensorBoard names of its own: ``Perf/actor_queue_wait_sec`` 62 % of
    its loop, ``Perf/learn_sec``, ``Perf/loop_sec``), GPUs 30 % busy: its idle is explained by the
    queue, and was called ``balanced`` (no single-role rule read a queue wait); an empty queue is
    the learner's input."""
    events = [(1000.0 + s, 1, s, {"Perf/actor_queue_wait_sec": 0.62, "Perf/learn_sec": 0.37, "Perf/loop_sec": 1.0})
              for s in range(60)]
    _, verdicts = drive(events, "Perf/loop_sec", busy=0.3)
    assert set(verdicts[1:]) == {"input-bound"}, verdicts


def test_host_bound_compute_bound_throttled_and_straggler_for_a_loop() -> None:
    host = compute_insight(loop(LOOP, cycle_ms=100)).verdict  # 49 of 100 ms untimed
    assert host.name == "host-bound" and dict(host.evidence)["trainer.other"] == pytest.approx(0.51, abs=0.01)
    busy = GpuFacts(busy={"0": 0.97, "1": 0.95})
    v = compute_insight(loop(LOOP, cycle_ms=49), gpus=busy).verdict
    assert v.name == "compute-bound" and dict(v.evidence)["gpu_busy"] == pytest.approx(0.96)
    # half idle while the step is all timed and no wait explains it: said as such, never balanced
    half = compute_insight(loop(LOOP, cycle_ms=49), gpus=GpuFacts(busy={"0": 0.5})).verdict
    assert half.name == "unexplained-idle"
    assert dict(half.evidence)["trainer.unexplained"] == pytest.approx(0.36, abs=0.01)
    assert "inside the timed compute" in half.detail
    # a little idle with no wait over its threshold is balanced
    assert compute_insight(loop(LOOP, cycle_ms=49), gpus=GpuFacts(busy={"0": 0.8})).verdict.name == "balanced"
    unknown_gpu = compute_insight(loop(LOOP, cycle_ms=49)).verdict
    assert unknown_gpu.name == "balanced" and unknown_gpu.detail == "no GPU busy data from NVML to tell compute-bound"
    assert ")" not in unknown_gpu.detail  # the console line's evidence ends at the first ")"
    hot = GpuFacts({"0": frozenset({"hw_slowdown"})}, busy={"0": 0.97})
    assert compute_insight(loop(LOOP, cycle_ms=49), gpus=hot).verdict.name == "throttled"
    # rank 1 is 2.5x slower at its own work; rank 0 waits for it in the collective meanwhile
    slow = {k: v * (1 if k == "comm_wait" else 2.5) for k, v in LOOP.items()}
    extra = sum(slow.values()) - sum(LOOP.values())
    v = compute_insight(loop(LOOP | {"comm_wait": LOOP["comm_wait"] + extra}, slow=slow, cycle_ms=49)).verdict
    assert v.name == "straggler" and "trainer/1" in v.detail
    settings = InsightSettings(compute_busy_ratio=0.99)
    assert compute_insight(loop(LOOP, cycle_ms=49), settings, busy).verdict.name == "balanced"


def test_ranks_that_wait_alike_in_collectives_hold_no_straggler() -> None:
    # DDP under a slow interconnect: every rank waits ~60 ms per step in the collective; one
    # rank's "busy" phases hold a wait of their own (its backward's all-reduce, 30 ms): nobody
    # waits on it, so it is not a straggler (it was, on busy time alone)
    phases = LOOP | {"comm_wait": 60}
    held = phases | {"backward": LOOP["backward"] + 30}
    v = compute_insight(loop(phases, slow=held, cycle_ms=sum(held.values()))).verdict
    assert v.name == "communication-bound", v
    workers = compute_insight(loop(phases, slow=held, cycle_ms=sum(held.values()))).workers
    assert not any(w.straggler for w in workers) and min(w.score or 1 for w in workers) < 0.7


def ranks_timing_their_step(*ranks: dict[str, float]) -> IngestReport:
    """Ranks of one role, each running its ``phases`` (ms a step) back to back for 1 s and timing
    its step (their sum)."""
    series = []
    for r, phases in enumerate(ranks):
        step = sum(phases.values())
        series += worker("trainer", str(r), phases | {"step": step}, round(1000 / step))
    return report(series)


def test_the_rank_the_others_wait_for_is_the_straggler_whatever_it_is_slow_at() -> None:
    """A new user's two ranks in step: rank 1 stalls 44 ms a step reading its shard, rank 0 waits
    those 44 ms in the all-reduce; both time their step. Their busy phases are alike, so busy time
    named no one and the verdict was communication-bound (the data and the collectives each half of
    one rank's stall); the rank the others wait for is the one slow at something of its own."""
    fast = {"data_wait": 2, "forward": 14, "backward": 20, "comm_wait": 46, "optimizer": 4}
    slow = fast | {"data_wait": 46, "comm_wait": 2}
    insight = compute_insight(ranks_timing_their_step(fast, slow))
    assert insight.verdict.name == "straggler" and "trainer/1" in insight.verdict.detail, insight.verdict
    # 86 - 46 against 86 - 2 ms a step outside the collective
    assert [w.score for w in insight.workers] == [1.0, pytest.approx(40 / 84)]
    # ranks each at its own pace (one rank's backward holding a wait of its own, 30 ms), both
    # waiting alike in the collective: nobody waits on anybody, no straggler
    alike = LOOP | {"comm_wait": 60}
    v = compute_insight(ranks_timing_their_step(alike, alike | {"backward": LOOP["backward"] + 30})).verdict
    assert v.name == "communication-bound", v
    # a lag under a tenth of the step is noise, not a straggler
    near = fast | {"data_wait": 8, "comm_wait": 40}
    assert compute_insight(ranks_timing_their_step(fast, near)).verdict.name != "straggler"


def test_a_lag_no_timing_holds_names_no_straggler() -> None:
    """A review's case: ranks time their phases without a sync and end their collective's timer
    with one, so its wait holds each rank's wait for its own GPU too; rank 0 logs 20 ms a step,
    untimed, while its GPU computes. Its wait is 20 ms shorter but nobody waits for it: the lag is
    in no timing, and the rank was flagged a straggler."""
    rank1 = {"data_wait": 2.0, "forward": 3.0, "backward": 5.0, "comm_wait": 78.0, "optimizer": 2.0}
    rank0 = rank1 | {"comm_wait": 58.0}
    series = []
    for r, phases in (("0", rank0), ("1", rank1)):
        series += worker("trainer", r, phases | {"step": 90.0}, 11)
    insight = compute_insight(report(series), gpus=GpuFacts(busy={"0": 0.7, "1": 0.7}))
    assert insight.verdict.name != "straggler" and not any(w.straggler for w in insight.workers), insight.verdict


def test_a_backward_timed_alone_leaves_the_forward_in_the_gap_not_host_time() -> None:
    """A new user's NeMo-style loop times only its step and its backward (``train_step_timing``,
    ``train_backward_timing``), GPUs 72 % busy: its forward, optimizer and loader are untimed work
    in the gap, which was read as host time (host-bound at full confidence). Timing the forward
    still makes the gap host time."""
    backward_only = worker("trainer", "0", {"backward": 20.0, "step": 80.0}, 12)
    v = compute_insight(report(backward_only), gpus=GpuFacts(busy={"0": 0.72})).verdict
    assert v.name == "balanced" and "not host time" in v.detail, v
    with_forward = worker("trainer", "0", {"forward": 10.0, "backward": 20.0, "step": 80.0}, 12)
    v = compute_insight(report(with_forward), gpus=GpuFacts(busy={"0": 0.4})).verdict
    assert v.name == "host-bound", v
    # a review's case: the forward timed under a name not read (time/model_ms) beside the backward
    events = [(1000.0 + 0.084 * (i + 1), 1, i, {"time/model_ms": 12.0, "time/backward_ms": 20.0,
                                                "time/optimizer_ms": 6.0, "time/data_ms": 8.0, "time/step_ms": 84.0})
              for i in range(600)]
    _, verdicts = drive(events, "time/step_ms", busy=0.45)
    assert set(verdicts[1:-1]) == {"host-bound"}, verdicts


@pytest.mark.parametrize(("data_ms", "busy", "expected"), [(48.0, 0.3, "input-bound"), (12.0, 0.4, "unexplained-idle")])
def test_a_loop_timing_only_its_data_wait_is_paced_by_its_own_steps_per_second(
        data_ms: float, busy: float, expected: str) -> None:
    """A new user's loop logs its data wait and its own throughput, no step timing (MLflow's
    ``dataloader_latency_ms``, ``throughput/batches_per_sec``): the wait was the whole of the
    cycle, a data share of 1.00 whatever its part of the 80 ms step (input-bound at 15 %)."""
    events = [(1000.0 + 0.08 * (i + 1), 1, i, {"dataloader_latency_ms": data_ms, "throughput/batches_per_sec": 12.5,
                                               "throughput/samples_per_sec": 1600.0, "loss": 0.9}
               | ({"eval/steps_per_second": 0.4} if i % 250 == 249 else {}))  # HF's, at each evaluation
              for i in range(1000)]
    _, verdicts = drive(events, "dataloader_latency_ms", busy=busy)
    assert set(verdicts[1:-1]) == {expected}, verdicts


@pytest.mark.parametrize(("wait_ms", "stride", "expected"), [
    (34.0, 1, "input-bound"),          # 42 % of the 80 ms step
    (4.0, 1, "unexplained-idle"),      # 5 %: was input-bound, the wait the whole of the cycle
    (4.0, 10, "unexplained-idle"),     # logged every tenth step on a step axis: the axis still paces it
    (34.0, -4, "input-bound"),         # a review's case: each of 4 micro-batches' wait published, the axis per 4
])
def test_a_loop_timing_only_a_wait_is_paced_by_its_step_axis(wait_ms: float, stride: int, expected: str) -> None:
    """A new user's probe: a loop logging one wait under its own name and nothing that times the
    step (a DLRM loop's ``wait_for_batch`` to TensorBoard at each ``global_step``), GPUs 45 % busy:
    the wait was the whole of the cycle, input-bound at 5 % of the step. How far the step axis moves
    a window paces it, as a steps-per-second gauge does."""
    events = [(1000.0 + 0.08 * (i + 1), 1, i // -stride if stride < 0 else i,
               {"time/wait_for_batch_ms": wait_ms, "lifetime_ne": 0.8})
              for i in range(1000) if stride < 0 or i % stride == stride - 1]
    _, verdicts = drive(events, "time/wait_for_batch_ms", busy=0.45)
    assert set(verdicts[1:-1]) == {expected}, verdicts


def test_an_axis_that_moves_faster_than_the_steps_leaves_the_timings_sum() -> None:
    """A samples axis not known as such (a batch of 32 each step) or ``wandb.log`` without ``step=``
    moves faster than the steps: its pace is shorter than the timings and the sum of them stands
    (a 40 ms data wait of an 80 ms step, its only timing: input-bound, as before the pace was read)."""
    events = [(1000.0 + 0.08 * (i + 1), 1, 32 * i, {"time/data_ms": 40.0}) for i in range(1000)]
    _, verdicts = drive(events, "time/data_ms", busy=0.45)
    assert set(verdicts[1:-1]) == {"input-bound"}, verdicts


def test_a_loop_timing_its_micro_batches_compute_is_not_paced_by_its_optimizer_steps() -> None:
    """A review's case: no step timer, each micro-batch's data wait (40 %), forward and backward
    timed, four micro-batches an optimizer step, its optimizer steps per second logged: paced by
    those, every share was a quarter of its own (input-bound read unexplained-idle)."""
    micro = {"time/data_ms": 20.0, "time/forward_ms": 10.0, "time/backward_ms": 18.0, "perf/steps_per_sec": 5.0}
    events = [(1000.0 + 0.2 * (i + 1), 1, i, micro) for i in range(300)]
    _, verdicts = drive(events, "time/data_ms", busy=0.5)
    assert set(verdicts[1:-1]) == {"input-bound"}, verdicts


def test_idle_parts_sum_to_the_idle_share_and_scale_down_when_waits_exceed_it() -> None:
    rep = pipeline({"data_wait": 60, "forward": 30, "pack": 3}, {"queue_wait": 30, "forward": 8, "backward": 14})
    gpus = GpuFacts(roles={"0": "target", "1": "drafter"}, busy={"0": 0.2, "1": 0.8})
    idle = compute_insight(rep, gpus=gpus).gpu_idle
    target, drafter = idle["target"], idle["drafter"]
    assert target["idle"] == pytest.approx(0.8) and drafter["idle"] == pytest.approx(0.2)
    for parts in idle.values():
        assert sum(v for k, v in parts.items() if k != "idle") == pytest.approx(parts["idle"])
    # targets wait on data 60/93 = 0.65 of the time: that much of the 0.8 idle is data, 0.15 unexplained
    assert target["data"] == pytest.approx(60 / 93) and target["unexplained"] == pytest.approx(0.8 - 60 / 93)
    # drafters wait 30/52 = 0.58 on the queue, more than the 0.2 idle: all of the idle is queue
    assert drafter["queue"] == pytest.approx(0.2) and drafter["unexplained"] == 0.0
    assert compute_insight(rep).gpu_idle == {}  # no GPU data: no attribution, never a fake zero


def test_idle_and_confidence_reach_prometheus_wandb_and_top() -> None:
    rep = loop(LOOP | {"data_wait": 30}, cycle_ms=100)  # 10 steps of 100 ms: data wait 0.3
    insight = compute_insight(rep, gpus=GpuFacts(busy={"0": 0.4}))
    row = insight_row(insight)
    assert row["pipeline/verdict_confidence"] == insight.verdict.confidence
    assert row["pipeline/gpu_idle/trainer/idle"] == pytest.approx(0.6)
    assert row["pipeline/gpu_idle/trainer/data"] == pytest.approx(0.3)
    registry = CollectorRegistry()
    registry.register(SidecarCollector(ExportState("box", 0.0, report=dataclasses.replace(rep, insight=insight))))
    text = generate_latest(registry).decode()
    samples = samples_of(text)
    reasons = {lab["reason"]: v for lab, v in samples["dflash_pipeline_gpu_idle_reason_ratio"]}
    assert set(reasons) == {"data", "queue", "collectives", "host", "unexplained"}
    assert sum(reasons.values()) == pytest.approx(samples["dflash_pipeline_gpu_idle_ratio"][0][1])
    console = Console(width=160, record=True)
    console.print(render(samples))
    out = console.export_text()
    assert "bottleneck: input-bound (confidence" in out and "gpu idle trainer: 60% = data 30%" in out


def test_explain_names_what_a_plain_loop_lacks() -> None:
    rep = report(worker("trainer", "0", {"forward": 10, "backward": 20}, 30))
    data = explain_data(rep, Mapper(), ROLES, gpu_missing="NVML disabled: --no-gpu-metrics")
    missing = data["missing"]
    assert [m["input"] for m in missing["input-bound"]] == ["trainer data_wait"]
    assert missing["input-bound"][0]["supply"].startswith('timing("data_wait_ms", ...)')
    assert "host-bound" not in missing  # every occurrence, compute timed: no step timing needed
    assert [m["input"] for m in missing["step breakdown (every verdict's confidence)"]] == [
        "trainer optimizer", "trainer step"]
    assert "GPU busy share (NVML disabled" in missing["compute-bound"][0]["input"]
    assert "throttled" in missing and "straggler" in missing
    assert not any("DFlash" in k for k in missing)  # a single-role loop gets no DFlash lines
    dflash = explain_data(pipeline({"forward": 80}, {"forward": 10}), Mapper(), ROLES)["missing"]
    assert dflash["target-bound / queue-starved / input-bound (DFlash)"][0]["supply"].startswith(
        'timing("drafter.queue_wait_ms", ...)')
    assert "input-bound" not in dflash and "host-bound" not in dflash


def test_explain_reads_the_dflash_inputs_under_the_configured_role_names() -> None:
    """``insight_target_role = "teacher"``, ``insight_drafter_role = "student"``: the inputs the
    DFlash verdicts read are looked for, and named, under those roles (explain used to look for
    ``target`` and ``drafter`` whatever the settings said)."""
    roles = RoleSettings(target_role="teacher", drafter_role="student")
    mapper = Mapper.from_settings(MappingSettings(), roles)  # as the daemon builds it
    full = {"forward": 40, "pack": 5, "data_wait": 5, "queue_put_wait": 2}
    rep = pipeline(full, {"queue_wait": 5, "forward": 30}, queue_fill=0.5, roles=("teacher", "student"))
    missing = explain_data(rep, mapper, roles)["missing"]
    assert "target-bound / queue-starved / input-bound (DFlash)" not in missing  # all present
    assert "drafter-bound (DFlash)" not in missing
    assert "input-bound" not in missing  # teacher and student are the DFlash roles, not a loop
    lacking = explain_data(pipeline({"forward": 40}, {"forward": 30}, roles=("teacher", "student")),
                           mapper, roles)["missing"]["target-bound / queue-starved / input-bound (DFlash)"]
    assert [m["input"] for m in lacking] == ["student queue_wait", "teacher pack", "teacher data_wait"]
    assert lacking[0]["supply"].startswith('timing("student.queue_wait_ms", ...)')


def _accumulating(host_s: float, step_every: int = 1) -> list[tuple[float, int, int | None, dict[str, float]]]:
    """A new user's gradient accumulation (MLflow): each of four micro-batches' load (1.5 ms) and
    forward-backward (20 ms) logged at its micro-step, the optimizer's 6 ms and the whole step's
    time at each optimizer step (every ``step_every``-th), ``host_s`` of untimed host work a step."""
    events, at, micro = [], 1000.0, 0
    for i in range(1200):
        start = at
        for _ in range(4):
            at += 0.0215
            events.append((at, 1, micro, {"time/load_ms": 1.5, "time/micro_fwdbwd_ms": 20.0}))
            micro += 1
        at += 0.006 + host_s
        if i % step_every == 0:
            events.append((at, 1, micro, {"time/opt_step_ms": 6.0, "time/full_step_ms": (at - start) * 1e3}))
    return events


@pytest.mark.parametrize(("case", "host_s", "expected"), [
    ("every phase timed", 0.0, "unexplained-idle"),
    ("0.15 s of untimed host work a step", 0.15, "host-bound"),
])
def test_phases_logged_per_micro_batch_count_as_often_as_they_run(case: str, host_s: float, expected: str) -> None:
    """A phase logged four times for each record of the step (per micro-batch, the step per optimizer
    step) counts four times in it: every phase timed, GPUs 40 % busy, was host-bound (a micro-batch's
    forward-backward weighed against a step of four), a new user's probe found."""
    _, verdicts = drive(_accumulating(host_s), "time/full_step_ms", busy=0.4, window_s=2.0)
    assert set(verdicts[1:]) == {expected}, (case, verdicts)


def test_a_step_logged_less_often_than_its_phases_holds_them_once() -> None:
    """The step's time logged every other optimizer step, its phases every time: counted twice they
    would not fit in it, so each counts once (a sampled step, no accumulation): every phase timed."""
    events = [(1000.0 + 0.092 * i, 1, i, {"time/load_ms": 6.0, "time/fwdbwd_ms": 80.0, "time/opt_step_ms": 6.0}
               | ({"time/full_step_ms": 92.0} if i % 2 == 0 else {})) for i in range(1200)]
    _, verdicts = drive(events, "time/full_step_ms", busy=0.4, window_s=2.0)
    assert set(verdicts[1:]) == {"unexplained-idle"}, verdicts


def _gan(host_s: float) -> list[tuple[float, int, int | None, dict[str, float]]]:
    """A new user's GAN loop (TensorBoard, seconds, names of its own): the loader's 6 ms, the
    discriminator's and the generator's updates (14 and 16 ms, each a forward, a backward and an
    optimizer step) and the whole iteration, with ``host_s`` of untimed host work (an EMA copy, a
    grid of samples)."""
    step = 0.036 + host_s
    return [(1000.0 + step * (i + 1), 1, i, {"Time/data": 0.006, "Time/D_step": 0.014, "Time/G_step": 0.016,
                                             "Time/iter": step, "Loss/D": 0.7}) for i in range(600)]


@pytest.mark.parametrize(("case", "host_s", "expected"), [
    ("58 % untimed host work", 0.05, "host-bound"),
    ("every part timed", 0.0, "unexplained-idle"),
])
def test_two_networks_updates_named_steps_are_parts_of_the_iteration(case: str, host_s: float,
                                                                    expected: str) -> None:
    """Three names read as the step (``Time/D_step``, ``Time/G_step``, ``Time/iter``): the longest is
    the step and the shorter ones its parts (each network's update, its compute), GPUs 35 % busy.
    Before, the first name was the step (the discriminator's 14 ms): input-bound in every window,
    the loader's 6 ms at 43 % of it, a new user's probe found."""
    _, verdicts = drive(_gan(host_s), "Time/iter", busy=0.35, window_s=2.0)
    assert set(verdicts[1:]) == {expected}, (case, verdicts)


@pytest.mark.parametrize("part", ["Time/step_avg", "Time/micro_step"])
def test_a_mean_or_a_micro_batch_of_the_step_is_no_part_of_it(part: str) -> None:
    """A running mean of the step (lagging it) or one micro-batch's step beside the step is no part
    of it: the insight does not claim the rest as measured host time (a review found both read
    host-bound with every part of the loop timed but its compute)."""
    events = [(1000.0 + 0.1 * (i + 1), 1, i, {"Time/data": 0.01, part: 0.05, "Time/iter": 0.1}) for i in range(600)]
    _, verdicts = drive(events, "Time/iter", busy=0.45, window_s=2.0)
    assert "host-bound" not in verdicts, verdicts


def test_a_step_beside_its_timed_compute_reads_the_step_once() -> None:
    """Where the worker times its forward and backward, a second name read as the step (a step timer
    leaving the data out, beside the iteration's) is no part of it: the insight reads one, and the
    untimed host work is still host-bound."""
    events = [(1000.0 + 0.086 * (i + 1), 1, i, {"Time/data": 0.006, "Time/forward": 0.014, "Time/backward": 0.016,
                                                "Time/step_time": 0.030, "Time/iter": 0.086}) for i in range(600)]
    _, verdicts = drive(events, "Time/iter", busy=0.35, window_s=2.0)
    assert set(verdicts[1:]) == {"host-bound"}, verdicts


def _steps_of(parts: dict[str, float], step_key: str, n: int = 600) -> list[tuple[float, int, int | None,
                                                                                 dict[str, float]]]:
    """A loop publishing ``parts`` (seconds) at each step's end, its step ``step_key`` their sum."""
    step = sum(parts.values())
    return [(1000.0 + step * (i + 1), 1, i, parts | {step_key: step}) for i in range(n)]


FSDP = {"FSDP/DataLoad_s": 0.004, "FSDP/Fwd_s": 0.020, "FSDP/Bwd_s": 0.024, "FSDP/OptStep_s": 0.004}


@pytest.mark.parametrize(("case", "parts", "expected"), [
    ("an FSDP loop's all-gather and reduce-scatter, 35 % together",
     FSDP | {"FSDP/AllGather_s": 0.012, "FSDP/ReduceScatter_s": 0.016}, "communication-bound"),
    ("a pipeline's sends and receives, 40 % together",
     {"pp/fwd_compute_s": 0.020, "pp/bwd_compute_s": 0.028, "pp/send_s": 0.020, "pp/recv_s": 0.020,
      "pp/opt_s": 0.012}, "communication-bound"),
    ("an MoE loop's all-to-all beside its all-gather, 36 % together (a2a was read as communication,"
     " not as a collective of its own)",
     {"moe/data_s": 0.004, "moe/fwd_s": 0.020, "moe/bwd_s": 0.024, "moe/a2a_s": 0.016, "moe/allgather_s": 0.012,
      "moe/opt_s": 0.002}, "communication-bound"),
])
def test_a_wait_timed_under_different_collectives_counts_them_all(case: str, parts: dict[str, float],
                                                                 expected: str) -> None:
    """A communication wait timed under names of different collectives sums them: before, the first
    name was read and the rest was host time (an FSDP loop 35 % in its collectives, GPUs 45 % busy,
    read balanced), a new user's probe found."""
    _, verdicts = drive(_steps_of(parts, "time/step"), "time/step", busy=0.45, window_s=2.0)
    assert set(verdicts[1:]) == {expected}, (case, verdicts)


@pytest.mark.parametrize(("case", "twice"), [
    ("the same wait under two namespaces", {"train/data_time": 0.02, "perf/data_time": 0.02}),
    ("under two words of the data wait", {"time/data": 0.02, "time/dataloader": 0.02}),
    ("a loader timer nested in a data timer", {"time/data": 0.022, "time/dataloader": 0.02}),
    ("an all-reduce nested in a gradient sync", {"time/data": 0.0, "time/grad_sync": 0.02, "time/allreduce": 0.018}),
])
def test_a_phase_under_two_names_of_one_thing_counts_once(case: str, twice: dict[str, float]) -> None:
    """One wait logged under two names, or a timer nested in another, counts once: 20 % of the
    step, under every threshold (summed, 40 % would read input- or communication-bound). A review
    of a first rule that summed any two names of a phase whose words differ found each of these."""
    parts = twice | {"time/forward": 0.03, "time/backward": 0.05}
    events = [(1000.0 + 0.1 * (i + 1), 1, i, parts | {"time/step": 0.1}) for i in range(600)]
    _, verdicts = drive(events, "time/step", busy=0.45, window_s=2.0)
    assert not {"input-bound", "communication-bound"} & set(verdicts), (case, verdicts)


def test_a_collectives_launch_and_its_wait_read_the_wait() -> None:
    """A new user's probe: two torchrec ranks time their pipeline stages under its labels, the input
    dist's launch (``sparse_data_dist``, 3 ms) and its wait (``wait_sparse_data_dist``: 30 ms on the
    rank that waits for the slower one's all-to-all). Both names read as communication, and the
    insight read the first in order, the launch: the wait fell into the gap and the slow rank was no
    straggler (balanced). Of a phase's two names the longer is read."""
    from sidecar.aggregation.aggregator import Aggregator
    from sidecar.core.pipeline import ingest_records
    from sidecar.model.window import PROFILE, TIMING

    agg, mapper = Aggregator(clock=lambda: 1010.0), Mapper()
    for rank, (wait, fwd, bwd) in enumerate([(30.0, 17.0, 22.0), (2.0, 32.0, 36.0)]):
        step = [[TIMING, "copy_batch_to_gpu", 2.0], [TIMING, "sparse_data_dist", 3.0],
                [TIMING, "wait_sparse_data_dist", wait], [TIMING, "forward", fwd], [TIMING, "backward", bwd],
                [TIMING, "optimizer", 5.0]]
        records = [r for i in range(125) for r in (*step, [PROFILE, i, {"lifetime_ne": 0.81}])]
        ingest_records(agg, "trainer", str(rank), records, mapper, sender_id=rank + 1)
    v = compute_window(agg.roll(1010.0, 1010.0, 10.0), gpus=GpuFacts(busy={"0": 0.55, "1": 0.55})).verdict
    assert v.name == "straggler" and "trainer/1" in v.detail, v


def test_of_two_names_of_a_wait_timed_every_occurrence_the_one_that_took_longer_is_read() -> None:
    """A review's case: a DDP comm hook times each of 25 buckets' all-reduce (2 ms) beside one
    barrier a step (5 ms), ``timing()`` records: by their means the barrier was the longer, and half
    the step in the all-reduces fell into the gap (host-bound). Every occurrence is read by its sum."""
    step = {"fwd_ms": 20.0, "bwd_ms": 25.0, "optimizer_ms": 5.0, "comm/barrier": 5.0}
    events = [e for i in range(400) for e in [(1000.0 + 0.1 * i, 1, None, step)]
              + [(1000.0 + 0.1 * i + 0.001 * b, 1, None, {"comm/allreduce_bucket": 2.0}) for b in range(25)]]
    _, verdicts = drive(events, "comm/barrier", busy=0.45, window_s=2.0)
    assert set(verdicts[1:-1]) == {"communication-bound"}, verdicts


DDP_MS = {"forward_compute_time": 30.0, "backward_compute_time": 50.0}


@pytest.mark.parametrize(("comm", "overlap", "expected"), [
    (45.0, 40.0, "compute-bound"),  # the all-reduce under the backward: a 5 ms tail waited
    (45.0, 5.0, "communication-bound"),  # a 40 ms tail after the backward: waited
])
@pytest.mark.parametrize("form", ["publish", "timing"])
def test_a_ddp_all_reduce_under_the_backward_is_not_waited(comm: float, overlap: float, expected: str,
                                                            form: str) -> None:
    """torch DDP's logging data (``_get_ddp_logging_data()``: nanoseconds in a published dict, ms as
    ``timing()`` records) times its all-reduce from the first bucket's launch, under the backward, to
    the last one's end; the rank waits only for the tail after the backward (``comm_overlap`` taken
    off ``comm_wait``). Read whole, a loop whose all-reduce ran 40 of its 45 ms under the backward
    was communication-bound (36 % of the step; NVML's busy GPU counted the spinning kernels)."""
    parts = DDP_MS | {"backward_comm_time": comm, "backward_compute_comm_overlap_time": overlap}
    if form == "publish":
        events = [(1000.0 + 0.1 * i, 1, i, {k: v * 1e6 for k, v in parts.items()}) for i in range(300)]
    else:
        events = [(1000.0 + 0.1 * i, 1, None, parts) for i in range(300)]
    _, verdicts = drive(events, "backward_comm_time", busy=0.95, window_s=2.0)
    assert set(verdicts[1:-1]) == {expected}, verdicts


def test_an_overlap_leaves_a_stragglers_own_time_its_own() -> None:
    """Two DDP ranks that time their step (140 ms), rank 1's backward 50 ms slower: rank 0's
    all-reduce runs from its first bucket (40 ms) to rank 1's last (135 ms), 55 ms of it after its
    own backward; rank 1's from 50 ms, 80 of its 85 ms under its own backward. The arrival rule
    compares each one's time outside what it waited: the step less the whole all-reduce read them
    45 and 55 ms (score 0.82, no straggler); less the exposed tail, 85 and 135 ms (0.63)."""
    from sidecar.aggregation.aggregator import Aggregator
    from sidecar.core.pipeline import ingest_records
    from sidecar.model.window import PROFILE

    agg, mapper = Aggregator(clock=lambda: 1010.0), Mapper()
    for rank, (bwd, comm, overlap) in enumerate([(50.0, 95.0, 40.0), (100.0, 85.0, 80.0)]):
        parts = {"time/step": 30.0 + bwd + comm - overlap + 5.0, "forward_compute_time": 30.0,
                 "backward_compute_time": bwd, "backward_comm_time": comm,
                 "backward_compute_comm_overlap_time": overlap}
        records = [[PROFILE, i, {k: v / 1000.0 if k == "time/step" else v * 1e6 for k, v in parts.items()}]
                   for i in range(80)]
        ingest_records(agg, "trainer", str(rank), records, mapper, sender_id=rank + 1)
    v = compute_window(agg.roll(1010.0, 1010.0, 10.0), gpus=GpuFacts(busy={"0": 0.55, "1": 0.55})).verdict
    assert v.name == "straggler" and "trainer/1" in v.detail, v


def _one_window(steps: list[dict[str, float]], busy: float) -> PipelineInsight:
    """One 10 s window of a trainer publishing ``steps`` (one dict a step), its GPU ``busy``."""
    from sidecar.aggregation.aggregator import Aggregator
    from sidecar.core.pipeline import ingest_records
    from sidecar.model.window import PROFILE

    agg = Aggregator(clock=lambda: 1010.0)
    ingest_records(agg, "trainer", "0", [[PROFILE, i, d] for i, d in enumerate(steps)], Mapper(), sender_id=1)
    return compute_window(agg.roll(1010.0, 1010.0, 10.0), gpus=GpuFacts(busy={"0": busy}))


@pytest.mark.parametrize("exposed", ["time/comm_exposed_ms", "time/comm_without_overlap_ms",
                                     "time/non_overlapped_comm_ms"])
def test_a_wait_named_exposed_keeps_its_time_beside_an_overlap(exposed: str) -> None:
    """A profiler's exposed communication beside its overlap: the wait is what lies outside the
    overlap already, and taking the overlap off it again read a loop 33 % in its collectives as
    compute-bound (a review's case)."""
    steps = [{"time/forward_ms": 30.0, "time/backward_ms": 50.0, exposed: 40.0, "time/comm_overlap_ms": 40.0}] * 80
    insight = _one_window(steps, busy=0.95)
    assert insight.roles["trainer"].time_share["comm_wait"] == pytest.approx(40 / 120)
    assert insight.verdict.name == "communication-bound", insight.verdict
    assert "comm_overlap" not in insight.verdict.detail  # not taken off: not said to be read


def test_the_overlap_is_taken_off_before_the_collectives_are_fitted_in_the_step() -> None:
    """Two collectives whose sum fits the step only without the overlap (a review's case): both
    count, less the overlap (60 of 120 ms); fitted first, the all-gather was dropped as too much and
    its time read as host time (host-bound)."""
    step = {"time/step_ms": 120.0, "time/fwd_ms": 20.0, "time/bwd_ms": 40.0, "time/allreduce_ms": 50.0,
            "time/allgather_ms": 45.0, "time/allreduce_overlap_ms": 35.0}
    insight = _one_window([step] * 80, busy=0.3)
    assert insight.roles["trainer"].time_share["comm_wait"] == pytest.approx(60 / 120)
    assert insight.verdict.name == "communication-bound", insight.verdict


@pytest.mark.parametrize(("sampled", "average"), [((45.0, 44.0), (60.0, 30.0)), ((60.0, 30.0), (45.0, 44.0))])
def test_a_ddp_dicts_overlap_is_taken_off_its_own_twins_wait(sampled: tuple[float, float],
                                                            average: tuple[float, float]) -> None:
    """torch DDP's logging data holds the sampled iteration's times and their running averages: the
    wait read is the longer (60 ms), and the overlap taken off it is its own twin's (30), not the
    longer overlap (44 ms: 16 ms left, neither iteration's), whichever twin it is (a second review
    found the sampled wait paired with the average's overlap)."""
    ms = 1e6
    times = {"forward_compute_time": 30 * ms, "backward_compute_time": 50 * ms,
             "backward_comm_time": sampled[0] * ms, "backward_compute_comm_overlap_time": sampled[1] * ms}
    averages = {"avg_forward_compute_time": 30 * ms, "avg_backward_compute_time": 50 * ms,
                "avg_backward_comm_time": average[0] * ms, "avg_backward_compute_comm_overlap_time": average[1] * ms}
    insight = _one_window([times | averages] * 80, busy=0.95)
    assert insight.roles["trainer"].time_share["comm_wait"] == pytest.approx(30 / 110)


@pytest.mark.parametrize(("case", "parts", "share"), [
    ("an FSDP loop's all-gather and reduce-scatter, each 30 of its 40 ms under the compute",
     {"time/allgather_ms": 40.0, "time/reduce_scatter_ms": 40.0, "time/allgather_overlap_ms": 30.0,
      "time/reduce_scatter_overlap_ms": 30.0}, 20 / 100),
    ("a non-blocking all-reduce (non is no negation of the overlap here)",
     {"time/allreduce_non_blocking_ms": 80.0, "time/allreduce_overlap_ms": 60.0}, 20 / 100),
])
def test_each_collectives_overlap_is_taken_off_its_own_wait(case: str, parts: dict[str, float], share: float) -> None:
    """A second review's cases: of a wait summed from two collectives only one overlap was taken off
    (communication-bound at 38 %), and a wait named non-blocking was read as exposed already."""
    steps = [{"time/fwd_ms": 30.0, "time/bwd_ms": 50.0} | parts] * 80
    insight = _one_window(steps, busy=0.95)
    assert insight.roles["trainer"].time_share["comm_wait"] == pytest.approx(share), case


def test_an_overlap_sent_less_often_than_its_wait_still_stands() -> None:
    """An overlap published every 20th step beside a wait published every step: its last value
    stands for the windows between (a review found the verdict alternating with the windows that
    hold it)."""
    wait = {"time/forward_ms": 30.0, "time/backward_ms": 50.0, "time/allreduce_ms": 45.0}
    events = [(1000.0 + 0.1 * i, 1, i, wait | ({"time/allreduce_overlap_ms": 40.0} if i % 20 == 0 else {}))
              for i in range(400)]
    _, verdicts = drive(events, "time/allreduce_ms", busy=0.95, window_s=1.0)
    assert set(verdicts[1:-1]) == {"compute-bound"}, verdicts


def test_an_overlap_read_from_its_name_is_said_in_the_detail() -> None:
    """An overlap read from a name changes the communication wait: the verdict says so, and the
    name's misspelling lowers its confidence, as any phase read from a name does."""
    steps = [{"time/forward_ms": 30.0, "time/backward_ms": 50.0, "time/comm_ms": 60.0,
              "time/comm_overlap_ms": 10.0}] * 80
    v = _one_window(steps, busy=0.95).verdict
    assert v.name == "communication-bound" and "comm_overlap read from the name: time/comm_overlap_ms" in v.detail, v
    slip = [{"time/forward_ms": 30.0, "time/backward_ms": 50.0, "time/comm_ms": 60.0,
             "time/allreudce_overlap_ms": 10.0}] * 80
    assert _one_window(slip, busy=0.95).verdict.confidence < v.confidence


def test_the_detail_names_the_step_the_insight_reads() -> None:
    """A JAX loop's ``jax/jit_step_ms`` (the compiled step: its compute) beside ``jax/loop_ms``: the
    loop is the step and the jitted step its part; the detail said "step read from the name:
    jax/jit_step_ms" beside "89 % of the step in jax/jit_step_ms, unmapped", a new user's probe
    found. It names the step read, ``jax/loop_ms``."""
    from sidecar.aggregation.aggregator import Aggregator
    from sidecar.core.pipeline import ingest_records
    from sidecar.model.window import PROFILE

    agg, mapper = Aggregator(clock=lambda: 1010.0), Mapper()
    record = {"jax/next_batch_ms": 4.0, "jax/host_to_device_ms": 2.0, "jax/jit_step_ms": 40.0, "jax/loop_ms": 50.0}
    ingest_records(agg, "trainer", "0", [[PROFILE, i, record] for i in range(100)], mapper)
    v = compute_window(agg.roll(1010.0, 1010.0, 10.0), gpus=GpuFacts(busy={"0": 0.4})).verdict
    assert "step read from the name: jax/loop_ms" in v.detail, v
    assert "read from the name: jax/jit_step_ms" not in v.detail, v
