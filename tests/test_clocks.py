"""A bare time read as the step, decided by its numbers (``sidecar/aggregation/clocks.py``): seconds
since the start climb with the wall clock, a time of many steps (an epoch's) is logged once in many
steps at the time since its record before, and both read as no phase; a step's duration, steady,
slowing, longer than a window, logged rarely or at any pace of the step axis, stays the step. A
phase read from its name that is a running total (or a count) climbs above the wall time between
its windows and reads as no phase; parallel threads' records, a slowing phase, a user's rule stay.
Through the real mapping stage and aggregator, windows rolled on a clock the test moves, and
through a real daemon with a real trainer process and the fake NVML driver."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sidecar.aggregation.aggregator import Aggregator
from sidecar.aggregation.clocks import CLIMBS, _Watch
from sidecar.core.pipeline import ingest_records
from sidecar.model.window import PROFILE, TIMING, SeriesView
from sidecar.processing.mapping import Mapper
from sidecar.processing.rules import parse_rules
from tests.daemon_harness import DaemonProc, env, explain, verdict, wait_for
from tests.fake_nvml.control import FakeNvml
from tests.fake_nvml.helpers import library_or_skip
from tests.window_drive import WINDOW_S, Event, drive


def _run(name: str, value_at: Callable[[int], float | None], windows: int,
         others: dict[str, float] | None = None) -> list[SeriesView]:
    """The view of ``name`` at the end of each window with a record; ``value_at(k)`` is what the
    trainer logged in window k (None: nothing), ``others`` what it logged beside it every window,
    one ``publish`` at the window's start, its step k (``drive``)."""
    events: list[Event] = []
    for k in range(windows):
        value = value_at(k)
        profile = dict(others or {}) | ({name: value} if value is not None else {})
        if profile:
            events.append((1000.0 + WINDOW_S * k, 1, k, profile))
    return drive(events, name)[0]


@pytest.mark.parametrize("name", ["train/time", "Time", "time"])
def test_seconds_since_the_start_read_as_the_step_become_a_clock(name: str) -> None:
    views = _run(name, lambda k: 3600.0 + WINDOW_S * k, CLIMBS + 3)
    assert views[0].meaning == "step" and views[0].certainty < 1.0   # the name alone: the step, uncertain
    assert all(v.meaning == "step" for v in views[:CLIMBS])          # CLIMBS climbs need CLIMBS + 1 windows
    assert all(v.meaning == "" and v.outside for v in views[CLIMBS:]), [v.meaning for v in views]
    assert "wall clock" in views[-1].rule


def test_a_clock_logged_once_a_minute_is_a_clock() -> None:
    views = _run("train/time", lambda k: 120.0 + WINDOW_S * k if k % 6 == 0 else None, 6 * (CLIMBS + 1) + 1)
    assert views[-1].meaning == "" and views[-1].outside and "wall clock" in views[-1].rule


def test_a_clock_from_its_first_second_is_a_clock() -> None:
    views = _run("train/time", lambda k: WINDOW_S * k + 1.0, CLIMBS + 2)
    assert views[-1].meaning == "" and views[-1].outside


@pytest.mark.parametrize(("case", "value_at"), [
    ("steady", lambda k: 0.25 + 0.01 * (k % 3)),
    ("slowing", lambda k: 0.25 * 1.03 ** k),                  # a leak: 3 % slower a window, to 8.7 s
    ("longer than a window", lambda k: 25.0 if k % 3 == 0 else None),
    ("long and jittery", lambda k: 5.0 + 25.0 * random.Random(k).random()),  # 5-30 s steps, 10 s windows
    ("reset", lambda k: WINDOW_S * (k % CLIMBS)),             # climbs, then falls back, again and again
])
def test_a_steps_duration_stays_the_step(case: str, value_at: Callable[[int], float | None]) -> None:
    views = _run("train/time", value_at, 120)
    assert all(v.meaning == "step" for v in views), (case, [(v.meaning, v.window) for v in views])


