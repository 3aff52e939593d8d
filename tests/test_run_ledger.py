"""The run ledger (goodput): where each run's wall time and GPU energy went, kept across trainer
and daemon restarts.

The unit tests feed ``RunLedger`` hand-built windows whose ledger is known by construction; the
end-to-end test runs the real daemon over the fake NVML driver (a constant power draw, so energy
is known) with two real shim processes in turn (a trainer restart) and a daemon restart while
the second one runs, then reads ``dflash-sidecar report --json``."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sidecar.aggregation.ledger.facts import RoleFact, SenderFact, WindowFacts
from sidecar.aggregation.ledger.fold import RunLedger
from sidecar.core.ledger_state import FILE_NAME, load, save, state_dir
from sidecar.core.timeline_state import load_view
from sidecar.model.ledger import CAUSES, peak_flops
from tests.daemon_harness import DaemonProc, env, wait_for
from tests.fake_nvml.control import FakeNvml
from tests.fake_nvml.helpers import library_or_skip

SHARES = dict.fromkeys(CAUSES, 0.0) | {"productive": 0.5, "data": 0.3, "host": 0.2}


def window(end: float, senders: tuple[SenderFact, ...], duration: float = 1.0, **fact: float) -> WindowFacts:
    return WindowFacts(end, duration, senders, {"trainer": RoleFact(SHARES, tokens=100.0, **fact)})


def sender(key: str, started: float, end: float, step: int | None, duration: float = 1.0) -> SenderFact:
    return SenderFact(key, "run-1", "trainer", started, max(started, end - duration), end, step)


def role(ledger: RunLedger):  # type: ignore[no-untyped-def]
    [r] = ledger.view().roles
    return r


def test_startup_then_steps_split_by_the_windows_shares() -> None:
    led = RunLedger()
    # started at 100.5; windows end at 101..106; first step published in the window ending at 103
    for end in range(101, 107):
        led.add(window(end, (sender("1@100.5", 100.5, end, None if end < 103 else end),)))
    r = role(led)
    assert r.first_unix_s == 100.5 and r.last_unix_s == 106
    assert r.seconds["startup"] == pytest.approx(1.5)  # 100.5 -> 102, the windows without a step
    assert r.seconds["productive"] == pytest.approx(2.0) and r.seconds["data"] == pytest.approx(1.2)
    assert r.seconds["host"] == pytest.approx(0.8)
    assert r.wall_s == pytest.approx(5.5)
    assert r.goodput_ratio == pytest.approx(2.0 / 5.5)
    assert r.steps == 106 - 103 + 1 and r.tokens == 400.0  # publish(103) says step 103 is done: it counts


def test_a_trainer_restart_is_a_restart_gap_until_the_successor_starts() -> None:
    led = RunLedger()
    for end in range(101, 104):
        led.add(window(end, (sender("1@100", 100, end, end),)))
    for end in (104, 105):  # the first process is gone: an open gap, not yet wall time
        led.add(window(end, ()))
    assert role(led).open_gap_s == pytest.approx(2.0)
    assert role(led).wall_s == pytest.approx(3.0)
    # the successor started at 105.4, said its first step in the window ending at 107
    led.add(window(106, (sender("2@105.4", 105.4, 106, None),)))
    led.add(window(107, (sender("2@105.4", 105.4, 107, 1),)))
    r = role(led)
    assert r.seconds["restart_gap"] == pytest.approx(2.4)  # 103 -> 105.4
    assert r.seconds["startup"] == pytest.approx(0.6)
    assert r.open_gap_s == 0.0
    assert r.wall_s == pytest.approx(107 - 100)
    assert led.view().no_trainer_s == pytest.approx(2.4)  # 103 -> 105.4 with nothing alive on the box


def test_a_predecessor_still_listed_beside_its_successor_does_not_hide_the_gap() -> None:
    led = RunLedger()
    for end in range(101, 104):
        led.add(window(end, (sender("1@100", 100, end, end),)))
    gone = SenderFact("1@100", "run-1", "trainer", 100, 103, 103, 3, sending=False)  # silent, not yet forgotten
    led.add(window(104, (gone,)))
    led.add(window(106, (gone, sender("2@105", 105, 106, 1)), duration=2.0))
    r = role(led)
    assert r.seconds["restart_gap"] == pytest.approx(2.0)  # 103 -> 105, the successor's start
    assert r.wall_s == pytest.approx(6.0)


def killed_then_successor(told_in: int) -> RunLedger:
    """A sender killed after its last message at 103, told ``unclean`` in the window ending at
    ``told_in``, and its successor started at 105.4 (heard from the window ending at 106 on)."""
    led = RunLedger()
    for end in range(101, 104):
        led.add(window(end, (sender("1@100", 100, end, end),)))
    gone = SenderFact("1@100", "run-1", "trainer", 100, 103, 103, 3, sending=False)
    for end in range(104, 109):
        listed = (gone,) + ((sender("2@105.4", 105.4, end, end - 105),) if end >= 106 else ())
        told = (("trainer", "unclean"),) if end == told_in else ()
        led.add(dataclasses.replace(window(end, listed), ends=told))
    return led


@pytest.mark.parametrize("told_in", [105, 106, 108])
def test_the_gap_after_an_unclean_end_is_booked_under_it_whichever_is_told_first(told_in: int) -> None:
    """The end told before the successor's hello, in its first window, or after it: the same gap,
    103 -> 105.4, under ``unclean``, once."""
    r = role(killed_then_successor(told_in))
    assert r.seconds["restart_gap"] == pytest.approx(2.4)
    assert r.ends == {"unclean": 1} and r.gap_after == pytest.approx({"unclean": 2.4})


def test_a_daemon_restart_continues_the_ledger_and_counts_the_time_it_missed(tmp_path: Path) -> None:
    led = RunLedger()
    for end in range(101, 104):
        led.add(window(end, (sender("1@100", 100, end, end),)))
    path = tmp_path / FILE_NAME
    save(path, led.state())
    state, problem = load(path)
    assert problem is None
    again = RunLedger(state)  # a new daemon: its first window begins at 106
    again.add(window(107, (sender("1@100", 100, 107, 107),)))
    r = role(again)
    assert r.seconds["unobserved"] == pytest.approx(3.0)  # 103 -> 106: the same process, unseen
    assert r.wall_s == pytest.approx(7.0)
    assert r.steps == 107 - 101 + 1  # progress from the saved step, not from zero (step 101 counts)
    assert again.view().no_trainer_s == 0.0


def test_checkpoint_and_compile_come_out_of_the_idle_causes_first() -> None:
    led = RunLedger()
    led.add(window(101, (sender("1@100", 100, 101, 1),), checkpoint_s=0.15, first_step_excess_s=0.3))
    s = role(led).seconds
    # shares of the stepping second: productive 0.5, data 0.3, host 0.2; host, then data, give way
    assert s["checkpoint"] == pytest.approx(0.15) and s["compile"] == pytest.approx(0.3)
    assert s["host"] == 0.0 and s["data"] == pytest.approx(0.05) and s["productive"] == pytest.approx(0.5)
    led.add(window(102, (sender("1@100", 100, 102, 2),), first_step_excess_s=0.3))
    led.add(window(103, (sender("1@100", 100, 103, 3),), first_step_excess_s=0.3))
    assert role(led).seconds["compile"] == pytest.approx(0.6)  # only the sender's first two windows
    assert sum(role(led).seconds.values()) == pytest.approx(3.0)


def test_a_long_first_step_turns_the_held_startup_into_compile() -> None:
    led = RunLedger()
    for end in (101, 102):  # started at 100; the first step (1.5 s of it compiling) ends in the third window
        led.add(window(end, (sender("1@100", 100, end, None),)))
    assert role(led).wall_s == 0.0 and role(led).starting_s == pytest.approx(2.0)  # held, not yet told
    led.add(window(103, (sender("1@100", 100, 103, 1),), first_step_excess_s=1.5))
    s = role(led).seconds
    assert s["compile"] == pytest.approx(1.5) and s["startup"] == pytest.approx(0.5)
    assert s["productive"] == pytest.approx(0.5) and role(led).wall_s == pytest.approx(3.0)


def test_energy_goes_with_the_seconds_and_gives_joules_per_token_and_mfu() -> None:
    led = RunLedger(flops_per_token=1e9)
    for i, end in enumerate(range(101, 105)):
        facts = window(end, (sender("1@100", 100, end, end),))
        led.add(WindowFacts(facts.end_unix_s, 1.0, facts.senders,
                            {"trainer": RoleFact(SHARES, tokens=100.0, gpus=2, gpu_name="NVIDIA H100 80GB HBM3")},
                            {"GPU-a": 1000.0 + 300 * i, "GPU-b": 50.0 + 100 * i},
                            {"GPU-a": "trainer", "GPU-b": "trainer"}))
    r = role(led)
    assert r.energy_j == pytest.approx(3 * 400)  # three deltas after the first reading
    assert r.joules["productive"] == pytest.approx(0.5 * 1200)
    assert r.joules_per_token == pytest.approx(1200 / 400) and r.joules_per_step == pytest.approx(1200 / 4)
    assert r.tokens_per_s_per_gpu == pytest.approx(400 / 4 / 2)
    assert r.mfu_ratio == pytest.approx(1e9 * 50 / 989.4e12)
    assert peak_flops("NVIDIA H100 PCIe") == 756.0e12 and peak_flops("Tesla T4") is None


def metered() -> Callable[[int, tuple[SenderFact, ...]], WindowFacts]:
    """Windows of 1 s ending at a given time, with one trainer GPU whose energy counter rises
    100 J per window."""
    counter = iter(range(1000, 100000, 100))

    def facts(end: int, senders: tuple[SenderFact, ...]) -> WindowFacts:
        return WindowFacts(end, 1.0, senders, {"trainer": RoleFact(SHARES, gpus=1)},
                           {"GPU-a": float(next(counter))}, {"GPU-a": "trainer"})

    return facts


def test_the_gpus_energy_during_a_restart_gap_is_the_gaps() -> None:
    led, facts = RunLedger(), metered()
    for end in range(101, 104):
        led.add(facts(end, (sender("1@100", 100, end, end),)))
    for end in (104, 105):  # gone (its exit booked): no sender of the role listed
        led.add(facts(end, ()))
    led.add(facts(106, (sender("2@105", 105, 106, 1),)))
    r = role(led)
    assert r.seconds["restart_gap"] == pytest.approx(2.0)
    assert r.joules["restart_gap"] == pytest.approx(200.0)  # the two gap windows' energy, none of the next
    assert r.energy_j == pytest.approx(500.0)  # every rise after the first reading


def test_the_energy_of_windows_before_a_known_sender_is_heard_again_is_that_senders() -> None:
    # A restarted daemon: its first window hears nobody yet (the trainer reconnects late), the
    # next one hears the same process again. The counter's rise over the daemon's downtime and
    # that first window is the trainer's, booked with the seconds its next message covers.
    led, facts = RunLedger(), metered()
    for end in range(101, 104):
        led.add(facts(end, (sender("1@100", 100, end, end),)))
    led.add(facts(104, ()))  # nobody heard in this window
    led.add(facts(105, (sender("1@100", 100, 105, 105),)))  # the same process again
    r = role(led)
    assert "restart_gap" not in r.joules or r.joules["restart_gap"] == 0.0
    assert r.energy_j == pytest.approx(400.0)  # every rise after the first reading (held ones too)
    assert r.wall_s == pytest.approx(5.0)


def test_a_silent_predecessor_listed_beside_its_successor_does_not_hide_the_gap() -> None:
    # A silent sender's last message is placed at its receipt time in every window: listed again,
    # it is no message sent since
    led = RunLedger()
    for end in range(101, 104):
        led.add(window(end, (sender("1@100", 100, end, end),)))
    again = SenderFact("1@100", "run-1", "trainer", 100, 103, 103, 3)  # silent 2 s: still "alive"
    led.add(window(105, (again, sender("2@104.5", 104.5, 105, None)), duration=2.0))
    led.add(window(106, (sender("2@104.5", 104.5, 106, 1),)))
    r = role(led)
    assert r.seconds["restart_gap"] == pytest.approx(1.5)  # 103 -> 104.5, the successor's start
    assert r.wall_s == pytest.approx(6.0)


def test_a_message_a_few_milliseconds_after_the_accounted_one_is_booked() -> None:
    # placements are exact (one stored float per message): no tolerance swallows a message sent since
    led = RunLedger()
    for end in range(101, 104):
        led.add(window(end, (sender("1@100", 100, end, end),)))
    led.add(window(104, (sender("1@100", 100, 103.004, 3),)))
    assert role(led).wall_s == pytest.approx(3.004, abs=1e-9)


def test_a_long_first_step_alone_in_its_window_is_compile_once_the_next_window_has_a_median() -> None:
    led = RunLedger()
    # the first step (0.9 s, compiling) is the only step timing of its window: no median yet
    led.add(window(101, (sender("1@100", 100, 101, 1),), step_s=0.9, lone_step_s=0.9))
    assert role(led).seconds["compile"] == 0.0
    led.add(window(102, (sender("1@100", 100, 102, 11),), step_s=1.0, median_step_s=0.1))
    s = role(led).seconds
    assert s["compile"] == pytest.approx(0.8)  # its excess over the next window's median
    assert sum(s.values()) == pytest.approx(2.0)  # moved from what the first window told, not added
    led.add(window(103, (sender("1@100", 100, 103, 21),), step_s=1.0, median_step_s=0.1))
    assert role(led).seconds["compile"] == pytest.approx(0.8)


def shares(unattributed: float) -> dict[str, float]:
    return dict.fromkeys(CAUSES, 0.0) | {"productive": 1.0 - unattributed, "unattributed": unattributed}


def test_slow_first_steps_are_warmup_once_the_step_time_settles() -> None:
    led = RunLedger()
    # first step in the window ending at 101 (its steps untold), then 2 slow steps (0.5 s each),
    # then 10 steps a second twice: the step time settled at 0.1 s with 5 % of the time unattributed
    for end, step, idle in ((101, 1, 0.6), (102, 3, 0.3), (103, 13, 0.05), (104, 23, 0.05)):
        led.add(WindowFacts(end, 1.0, (sender("1@100", 100, end, step),), {"trainer": RoleFact(shares(idle))}))
        if end == 103:  # not settled yet: nothing retold
            assert role(led).seconds["warmup"] == 0.0 and role(led).seconds["unattributed"] == pytest.approx(0.95)
    s = role(led).seconds
    # beyond the settled 5 %: 0.55 s of the first window, 0.25 s of the second
    assert s["warmup"] == pytest.approx(0.8) and s["unattributed"] == pytest.approx(0.2)
    assert s["productive"] == pytest.approx(0.4 + 0.7 + 0.95 + 0.95)
    assert sum(s.values()) == pytest.approx(4.0) == role(led).wall_s
    led.add(WindowFacts(105, 1.0, (sender("1@100", 100, 105, 24),), {"trainer": RoleFact(shares(0.6))}))
    assert role(led).seconds["warmup"] == pytest.approx(0.8)  # once settled, a slow window is not warm-up


def test_the_time_after_the_last_step_to_a_clean_exit_is_shutdown() -> None:
    def run(closed: bool) -> dict[str, float]:
        led = RunLedger()
        for end, step in ((101, 1), (102, 11), (103, 21), (104, 21), (105, 31), (106, 41), (107, 41)):
            led.add(window(end, (sender("1@100", 100, end, step),)))  # no progress in 104: a pause, not the end
        last = SenderFact("1@100", "run-1", "trainer", 100, 107, 107.5, 41, sending=False, closed=closed)
        led.add(window(108, (last,)))
        return dict(role(led).seconds)

    s = run(closed=True)
    assert s["shutdown"] == pytest.approx(1.5)  # 106 (the last window with progress) -> 107.5, its last message
    assert sum(s.values()) == pytest.approx(7.5)
    assert s["productive"] == pytest.approx(0.5 * 6.0)  # the pause in 104 stays where its shares put it
    unclean = run(closed=False)  # gone without a closing message: no clean end to tell
    assert unclean["shutdown"] == 0.0 and sum(unclean.values()) == pytest.approx(7.5)
    led = RunLedger()  # steps only in the first window with steps (their number untold): still steps
    led.add(window(101, (sender("1@100", 100, 101, 3),)))
    led.add(window(102, (SenderFact("1@100", "run-1", "trainer", 100, 101, 101.5, 3, sending=False, closed=True),)))
    assert role(led).seconds["shutdown"] == pytest.approx(0.5) and role(led).wall_s == pytest.approx(1.5)


def host_sender(key: str, started: float, end: float, step: int | None) -> SenderFact:
    return SenderFact(key, "host:box", "trainer", started, max(started, end - 1.0), end, step)


def test_runs_without_a_wandb_run_or_label_are_cut_at_gaps_longer_than_run_gap_s() -> None:
    led = RunLedger(run_gap_s=5.0)
    for end in range(101, 104):
        led.add(window(end, (host_sender("1@100", 100, end, end),)))
    for end in range(104, 107):
        led.add(window(end, ()))
    # a restart 3 s after the last message: the same run, a restart gap
    for end in range(107, 110):
        led.add(window(end, (host_sender("2@106", 106, end, end),)))
    for end in range(110, 119):
        led.add(window(end, ()))
    # 9.5 s after the last message: a new run, named by its start
    gone = SenderFact("2@106", "host:box", "trainer", 106, 109, 109, 9, sending=False)  # still listed: not moved
    for end in range(119, 122):
        led.add(window(end, (gone, host_sender("3@118.5", 118.5, end, end)) if end == 119 else
                       (host_sender("3@118.5", 118.5, end, end),)))
    view = led.view()
    assert view.runs == ("host:box@19700101T000140Z", "host:box@19700101T000158Z")
    [first] = view.run("host:box@19700101T000140Z")
    [second] = view.run("host:box@19700101T000158Z")
    assert first.seconds["restart_gap"] == pytest.approx(3.0) and first.wall_s == pytest.approx(9.0)
    assert second.seconds["restart_gap"] == 0.0 and second.wall_s == pytest.approx(121 - 118.5)
    assert led.view().no_trainer_s == pytest.approx(3.0 + 9.5)
    again = RunLedger(led.state(), run_gap_s=5.0)  # a daemon restart keeps the host's current run
    again.add(window(123, (host_sender("3@118.5", 118.5, 123, 123),)))
    assert again.view().runs == view.runs


def test_the_run_is_the_wandb_run_then_the_label_then_the_host_and_flops_come_from_the_hello() -> None:
    from sidecar.aggregation.ledger.facts import _flops_of, run_of

    assert run_of({"wandb_run_id": "abc", "run_label": "slurm:7", "host": "box"}) == "abc"
    assert run_of({"run_label": "slurm:7", "host": "box"}) == "slurm:7"
    assert run_of({"run_label": "", "host": "box"}) == "host:box" and run_of(None) == "host:unknown"
    assert _flops_of({"flops_per_token": 2e9}) == 2e9
    assert _flops_of({"flops_per_token": float("nan")}) is None and _flops_of({"flops_per_token": True}) is None
    led = RunLedger(flops_per_token=1e9)  # the daemon's setting, for trainers that state none
    stated = SenderFact("1@100", "run-1", "trainer", 100, 100, 101, 1, flops_per_token=4e9)
    led.add(WindowFacts(101, 1.0, (stated, SenderFact("2@100", "run-2", "trainer", 100, 100, 101, 1)),
                        {"trainer": RoleFact(SHARES, tokens=1000.0, gpus=1, gpu_name="NVIDIA H100 80GB HBM3")}))
    mfu = {r.run: r.mfu_ratio for r in led.view().roles}
    assert mfu["run-1"] == pytest.approx(4e9 * 1000 / 989.4e12) and mfu["run-2"] == pytest.approx(1e9 * 1000 / 989.4e12)


def test_a_bad_state_file_is_moved_aside_and_a_newer_one_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    path.write_text("{not json")
    assert load(path) == (None, "corrupt")
    assert (tmp_path / (FILE_NAME + ".corrupt")).exists() and not path.exists()
    path.write_text(json.dumps({"version": 99, "runs": {}}))
    assert load(path, move_aside=False) == (None, "newer_version") and path.exists()  # a reader leaves it
    assert load(path) == (None, "newer_version") and (tmp_path / (FILE_NAME + ".newer")).exists()
    path.write_text(json.dumps({"version": 1, "runs": {"r": {"x": {"senders": {}, "seconds": {"a": "1"}}}}}))
    assert load(path)[1] == "corrupt"


def test_the_state_folder_rule(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", f"{tmp_path}/sd:{tmp_path}/other")
    assert state_dir("/configured") == tmp_path / "sd"
    monkeypatch.delenv("STATE_DIRECTORY")
    assert state_dir("/configured") == Path("/configured")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert state_dir(None) == tmp_path / "xdg" / "dflash-sidecar"


TRAINER = r"""
import json, os, sys, time
from trainer_shim import telemetry
spec = json.loads(sys.argv[1])
configuring = time.time()  # the shim's start (the run's first second) lies in configure()
telemetry.configure(spec["endpoint"], "trainer", "0", flush_interval_s=0.05, wandb_run_id="run-abc",
                    flops_per_token=2e9)
