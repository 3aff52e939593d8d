"""The step cycle from whatever the trainer sends: the run ledger of a loop that never calls
``publish(step)``, and the ledger's exact step count.

The end-to-end tests run the real daemon and real shim processes (no GPU metrics: the shares come
from the trainer's own timings) and read ``dflash-sidecar report``; the unit tests feed
``RunLedger`` hand-built windows whose ledger is known by construction."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sidecar.aggregation.ledger.facts import RoleFact, SenderFact, WindowFacts, step_cycles, step_numbers
from sidecar.aggregation.ledger.fold import RunLedger
from sidecar.model.ledger import CAUSES
from sidecar.model.window import COUNT, GAUGE, TIMING, SeriesView, WindowReport
from tests.daemon_harness import DaemonProc, env, wait_for

LOOP = r"""
import json, sys, time
from trainer_shim import telemetry
spec = json.loads(sys.argv[1])
configuring = time.time()
ch = telemetry.configure(spec["endpoint"], spec["role"], "0", flush_interval_s=0.05)
began = time.time()
steps = 0
while time.time() - began < spec["seconds"]:
    t = time.perf_counter()
    time.sleep(0.03)  # half of each step waits on data
    ch.timing("data_wait_ms", (time.perf_counter() - t) * 1000)
    time.sleep(0.03)
    ch.timing("step_ms", (time.perf_counter() - t) * 1000)
    ch.count("batches")
    if spec["publish"] == "publish":
        ch.publish(steps, {})  # 0-based, every step
    elif spec["publish"] == "field":
        ch.gauge("global_step", steps)  # a step field of its own, no publish(step)
    steps += 1