def test_a_name_that_says_the_step_is_no_clock_but_can_be_a_running_total() -> None:
    """A name that says the step (``step_time``) is never taken for seconds since the start: only an
    uncertain read is. Numbers no step can have (3,600 s and climbing, logged every 10 s) make it a
    running total all the same."""
    views = _run("step_time", lambda k: 3600.0 + WINDOW_S * k, CLIMBS + 3)
    assert views[0].meaning == "step" and views[0].certainty == 1.0
    assert views[-1].meaning == "" and "running total" in views[-1].rule and "wall clock" not in views[-1].rule


def test_a_clock_beside_real_phases_leaves_them_alone() -> None:
    views = _run("train/time", lambda k: 60.0 + WINDOW_S * k, CLIMBS + 2, {"train/data_time": 0.05})
    assert views[-1].meaning == ""
    agg, mapper = Aggregator(), Mapper()
    ingest_records(agg, "trainer", "0", [[PROFILE, 1, {"train/data_time": 0.05}]], mapper)
    data = [v for v in agg.roll(1.0, 1.0, 1.0).series if (v.raw or v.name) == "train/data_time"]
    assert data[0].meaning == "data_wait"


def test_random_long_steps_are_never_a_clock() -> None:
    """Steps of 5-30 s in random order over 10 s windows climb now and then, never ``CLIMBS`` times
    in a row while standing at half the time watched (the rule's own numbers, 300 runs)."""
    for seed in range(300):
        r = random.Random(seed)
        watch = _Watch(WINDOW_S, WINDOW_S, 5.0 + 25.0 * r.random())
        assert not any(watch.climbed(5.0 + 25.0 * r.random(), WINDOW_S * (k + 2)) for k in range(60)), seed


def test_the_verdict_once_a_bare_time_is_known_for_a_clock() -> None:
    """A trainer logs its seconds since the start as ``train/time`` beside its data wait, 0.4 of
    each 1 s step, its GPU 45 % busy: read as the step, the clock drowns the data wait (unexplained
    idle); known for a clock, the data wait is what it is (input-bound)."""
    _, verdicts = _paced("train/time", lambda k, j: 600.0 + 10 * k + j, CLIMBS + 4)
    assert verdicts[0] == "unexplained-idle" and verdicts[-3:] == ["input-bound"] * 3, verdicts


CLOCK_TRAINER = textwrap.dedent("""
    import sys, time
    from trainer_shim import telemetry
    telemetry.configure(endpoint=sys.argv[1], role="trainer", worker="0", flush_interval_s=0.05)
    start, step = time.time() - 3600.0, 0
    while time.time() - start < 3600.0 + 90.0:
        step += 1
        telemetry.publish(step, {"train/time": time.time() - start, "train/data_time": 0.12, "train/loss": 1.0})
        time.sleep(0.2)
""")