began = time.time()
time.sleep(spec["startup_s"])
steps = 0
for i in range(spec["steps"]):
    if spec.get("stop") and os.path.exists(spec["stop"]):  # the test says when: after the daemon's restart
        break
    t = time.perf_counter()
    time.sleep(0.02)
    telemetry.timing("data_wait_ms", 20.0)
    time.sleep(spec["first_s"] if i == 0 else 0.06)
    telemetry.timing("forward_ms", (time.perf_counter() - t) * 1000 - 20.0)
    if i == spec["checkpoint_at"]:
        time.sleep(0.4)
        telemetry.timing("checkpoint_ms", 400.0)
    telemetry.count("tokens", 1000)
    telemetry.timing("step_ms", (time.perf_counter() - t) * 1000)
    steps = i + 1
    publishing = time.time()  # the last message lies after this: it carries this publish
    telemetry.publish(steps, {"lr": 0.001})
    first_step = first_step if i else time.time()
    time.sleep(max(0.0, 0.1 - (time.perf_counter() - t)) if i != spec["checkpoint_at"] else 0.0)
telemetry.flush(1.0)
print(json.dumps({"configuring": configuring, "began": began, "first_step": first_step, "publishing": publishing,
                  "ended": time.time(),
                  "steps": steps, "pid": os.getpid()}))