telemetry.flush(1.0)
print(json.dumps({"configuring": configuring, "began": began, "ended": time.time(), "steps": steps}))
"""


def _loop(endpoint: str, role: str, seconds: float, publish: str = "") -> subprocess.Popen[str]:
    spec = {"endpoint": endpoint, "role": role, "seconds": seconds, "publish": publish}
    return subprocess.Popen([sys.executable, "-c", LOOP, json.dumps(spec)], stdout=subprocess.PIPE, text=True,
                            env=env())


def _done(proc: subprocess.Popen[str]) -> dict[str, float]:
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0
    return {**json.loads(out.strip().splitlines()[-1]), "exited": time.time()}


def _report(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sidecar", "report", "--state-dir", str(state), *args],
                          capture_output=True, text=True, env=env(), timeout=60)


def _roles(state: Path) -> dict[str, dict[str, Any]]:
    out = _report(state, "--json")
    return {r["role"]: r for r in json.loads(out.stdout)["runs"]} if out.returncode == 0 else {}


def test_a_loop_without_publish_has_a_ledger_that_sums_to_its_wall_time_across_a_daemon_restart(
        tmp_path: Path) -> None:
    # The loop of issue 32: data_wait and step timings and a batches counter, never publish(step).
    # Before the fix every second of it was held as a startup that never ended: 0 s in the ledger.
    state = tmp_path / "state"
    args = ("--state-dir", str(state))
    d = DaemonProc(tmp_path, *args, interval=1.0)
    endpoint = d.endpoint
    try:
        loop = _loop(endpoint, "trainer", 10.0)
        before = wait_for(lambda: d.value("dflash_ledger_seconds_total", role="trainer", cause="data"),
                          timeout_s=20, what="data seconds in the ledger before the restart")
        wait_for(lambda: d.value("dflash_pipeline_bottleneck", verdict="input-bound") == 1.0, timeout_s=20,
                 what="the verdict of a loop that waits half of each step on data")
        d.stop()
        time.sleep(1.0)
        d = DaemonProc(tmp_path, *args, interval=1.0, endpoint=endpoint)
        wait_for(lambda: (d.value("dflash_ledger_seconds_total", role="trainer", cause="data") or 0) > before,
                 timeout_s=20, what="the data seconds to continue after the restart")
        out = _done(loop)
        wait_for(lambda: (d.value("dflash_ledger_open_gap_seconds", role="trainer") or 0) > 0, timeout_s=20,
                 what="the loop to be gone")
    finally:
        d.stop()
    r = _roles(state)["trainer"]
    s = r["seconds"]
    assert r["wall_s"] == pytest.approx(sum(s.values()))
    shortest, longest = out["ended"] - out["began"], out["exited"] - out["configuring"]
    assert 0.85 * shortest <= r["wall_s"] <= 1.15 * longest, (r["wall_s"], shortest, longest, s)
    assert s["unobserved"] > 0.5, s  # the daemon was down a second and more
    stepping = r["wall_s"] - s["unobserved"] - s["startup"]
    assert s["data"] / stepping == pytest.approx(0.5, abs=0.1), s  # half of each step on data
    # the steps counted are those seen: all but those of the daemon's absence and of the seconds the
    # shim takes to find the new one (its records meanwhile are lost and counted: up to 3 s on a loaded box)
    seen = out["steps"] * (stepping - 3.0) / shortest
    assert seen <= r["steps"] <= out["steps"], (r["steps"], out["steps"], s)
    table = _report(state)
    assert table.returncode == 0, table.stderr
    data_line = next(line for line in table.stdout.splitlines() if line.split()[:1] == ["data"])
    assert float(data_line.split()[1]) == pytest.approx(s["data"], abs=0.06), table.stdout


def test_the_ledger_counts_every_step_from_the_first_stepping_window(tmp_path: Path) -> None:
    # Issue 36.6: the steps of a sender's first stepping window were left out (582 of 984).
    state = tmp_path / "state"
    d = DaemonProc(tmp_path, "--state-dir", str(state), interval=1.0)
    try:
        loops = {"numbered": _loop(d.endpoint, "numbered", 3.0, "publish"),
                 "field": _loop(d.endpoint, "field", 3.0, "field"), "counted": _loop(d.endpoint, "counted", 3.0)}
        runs = {role: _done(loop) for role, loop in loops.items()}
        wait_for(lambda: all((d.value("dflash_ledger_open_gap_seconds", role=role) or 0) > 0 for role in runs),
                 timeout_s=20, what="both loops to be gone")
    finally:
        d.stop()
    roles = _roles(state)
    for role, out in runs.items():
        assert roles[role]["steps"] == out["steps"], (role, roles[role]["steps"], out["steps"])


SHARES = dict.fromkeys(CAUSES, 0.0) | {"productive": 0.5, "data": 0.5}


def _sender(end: float, step: int | None = None, cycles: int | None = None, first: int | None = None,
            key: str = "1@100") -> SenderFact:
    return SenderFact(key, "run-1", "trainer", 100.0, max(100.0, end - 1.0), end, step, True, None,
                      first_step=first, cycles=cycles)


def _window(end: float, *senders: SenderFact, step_s: float = 0.0) -> WindowFacts:
    return WindowFacts(end, 1.0, senders, {"trainer": RoleFact(SHARES, step_s=step_s)})


def test_steps_counted_without_step_numbers_end_startup_and_add_up() -> None:
    led = RunLedger()
    led.add(_window(101, _sender(101)))  # started at 100: nothing tells a step yet
    led.add(_window(102, _sender(102, cycles=4), step_s=0.4))  # four steps in the last 0.4 s
    led.add(_window(103, _sender(103, cycles=10)))
    led.add(_window(104, _sender(104, cycles=0)))  # a window without a step (a long save) is no startup
    [r] = led.view().roles
    assert r.seconds["startup"] == pytest.approx(1.6) and r.starting_s == 0.0
    assert r.seconds["data"] == pytest.approx(0.5 * 2.4) and r.wall_s == pytest.approx(4.0)
    assert r.steps == 14


def test_step_numbers_win_and_the_first_published_one_counts() -> None:
    led = RunLedger()
    led.add(_window(101, _sender(101, step=7, cycles=9, first=0)))  # steps 0..7 published: 8 done
    led.add(_window(102, _sender(102, step=17, cycles=9)))
    [r] = led.view().roles
    assert r.steps == 18


def test_time_held_before_a_step_that_never_comes_is_unobserved_once_its_senders_are_gone() -> None:
    led = RunLedger()
    for end in (101, 102, 103):  # a trainer that sends nothing telling a step, then exits
        led.add(_window(end, _sender(end)))
    [r] = led.view().roles
    assert r.wall_s == 0.0 and r.starting_s == pytest.approx(3.0)
    led.add(WindowFacts(110, 1.0, (), {}))  # its sender no longer listed, not yet 10 s silent
    assert led.view().roles[0].wall_s == 0.0
    led.add(WindowFacts(114, 1.0, (), {}))
    [r] = led.view().roles
    assert r.seconds["unobserved"] == pytest.approx(3.0) and r.wall_s == pytest.approx(3.0) and r.starting_s == 0


def test_a_restarted_daemon_waits_for_a_starting_trainer_to_reconnect() -> None:
    led = RunLedger()
    for end in (101, 102, 103):
        led.add(_window(end, _sender(end)))
    again = RunLedger(led.state())  # a new daemon whose first windows, long after, hear nobody yet
    again.add(WindowFacts(130, 1.0, (), {}))
    again.add(WindowFacts(131, 1.0, (), {}))
    again.add(_window(132, _sender(132)))  # reconnected, still starting
    again.add(_window(133, _sender(133, cycles=3), step_s=0.3))
    [r] = again.view().roles
    assert r.seconds["unobserved"] == 0.0 and r.seconds["startup"] == pytest.approx(133 - 0.3 - 100)


def _view(kind: int, name: str, meaning: str, window: dict[str, float], worker: str = "0",
          total: int = 100) -> SeriesView:
    return SeriesView(kind, name, "trainer", worker, window, {"count": total}, meaning)


def test_step_cycles_prefer_step_timings_then_the_batches_counter_then_the_rarest_phase() -> None:
    series = (
        _view(TIMING, "data_wait_ms", "data_wait", {"count": 8}, "a"),
        _view(TIMING, "fwd_ms", "forward", {"count": 5}, "a"),
        _view(TIMING, "data_wait_ms", "data_wait", {"count": 8}, "b"),
        _view(COUNT, "batches", "batches", {"delta": 6.0}, "b"),
        _view(COUNT, "batches", "batches", {"delta": 6.0}, "c"),
        _view(TIMING, "step_ms", "step", {"count": 7}, "c"),
        _view(TIMING, "loss_ms", "", {"count": 99}, "d"),
        # a first step still running: its data wait seen, nothing else yet; the phase's first occurrence ends no step
        _view(TIMING, "data_wait_ms", "data_wait", {"count": 1}, "e", total=1),
        _view(TIMING, "data_wait_ms", "data_wait", {"count": 3}, "f", total=3),
    )
    cycles = step_cycles(WindowReport(10.0, 1.0, series))
    assert cycles == {("trainer", "a"): 5, ("trainer", "b"): 6, ("trainer", "c"): 7, ("trainer", "e"): 0,
                      ("trainer", "f"): 2}


def test_a_step_field_gives_step_numbers_in_the_windows_that_send_one() -> None:
    fresh = SeriesView(GAUGE, "iter", "trainer", "0", {"min": 40.0, "max": 49.0, "last": 49.0}, {"last": 49.0},
                       "step_number")
    stale = SeriesView(GAUGE, "global_step", "trainer", "1", None, {"last": 120.0}, "step_number")
    loss = SeriesView(GAUGE, "loss", "trainer", "2", {"min": 1.0, "last": 2.0}, {"last": 2.0}, "loss")
    assert step_numbers(WindowReport(10.0, 1.0, (fresh, stale, loss))) == {("trainer", "0"): (49, 40)}


def test_steps_counted_between_two_step_numbers_are_not_counted_twice() -> None:
    led = RunLedger()
    led.add(_window(101, _sender(101, step=10, cycles=11, first=0), step_s=1.0))  # steps 0..10: 11 done
    led.add(_window(102, _sender(102, cycles=10)))  # no number this window: the next one counts them
    led.add(_window(103, _sender(103, step=30, cycles=10)))
    [r] = led.view().roles
    assert r.steps == 31


def test_an_iterations_counter_counts_steps() -> None:
    from sidecar.processing.presets import find
    from sidecar.processing.units import read_unit

    for name in ("iterations", "iters"):
        hit = find(COUNT, name, read_unit(name), False)
        assert hit is not None and hit.meaning == "batches", name