@contextmanager
def _beside_a_daemon(tmp_path: Path, script: str) -> Iterator[DaemonProc]:
    """A real daemon on the fake NVML driver (one GPU, 40 % busy) and a real trainer process running
    ``script`` against it; both stopped on the way out."""
    library = library_or_skip("full")
    fake = FakeNvml(tmp_path / "nvml-control.txt", library, {"devices": 1})
    fake.gpu(0, clock_reasons=0, utilization_gpu=40, gpm_supported=0)
    d = DaemonProc(tmp_path, "--nvml-interval", "0.2", gpu=True,
                   extra_env={"LD_LIBRARY_PATH": str(library.parent), "FAKE_NVML_CONTROL": str(fake.path)})
    trainer = subprocess.Popen([sys.executable, "-c", script, d.endpoint], env=env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield d
    finally:
        trainer.kill()
        trainer.wait()
        d.stop()


def test_a_clock_through_the_real_daemon(tmp_path: Path) -> None:
    """The same through a real daemon, a real shim in a trainer process and the fake NVML driver."""
    with _beside_a_daemon(tmp_path, CLOCK_TRAINER) as d:
        wait_for(lambda: verdict(d) == "input-bound", timeout_s=45, what="input-bound once train/time is a clock")
        text = explain(d)
        line = next(line for line in text.splitlines() if "'train/time'" in line)
        assert "wall clock" in text and "step" not in line.split("->")[1].split("[")[0], line


def test_a_clock_that_restarts_is_watched_afresh() -> None:
    """A run resumed after downtime: its clock falls back to a few seconds and climbs again; it is
    known within ``CLIMBS`` + 1 windows of the restart, not after the downtime is made up."""
    def value_at(k: int) -> float | None:
        if k < 3:
            return 3600.0 + WINDOW_S * k
        if k < 33:
            return None  # five minutes down
        return 5.0 + WINDOW_S * (k - 33)

    views = _run("train/time", value_at, 33 + CLIMBS + 2)
    assert views[-1].meaning == "" and views[-1].outside, [v.meaning for v in views]


def test_a_series_gone_leaves_no_watch() -> None:
    """The clocks' state follows the series the window keeps, by name, not by their number."""
    from sidecar.aggregation.clocks import Clocks

    def view(name: str, mean_ms: float | None) -> SeriesView:
        return SeriesView(TIMING, name, "trainer", "0", None if mean_ms is None else {"mean": mean_ms}, {},
                          meaning="step", certainty=0.5)

    clocks = Clocks()
    clocks.settle((view("a", 1000.0),), 10.0)
    clocks.settle((view("b", None), view("c", None)), 20.0)  # a gone, b and c kept without data
    assert clocks._watched == {}  # noqa: SLF001 - the state under test


def _paced(name: str, value_at: Callable[[int, int], float | None], windows: int, steps_per_window: int = 10,
           stride: int = 1) -> tuple[list[SeriesView], list[str]]:
    """A trainer logging ``steps_per_window`` steps evenly through each 10 s window (its step moving
    by ``stride``), each with its data wait (0.4 of a second-long step) and loss, and ``name`` where
    ``value_at(window, step in window)`` says so (``drive``)."""
    events: list[Event] = []
    for k in range(windows):
        for j in range(steps_per_window):
            value = value_at(k, j)
            profile = {"train/data_time": 0.4, "train/loss": 1.0} | ({name: value} if value is not None else {})
            events.append((1000.0 + WINDOW_S * (k + j / steps_per_window), 1, stride * (steps_per_window * k + j),
                           profile))
    return drive(events, name)


@pytest.mark.parametrize("name", ["train_time", "Train/Time", "train/time", "time"])
def test_an_epochs_time_read_as_the_step_spans_many_steps(name: str) -> None:
    """An epoch's time (60 s, logged at each epoch's last step, six windows an epoch) read as the
    step: the first epoch's record spans 50 steps (``SPAN_MOVES``) at the time since the trainer
    was first seen, as every record of it so far, so it is no phase in its window; at the second
    it is a time of many steps for good, and every window reads what the data wait says."""
    views, verdicts = _paced(name, lambda k, j: 60.0 if k % 6 == 5 and j == 9 else None, 30)
    logged = [v for v in views if v.window is not None]
    assert len(logged) == 5 and logged[0].meaning == "" and "many steps in this window" in logged[0].rule
    assert all(v.meaning == "" and v.outside and "in a row" in v.rule for v in logged[1:]), [v.rule for v in logged]
    assert all(v.meaning == "" for v in views[views.index(logged[1]):])  # and between its records
    assert set(verdicts) == {"input-bound"}, verdicts


def test_a_rare_steps_first_record_that_spans_is_held_out_of_its_window_only() -> None:
    """What the first record's hold costs: a step's time logged every hundredth 1 s step from the
    hundredth on, its first logged step holding a 101 s checkpoint, looks like an epoch's end in
    that window; its next record spans nothing and it is the step from then on."""
    views, _ = drive(_every_step([1.0] * 100 + [101.0] + [1.0] * 599, 100, first=100), "train/time")
    meanings = [v.meaning for v in views if v.window is not None]
    assert meanings[0] == "" and set(meanings[1:]) == {"step"}, meanings


def test_without_the_rule_every_epoch_end_reads_unexplained_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the rule mends: with it switched off, each window an epoch ends in misreads."""
    monkeypatch.setattr("sidecar.aggregation.clocks.SPAN_MOVES", 10**9)
    _, verdicts = _paced("train_time", lambda k, j: 60.0 if k % 6 == 5 and j == 9 else None, 30)
    assert [i for i, v in enumerate(verdicts) if v != "input-bound"] == [5, 11, 17, 23, 29]


@pytest.mark.parametrize(("case", "value_at", "steps", "stride"), [
    ("every step", lambda k, j: 0.95 + 0.1 * (j % 2), 10, 1),
    ("every tenth step", lambda k, j: 1.0 if j == 0 else None, 10, 1),
    ("a checkpoint's step among them", lambda k, j: 60.0 if (k, j) == (8, 3) else 1.0, 10, 1),
    ("on a samples axis", lambda k, j: 1.0, 10, 32),
    ("a step longer than a window", lambda k, j: 25.0 if j == 0 and k % 3 == 0 else None, 1, 1),
    ("gradient accumulation: eight micro-batches logged, each with the optimizer step's time", lambda k, j: 1.0, 80, 1),
])
def test_a_steps_time_beside_its_pace_stays_the_step(case: str, value_at: Callable[[int, int], float | None],
                                                     steps: int, stride: int) -> None:
    views, _ = _paced("train/time", value_at, 20, steps, stride)
    assert views and all(v.meaning == "step" for v in views), (case, [v.rule for v in views])


def _every_step(durations: list[float], every: int = 1, first: int = 0) -> list[Event]:
    """A trainer publishing each step at its end (its loss and data wait), and its ``train/time``
    every ``every`` steps from step ``first``."""
    events: list[Event] = []
    t = 1000.0
    for step, d in enumerate(durations):
        t += d
        timed = step >= first and step % every == 0
        events.append((t, 1, step, {"train/loss": 1.0, "train/data_time": 0.4} | ({"train/time": d} if timed else {})))
    return events


def _wandb_rows(calls: int) -> list[Event]:
    """``wandb.log`` called ``calls`` times a 2 s step without ``step=``: the W&B tap publishes each
    call at W&B's row, so the axis moves ``calls`` times a step; ``train/time`` in the first call."""
    return [(1000.0 + 2.0 * k + 0.2 * c / calls * 10, 1, calls * k + c,
             {f"train/metric{c}": 1.0} | ({"train/time": 2.0} if c == 0 else {}))
            for k in range(300) for c in range(calls)]


def _beside_an_actor() -> list[Event]:
    """A learner (5 s updates) and an actor process under the same labels (no ``RANK``), the actor
    publishing each episode's return at its env step every 0.3 s."""
    learner: list[Event] = [(1000.0 + 5.0 * (i + 1), 1, i, {"train/time": 5.0, "train/loss": 1.0}) for i in range(100)]
    actor = [(1000.0 + 0.3 * (i + 1), 2, 64 * i, {"charts/episodic_return": 1.0}) for i in range(1600)]
    return learner + actor


def _micro_batches(accumulated: int) -> list[Event]:
    """Gradient accumulation over ``accumulated`` micro-batches of a 1 s optimizer step, each
    micro-batch published at its own step with the last optimizer step's time."""
    return [(1000.0 + (i + 1) / accumulated, 1, i, {"train/time": 1.0, "train/loss": 1.0})
            for i in range(accumulated * 200)]


@pytest.mark.parametrize(("case", "events"), [
    ("6 s steps, one of 90 s alone in its window", _every_step([6.0] * 40 + [90.0] + [6.0] * 159)),
    ("every hundredth 1 s step, one of them a 101 s checkpoint", _every_step([1.0] * 300 + [101.0] + [1.0] * 699, 100)),
    ("0.2 s steps for 40 minutes, then 3 s steps", _every_step([0.2] * 12000 + [3.0] * 400)),
    ("ten wandb.log calls a step", _wandb_rows(10)),
    ("a hundred wandb.log calls a step", _wandb_rows(100)),
    ("an actor's process under the learner's labels", _beside_an_actor()),
    ("64 micro-batches logged, each with the optimizer step's time", _micro_batches(64)),
])
def test_a_steps_time_logged_at_any_pace_stays_the_step(case: str, events: list[Event]) -> None:
    """The rule's false alarms a review found in its first form (one window's median against the
    run's mean pace), and more: none drops a step's time."""
    views, _ = drive(events, "train/time")
    meanings = [v.meaning for v in views if v.window is not None]
    assert meanings and set(meanings) == {"step"}, (case, meanings.count(""), len(meanings))


def _beside_a_total(name: str, total: Callable[[int], float], steps: int = 600) -> list[Event]:
    """A trainer's 1 s steps, each published at its end with its forward and backward (0.2 s each),
    its all-reduce (0.55 s) and ``name`` at ``total(step)``."""
    return [(1001.0 + step, 1, step, {"time/forward": 0.2, "time/backward": 0.2, "time/allreduce": 0.55,
                                      name: total(step)}) for step in range(steps)]


@pytest.mark.parametrize(("name", "phase", "total"), [
    ("time/dataloader", "data_wait", lambda step: 0.1 * (step + 1)),  # every batch's load summed since the start
    ("timing/fetch_ms", "data_wait", lambda step: 100.0 * (step + 1)),
    ("time/step", "step", lambda step: float(step)),                   # a count of steps under time/
    ("time/optimizer_step", "optimizer", lambda step: float(step // 4)),  # of optimizer steps, 4 batches each
])
def test_a_running_total_read_as_a_phase_is_no_phase(name: str, phase: str, total: Callable[[int], float]) -> None:
    """Read from its name, a running total is a phase until its numbers show that no step's phase can
    be that long: climbing, above twice the wall time between its windows, ``CLIMBS`` windows in a
    row. Before, a total of a 0.1 s load read as the data wait ate every verdict: a step waiting 55 %
    on its all-reduce, the GPUs 45 % busy, read input-bound (the data wait at 100 % of the step)."""
    views, verdicts = drive(_beside_a_total(name, total), name)
    assert views[0].meaning == phase
    gone = next(i for i, v in enumerate(views) if v.meaning == "")
    assert "running total" in views[gone].rule and all(v.meaning == "" for v in views[gone:]), [v.rule for v in views]
    assert verdicts[-10:] == ["communication-bound"] * 10, verdicts


def test_without_the_total_rule_a_running_total_reads_input_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the rule mends: switched off, the total of a 0.1 s load reads input-bound to the end."""
    monkeypatch.setattr("sidecar.aggregation.clocks._Total.summed", lambda self, window, now_s, senders: False)
    _, verdicts = drive(_beside_a_total("time/dataloader", lambda step: 0.1 * (step + 1)), "time/dataloader")
    assert verdicts[-10:] == ["input-bound"] * 10, verdicts


def _loader_threads(threads: int = 8) -> list[Event]:
    """``threads`` loader threads of one process, each publishing every batch's load (2-8 s at
    random, getting slower) as it ends: they add up to eight times the wall time, each record does not."""
    r = random.Random(7)
    events: list[Event] = []
    for t in range(threads):
        at = 1000.0
        for i in range(60):
            load = min(9.0, 2.0 + 6.0 * r.random() + 0.02 * i)
            at += load
            events.append((at, 1, t * 1000 + i, {"time/dataloader": load, "time/forward": 0.5}))
    return events


def _processes_under_one_label(procs: int = 8, seed: int = 2, hours: float = 4.0) -> list[Event]:
    """``procs`` processes under one worker label (no ``RANK``: concurrent trials on one node), each
    logging its iteration's time (60-120 s at random) with its data wait and forward."""
    r, events = random.Random(seed), list[Event]()
    for p in range(procs):
        at, i = 1000.0 + r.uniform(0.0, 120.0), 0
        while at < 1000.0 + hours * 3600.0:
            it = r.uniform(60.0, 120.0)
            at += it
            events.append((at, p + 1, i, {"time_this_iter_s": it, "time/dataloader": 0.1 * it,
                                          "time/forward": 0.3 * it}))
            i += 1
    return events


def _stale_step_per_micro_batch(seed: int = 0, hours: float = 2.0) -> list[Event]:
    """Gradient accumulation over eight 3 s micro-batches, each published with the last optimizer
    step's ``time/step`` (about 24 s) and its own data wait."""
    r, events, at, i, last = random.Random(seed), list[Event](), 1000.0, 0, None
    while at < 1000.0 + hours * 3600.0:
        step_s = 0.0
        for _ in range(8):
            d = 3.0 * r.uniform(0.97, 1.03)
            step_s, at = step_s + d, at + d
            events.append((at, 1, i, {"time/dataloader": 0.3, "time/forward": 1.0}
                           | ({"time/step": last} if last is not None else {})))
            i += 1
        last = step_s
    return events


def _thread_loads(threads: int = 8, seed: int = 1, hours: float = 4.0) -> list[Event]:
    """One process, ``threads`` threads each timing its loads (15-45 s: video decode, a shard's
    fetch) with ``timing()``, beside the main loop's 1 s step published every 5 s."""
    r, events = random.Random(seed), list[Event]()
    for _ in range(threads):
        at = 1000.0
        while at < 1000.0 + hours * 3600.0:
            load = r.uniform(15.0, 45.0)
            at += load
            events.append((at, 1, None, {"time/dataloader_ms": load * 1000.0}))
    steps = range(0, int(hours * 3600), 5)
    return events + [(1000.0 + s, 1, s, {"time/step": 1.0, "time/forward": 0.3}) for s in steps]


def _ms_read_as_seconds(seed: int = 0, hours: float = 2.0) -> list[Event]:
    """A 0.47 s step's phases published every tenth step in milliseconds with no unit written
    (``time/forward`` = 150), read as seconds."""
    r, events, at = random.Random(seed), list[Event](), 1000.0
    for s in range(int(hours * 3600 / 0.47)):
        d, f, b = 5 * r.uniform(0.8, 1.2), 150 * r.uniform(0.95, 1.05), 300 * r.uniform(0.95, 1.05)
        at += (d + f + b + 15) / 1000
        if s % 10 == 0:
            events.append((at, 1, s, {"time/dataloader": d, "time/forward": f, "time/backward": b,
                                      "time/step": d + f + b + 15}))
    return events


def _wandb_calls_a_step(calls: int = 5, steps: int = 600, every: int = 10) -> list[Event]:
    """An input-bound trainer (a 1.5 s data wait, 0.5 s of compute) calling ``wandb.log`` ``calls``
    times a step without ``step=``, its step timer leaving the wait out, its timings every ``every``
    steps (a review's case against a rule since withdrawn)."""
    events, at = list[Event](), 1000.0
    for s in range(steps):
        at += 2.0
        for c in range(calls):
            timed = {"time/step": 0.5, "time/forward": 0.25, "time/backward": 0.25, "time/data": 1.5}
            events.append((at + 0.01 * c, 1, calls * s + c,
                           {f"train/m{c}": 1.0} | (timed if c == 0 and s % every == 0 else {})))
    return events


def _loader_stalls(seed: int | None, steps: int = 4000, every: int = 50) -> list[Event]:
    """A 0.3 s step timer leaving the data wait out, the wait 4-8 s on one step in eight (at random
    with ``seed``; with None every tenth step, a round of ten slow workers), its timings published
    every ``every`` steps: the logged steps are often a stall's, twice in a row and more."""
    r, events, at = random.Random(seed), list[Event](), 1000.0
    for s in range(steps):
        stall = (r.random() < 1 / 8) if seed is not None else s % 10 == 0
        wait = (r.uniform(4.0, 8.0) if seed is not None else 6.0) if stall else 0.01
        at += wait + 0.3
        timed = {"time/step": 0.3, "time/forward": 0.1, "time/backward": 0.2, "time/data": wait}
        events.append((at, 1, s, {"train/loss": 1.0} | (timed if s % every == 0 else {})))
    return events


def _accumulated(phase: str, seconds: float, optimizer_steps: int = 40, micro: int = 64) -> list[Event]:
    """Gradient accumulation over ``micro`` 0.5 s micro-batches, each published at its own step with its
    time, and ``phase`` (``seconds``) once an optimizer step, at its last micro-batch (a CPU-offload
    optimizer's step, a DDP all-reduce under ``no_sync`` for the others)."""
    events, at, i = list[Event](), 1000.0, 0
    for _ in range(optimizer_steps):
        for m in range(micro):
            at += 0.5 + (seconds if m == micro - 1 else 0.0)
            events.append((at, 1, i, {"time/step": 0.5, "time/forward": 0.2, "time/backward": 0.3}
                           | ({phase: seconds} if m == micro - 1 else {})))
            i += 1
    return events


@pytest.mark.parametrize(("case", "events", "name", "meaning", "window_s", "rules"), [
    ("eight loader threads of one process", _loader_threads(), "time/dataloader", "data_wait", WINDOW_S, []),
    ("the same, 2 s windows", _loader_threads(), "time/dataloader", "data_wait", 2.0, []),
    ("a data wait slowing 3 % a window",
     [(1001.0 + s, 1, s, {"time/dataloader": 0.05 * 1.003 ** s}) for s in range(600)], "time/dataloader", "data_wait",
     WINDOW_S, []),
    ("a running total a user's rule maps (its values in ms, no unit written)",
     _beside_a_total("time/dataloader", lambda step: 100.0 * (step + 1)), "time/dataloader", "data_wait", WINDOW_S,
     [{"match": "time/dataloader", "phase": "data_wait"}]),
    ("eight processes under one label, 60-120 s iterations", _processes_under_one_label(), "time_this_iter_s", "step",
     WINDOW_S, []),
    ("a stale 24 s step time on each of 8 micro-batches", _stale_step_per_micro_batch(), "time/step", "step",
     WINDOW_S, []),
    ("eight threads timing 15-45 s loads", _thread_loads(), "time/dataloader_ms", "data_wait", WINDOW_S, []),
    ("milliseconds read as seconds", _ms_read_as_seconds(), "time/backward", "backward", WINDOW_S, []),
    ("five wandb.log calls a step, a 1.5 s wait outside a 0.5 s step timer", _wandb_calls_a_step(), "time/data",
     "data_wait", WINDOW_S, []),
    ("a stall every tenth batch, logged every fiftieth", _loader_stalls(None, 3000), "time/data", "data_wait",
     WINDOW_S, []),
    ("random stalls, logged every fiftieth step", _loader_stalls(11), "time/data", "data_wait", WINDOW_S, []),
    ("a 10 s offloaded optimizer step every 64 micro-batches", _accumulated("time/optimizer", 10.0),
     "time/optimizer", "optimizer", WINDOW_S, []),
    ("a 3 s all-reduce every 64 micro-batches", _accumulated("time/allreduce", 3.0), "time/allreduce", "comm_wait",
     WINDOW_S, []),
])
def test_a_phases_time_stays_its_phase(case: str, events: list[Event], name: str, meaning: str, window_s: float,
                                       rules: list[dict[str, str]]) -> None:
    """What is no running total stays its phase; the first form of the rule (one sender's bound,
    no look at how the values rise) dropped each of the five before the last five, a review found.
    The last five: a phase of one step logged rarely, or once in many micro-batches, standing far
    above its step timer; a rule that read such a phase as a sum over many steps (the axis's moves
    since its last record, above twice the step) was withdrawn when a review found it dropped each
    of them for good."""
    views, _ = drive(events, name, mapper=Mapper(parse_rules(rules)), window_s=window_s)
    meanings = [v.meaning for v in views if v.window is not None]
    assert meanings and set(meanings) == {meaning}, (case, [v.rule for v in views if not v.meaning][:1])


EPOCH_TRAINER = textwrap.dedent("""
    import sys, time
    from trainer_shim import telemetry
    telemetry.configure(endpoint=sys.argv[1], role="trainer", worker="0", flush_interval_s=0.05)
    start = epoch_start = time.time()
    step = 0
    while time.time() - start < 90.0:
        step += 1
        record = {"train/data_time": 0.12, "train/loss": 1.0}
        if step % 60 == 0:  # an epoch of 60 steps: its time, logged at its end
            record["train_time"] = time.time() - epoch_start
            epoch_start = time.time()
        telemetry.publish(step, record)
        time.sleep(0.2)
""")


@pytest.mark.timeout(120)
def test_a_time_of_many_steps_through_the_real_daemon(tmp_path: Path) -> None:
    """An epoch's ``train_time`` (12 s, every 60 steps of 0.2 s) beside the data wait, through a real
    daemon, a real shim in a trainer process and the fake NVML driver: from its second record the
    epoch's time is no phase, and ``explain`` says why."""
    with _beside_a_daemon(tmp_path, EPOCH_TRAINER) as d:
        _known_by_its_numbers(d, "train_time", "many steps", "step", "input-bound")


def _known_by_its_numbers(d: DaemonProc, name: str, why: str, meaning: str, then: str) -> None:
    """Wait until the real daemon's ``explain`` says ``why`` of ``name`` and no longer reads it as
    ``meaning`` (in one answer: a first record held out of its own window alone reads as ``meaning``
    again in the next), then wait for the verdict ``then``."""
    def known() -> bool:
        line = next((line for line in explain(d).splitlines() if f"'{name}'" in line), "")
        return why in line and meaning not in line.split("->")[1].split("[")[0]

    wait_for(known, timeout_s=60, interval_s=2.0, what=f"{name}: {why}, no {meaning}")
    wait_for(lambda: verdict(d) == then, timeout_s=30, what=f"{then} once {name} is known")


TOTAL_TRAINER = textwrap.dedent("""
    import sys, time
    from trainer_shim import telemetry
    telemetry.configure(endpoint=sys.argv[1], role="trainer", worker="0", flush_interval_s=0.05)
    start, step, loaded = time.time(), 0, 0.0
    while time.time() - start < 90.0:
        step += 1
        loaded += 0.01  # every batch's load summed since the start, as KDataLoader.total_load_time
        telemetry.publish(step, {"time/dataloader": loaded, "time/forward": 0.04, "time/backward": 0.04,
                                 "time/allreduce": 0.11})
        time.sleep(0.2)
""")


@pytest.mark.timeout(120)
def test_a_running_total_through_the_real_daemon(tmp_path: Path) -> None:
    """A loader's running total (``time/dataloader``) beside a step waiting 55 % on its all-reduce,
    through a real daemon, a real shim in a trainer process and the fake NVML driver (40 % busy):
    once its numbers show a running total it is no data wait, the verdict communication-bound, and
    ``explain`` says why."""
    with _beside_a_daemon(tmp_path, TOTAL_TRAINER) as d:
        _known_by_its_numbers(d, "time/dataloader", "running total", "data_wait", "communication-bound")