"""


def _role_state(state: Path, run: str, role: str) -> dict[str, Any]:
    """One role's totals as the ledger's state file holds them."""
    loaded, problem = load(state / FILE_NAME, move_aside=False)
    assert loaded is not None, problem
    return dict(loaded["runs"][run][role])


def _senders(state: Path, run: str, role: str) -> dict[int, tuple[float, float]]:
    """pid -> (its start, its last message as the ledger placed it) of each sender process the
    ledger's state file remembers for ``run`` and ``role``."""
    out = {}
    for key, sender in _role_state(state, run, role)["senders"].items():
        pid, started = key.split("@")
        out[int(pid)] = (float(started), float(sender["seen_unix_s"]))
    return out


def _trainer(endpoint: str, **spec: float | str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", TRAINER, json.dumps({"endpoint": endpoint, **spec})],
                            stdout=subprocess.PIPE, text=True, env=env())


def _done(proc: subprocess.Popen[str]) -> dict[str, float]:
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    return {**json.loads(out.strip().splitlines()[-1]), "exited": time.time()}


def test_the_fake_drivers_energy_counter_reads_on_across_processes(tmp_path: Path) -> None:
    # A real driver counts energy since it loaded, so a restarted daemon reads on; the fake counted
    # from each process's load, and the scripted run's daemon restart lost the energy of the time
    # it was down (now and then past the 15 % the energy check allows).
    library = library_or_skip("full")
    fake = FakeNvml(tmp_path / "nvml-control.txt", library, {"devices": 1})
    fake.gpu(0, power_mw=200_000)
    code = ("import time, pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0); "
            "print(time.monotonic(), pynvml.nvmlDeviceGetTotalEnergyConsumption(h))")
    environ = env(LD_LIBRARY_PATH=str(library.parent), FAKE_NVML_CONTROL=str(fake.path))
    reads = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=60)
        assert out.returncode == 0, out.stderr
        reads.append([float(x) for x in out.stdout.split()])
    (t0, mj0), (t1, mj1) = reads
    assert mj1 - mj0 == pytest.approx(200_000 * (t1 - t0), rel=0.05, abs=2_000)  # 200 W between the reads


def test_scripted_run_with_a_trainer_and_a_daemon_restart(tmp_path: Path) -> None:
    library = library_or_skip("full")
    fake = FakeNvml(tmp_path / "nvml-control.txt", library, {"devices": 1})
    fake.gpu(0, utilization_gpu=60, power_mw=200_000, clock_reasons=0)
    state = tmp_path / "state"
    args = ("--nvml-interval", "0.2", "--gpu-group", "trainer=0", "--state-dir", str(state),
            "--flops-per-token", "1e9")
    gpu_env = {"LD_LIBRARY_PATH": str(library.parent), "FAKE_NVML_CONTROL": str(fake.path)}
    d = DaemonProc(tmp_path, *args, interval=1.0, gpu=True, extra_env=gpu_env)
    endpoint = d.endpoint
    try:
        first = _done(_trainer(endpoint, startup_s=1.5, steps=30, first_s=1.0, checkpoint_at=-1))
        time.sleep(2.0)  # the trainer restart: nothing alive
        stop = tmp_path / "stop"  # the second trainer runs until the restarted daemon has seen it step
        second = _trainer(endpoint, startup_s=0.5, steps=1200, first_s=0.06, checkpoint_at=5, stop=str(stop))
        wait_for(lambda: (d.value("dflash_ledger_steps_total", run="run-abc") or 0) > 30 + 10, timeout_s=20,
                 what="the successor's steps past its checkpoint (step 5) in the ledger")
        before = d.value("dflash_ledger_seconds_total", run="run-abc")
        d.stop()
        saved = _role_state(state, "run-abc", "trainer")  # what the stopped daemon had accounted
        time.sleep(1.0)
        d = DaemonProc(tmp_path, *args, interval=1.0, gpu=True, extra_env=gpu_env, endpoint=endpoint)
        after = wait_for(lambda: d.value("dflash_ledger_seconds_total", run="run-abc"), what="the first window")
        up = time.time()  # the restarted daemon's first window had begun
        assert before is not None and after is not None and after >= before  # continued, not restarted
        wait_for(lambda: (d.value("dflash_ledger_steps_total", run="run-abc") or 0) > saved["steps"], timeout_s=30,
                 what="the restarted daemon to see the second trainer step")
        stop.touch()
        second_out = _done(second)
        wait_for(lambda: (d.value("dflash_ledger_open_gap_seconds", run="run-abc") or 0) > 0, timeout_s=20,
                 what="the second trainer to be gone")
        gone = time.time()  # the daemon had read the second trainer's last message
    finally:
        d.stop()
    out = subprocess.run([sys.executable, "-m", "sidecar", "report", "--json", "--run", "run-abc",
                          "--state-dir", str(state)], capture_output=True, text=True,
                         env=env(), timeout=60)
    assert out.returncode == 0, out.stderr
    [r] = json.loads(out.stdout)["runs"]
    s = r["seconds"]
    # What holds by construction, whatever the load (the machine's clock is the trainers' and the
    # daemon's): the parts sum to the wall time, which runs from the first trainer's start (read
    # inside configure()) to the daemon's reading of the second one's last message (after its
    # last publish, before the daemon saw it gone); the restart gap runs from the first one's
    # last message as the ledger placed it to the second one's start.
    assert r["wall_s"] == pytest.approx(sum(s.values()))
    assert r["wall_s"] == pytest.approx(r["last_unix_s"] - r["first_unix_s"], abs=1e-3), (r, s)
    assert first["configuring"] <= r["first_unix_s"] <= first["began"], (r, first)
    assert second_out["publishing"] <= r["last_unix_s"] <= gone, (r, second_out, gone)
    senders = _senders(state, "run-abc", "trainer")
    started, _ = senders[int(second_out["pid"])]
    _, first_seen = senders[int(first["pid"])]
    assert second_out["configuring"] - 1e-3 <= started <= second_out["began"] + 1e-3  # the key's ms
    assert first["publishing"] <= first_seen
    # exact but for the key, which states the start to the ms
    assert s["restart_gap"] == pytest.approx(started - first_seen, abs=1e-3), (s, senders)
    # Startup (and the first process's compile) is held until a window with a step tells it: at
    # least the trainers' sleeps before their first step, at most each one's start to its first
    # step plus its first stepping window's time between steps (a window each: 1 s, 2 s allowed)
    starting = sum(x["first_step"] - x["configuring"] for x in (first, second_out))
    assert 1.5 + 0.5 - 0.1 <= s["startup"] + s["compile"] <= starting + 2 * 2.0, (s, starting)
    assert s["compile"] > 0.3, s  # the first process's 1 s first step among 0.1 s ones
    assert s["checkpoint"] == pytest.approx(0.4, abs=0.05), s  # the trainer's checkpoint_ms says 400 ms
    # the daemon was down: from the last message it had accounted (at least what it had saved
    # before the stop, read before the stop) to its successor's first window (after its start,
    # 1 s after the stop)
    assert 1.0 <= s["unobserved"] <= up - saved["observed_until"], (s, saved, up)
    stepping = sum(s[c] for c in ("productive", "data", "host", "unattributed", "throttled", "compile", "checkpoint",
                                  "warmup", "shutdown"))
    # The GPU's 60 % busy share is productive, less what compile and checkpoint took from it where a
    # window's idle time was too short to hold them (how much depends on where the windows fell),
    # and what the time after the last step (shutdown) took
    taken = s["compile"] + s["checkpoint"] + s["shutdown"]
    assert 0.6 * stepping - taken - 0.1 <= s["productive"] <= 0.6 * stepping + 0.1, s
    assert r["steps"] >= 0.8 * (first["steps"] + second_out["steps"])
    # every token of the first trainer (the daemon was up throughout) and more after the restart;
    # those sent while the daemon was down are lost
    published = 1000 * (first["steps"] + second_out["steps"])
    assert 1000 * first["steps"] <= saved["tokens"] < r["tokens"] <= published, (saved["tokens"], r["tokens"])
    assert sum(r["joules"].values()) / r["wall_s"] == pytest.approx(200.0, rel=0.15)  # a constant 200 W
    # the trainer's statement (its hello) wins over the daemon's --flops-per-token
    assert r["mfu_ratio"] == pytest.approx(2e9 * r["tokens_per_gpu_per_s"] / 989.4e12)
    assert not math.isnan(r["goodput_ratio"]) and r["goodput_ratio"] == pytest.approx(s["productive"] / r["wall_s"])
    table = subprocess.run([sys.executable, "-m", "sidecar", "report", "--state-dir", str(state)],
                           capture_output=True, text=True, env=env(), timeout=60)
    assert table.returncode == 0 and "run run-abc · role trainer" in table.stdout and "restart_gap" in table.stdout
    # the run's timeline (docs/METRICS.md, "Run timeline") survived the daemon restart beside the ledger
    timeline, problem = load_view(state, "run-abc")
    assert problem is None and timeline is not None
    kinds = [e.kind for e in timeline.events]
    assert kinds.count("start") == 2 and kinds.count("daemon") == 1, timeline.events  # two trainers, one restart
    kept = json.loads((state / FILE_NAME).read_text())["verdicts"]["run-abc"]
    assert timeline.verdict_seconds() == pytest.approx({k: e["seconds"] for k, e in kept.items()}, abs=0.01)
    assert {"busy|gpu0", "power|gpu0"} <= set(timeline.keys())  # the fake driver's GPU
    assert all(p["m"]["power|gpu0"] == pytest.approx(200.0) for p in timeline.points if "power|gpu0" in p["m"])


RUN = r"""
import json, os, sys, time
from trainer_shim import telemetry
configuring = time.time()
telemetry.configure(sys.argv[1], "trainer", "0", flush_interval_s=0.05)
began = time.time()
for step in range(1, 21):
    time.sleep(0.05)
    telemetry.timing("step_ms", 50.0)
    publishing = time.time()
    telemetry.publish(step, {"lr": 0.001})
telemetry.flush(1.0)
print(json.dumps({"configuring": configuring, "began": began, "publishing": publishing, "ended": time.time(),
                  "pid": os.getpid()}))
"""


def test_separate_runs_without_wandb_are_separate_ledgers_and_a_restart_is_one(tmp_path: Path) -> None:
    state = tmp_path / "state"
    d = DaemonProc(tmp_path, "--state-dir", str(state), "--run-gap-s", "3", interval=0.5)

    def run(**environ: str) -> dict[str, float]:
        proc = subprocess.run([sys.executable, "-c", RUN, d.endpoint], capture_output=True, text=True,
                              env=env(**environ), timeout=60)
        assert proc.returncode == 0, proc.stderr
        return {**json.loads(proc.stdout.strip().splitlines()[-1]), "exited": time.time()}

    def runs() -> list[dict[str, object]]:
        out = subprocess.run([sys.executable, "-m", "sidecar", "report", "--json", "--state-dir", str(state)],
                             capture_output=True, text=True, env=env(), timeout=60)
        return json.loads(out.stdout)["runs"] if out.returncode == 0 else []

    try:
        first = run()
        time.sleep(1.0)
        restarted = run()  # within --run-gap-s: the same run restarted
        wait_for(lambda: any(r["seconds"]["restart_gap"] > 0 for r in runs()), timeout_s=20,  # type: ignore[index]
                 what="the restart in the ledger")
        time.sleep(3.5)  # longer than --run-gap-s with nothing alive: the next trainer is a new run
        later = run()
        labelled = run(SLURM_JOB_ID="4242", SLURM_STEP_ID="0")  # named by the launcher: its own run
        wait_for(lambda: len(runs()) == 3 and all(r["steps"] > 0 for r in runs()), timeout_s=20,
                 what="three runs in the ledger")
    finally:
        d.stop()
    by_run = {str(r["run"]): r for r in runs()}
    host = [name for name in by_run if name.startswith("host:")]
    assert len(host) == 2 and "slurm:4242.0" in by_run, by_run.keys()
    one, two = sorted(host, key=lambda name: float(by_run[name]["first_unix_s"]))  # type: ignore[arg-type]
    gap = by_run[one]["seconds"]["restart_gap"]  # type: ignore[index]
    # by construction: from the first process's last message as the ledger placed it (when the
    # daemon read it, after its last publish) to the restarted one's start (inside configure())
    senders = _senders(state, one, "trainer")
    started, _ = senders[int(restarted["pid"])]
    _, first_seen = senders[int(first["pid"])]
    assert restarted["configuring"] - 1e-3 <= started <= restarted["began"] + 1e-3 and first["publishing"] <= first_seen
    assert gap == pytest.approx(started - first_seen, abs=1e-3), (gap, senders, first, restarted)  # the key's ms
    assert by_run[two]["seconds"]["restart_gap"] == 0.0  # type: ignore[index]
    assert by_run["slurm:4242.0"]["seconds"]["restart_gap"] == 0.0  # type: ignore[index]
    assert float(by_run[one]["first_unix_s"]) <= first["began"] < restarted["began"] < float(  # type: ignore[arg-type]
        by_run[two]["first_unix_s"]) <= later["began"] < labelled["began"]  # type: ignore[arg-type]


def test_the_ledger_is_shown_in_the_console_line_a_wandb_row_top_and_a_promtool_clean_page(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from sidecar.cli.report import format_table
    from sidecar.cli.top_ledger import ledger_table
    from sidecar.exporters.console import format_ledger
    from sidecar.exporters.prometheus.ledger import ledger_families
    from sidecar.exporters.wandb.ledger_row import ledger_row
    from tests.daemon_harness import require_tool

    led = RunLedger()
    for end in range(101, 105):
        led.add(window(end, (sender("1@100", 100, end, end),)))
    view = led.view()
    assert format_ledger(view) == ["goodput trainer 50% of 4 s (data 30%)"]
    row = ledger_row(view)
    assert row["ledger/trainer/seconds/data"] == pytest.approx(1.2) and row["ledger/trainer/wall_s"] == 4.0
    assert row["ledger/trainer/goodput_ratio"] == 0.5 and "ledger/trainer/mfu_ratio" not in row  # no FLOPs stated

    class Source:
        def collect(self):  # type: ignore[no-untyped-def]
            return ledger_families(view, "box")

    registry = CollectorRegistry()
    registry.register(Source())  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    page = tmp_path / "page.txt"
    page.write_text(text)
    lint = subprocess.run([require_tool("promtool"), "check", "metrics"], stdin=page.open(), capture_output=True,
                          text=True, timeout=60)
    assert lint.returncode == 0 and not (lint.stdout + lint.stderr).strip(), lint
    samples = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples
               if s.labels.get("cause") in (None, "productive")}
    assert samples["dflash_ledger_seconds_total"].value == pytest.approx(2.0)
    table = ledger_table({name: [(dict(s.labels), s.value) for f in text_string_to_metric_families(text)
                                 for s in f.samples if s.name == name] for name in ("dflash_ledger_seconds_total",)})
    assert table is not None and table.row_count == 1
    assert "productive" in format_table(view) and "goodput 50.0%" in format_table(view)
