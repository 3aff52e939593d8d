"""A run's verdicts are kept in the run ledger: after the run ended (and across daemon restarts)
``report`` and ``explain --run`` still say why it was slow.

The unit tests fold hand-built windows whose verdicts are known; the end-to-end test runs the real
daemon with a real shim process whose loop waits on data most of each step, restarts the daemon
while it runs, and reads the verdict back after the trainer and the daemon are gone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.aggregation.ledger.facts import RoleFact, SenderFact, WindowFacts
from sidecar.aggregation.ledger.fold import RunLedger
from sidecar.cli.report import format_table, ledger_json
from sidecar.core.ledger_state import FILE_NAME, load, save
from sidecar.model.insight import Verdict
from sidecar.model.ledger import CAUSES
from tests.daemon_harness import DaemonProc, env, wait_for

SHARES = dict.fromkeys(CAUSES, 0.0) | {"productive": 0.4, "data": 0.6}


def window(end: float, verdict: Verdict | None, sending: bool = True, run: str = "run-1") -> WindowFacts:
    s = SenderFact("1@100", run, "trainer", 100.0, max(100.0, end - 1.0), end, int(end), sending)
    return WindowFacts(end, 1.0, (s,), {"trainer": RoleFact(SHARES)}, verdict=verdict)


def fed(*windows: WindowFacts, state: dict[str, object] | None = None) -> RunLedger:
    led = RunLedger(state)
    for w in windows:
        led.add(w)
    return led


INPUT = [Verdict("input-bound", (("trainer.data_wait", x),)) for x in (0.5, 0.7, 0.9)]


def test_each_verdict_keeps_its_share_of_the_runs_time_and_windows_and_the_dominant_its_evidence() -> None:
    led = fed(window(101, INPUT[0]), window(102, INPUT[1]), window(103, Verdict("balanced")),
              window(104, INPUT[2]), window(105, Verdict("idle")), window(106, Verdict("unknown")))
    [kept] = led.view().verdicts
    assert kept.run == "run-1" and [v.name for v in kept.verdicts] == ["input-bound", "balanced", "unknown"]
    top = kept.dominant
    assert top is not None and top.name == "input-bound" and top.windows == 3
    assert top.seconds == pytest.approx(3.0) and kept.seconds == pytest.approx(5.0)  # idle is no run verdict
    assert kept.time_share(top) == pytest.approx(0.6) and kept.window_share(top) == pytest.approx(0.6)
    assert dict(top.evidence)["trainer.data_wait"] == pytest.approx(0.7)  # the mean over its seconds


def test_a_window_without_a_live_sender_or_an_insight_gives_the_run_no_verdict() -> None:
    led = fed(window(101, INPUT[0]), window(102, INPUT[1], sending=False), window(103, None))
    [kept] = led.view().verdicts
    assert [(v.name, v.windows) for v in kept.verdicts] == [("input-bound", 1)]


def test_unknown_is_dominant_only_when_nothing_else_was_said() -> None:
    led = fed(*(window(100 + i, Verdict("unknown")) for i in range(1, 5)), window(105, INPUT[0]))
    [kept] = led.view().verdicts
    assert kept.dominant is not None and kept.dominant.name == "input-bound"
    assert fed(window(101, Verdict("unknown"))).view().verdicts[0].dominant.name == "unknown"  # type: ignore[union-attr]


def test_verdicts_are_kept_across_a_restart_and_an_old_or_bad_state_loses_nothing_else(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    save(path, fed(window(101, INPUT[0]), window(102, INPUT[1])).state())
    state, problem = load(path)
    assert problem is None and state is not None
    led = fed(window(103, INPUT[2]), state=state)  # the restarted daemon continues the run
    [kept] = led.view().verdicts
    assert kept.verdicts[0].windows == 3 and dict(kept.verdicts[0].evidence)["trainer.data_wait"] == pytest.approx(0.7)
    old = dict(led.state())
    del old["verdicts"]  # a state file written before verdicts were kept
    assert RunLedger(old).view().verdicts == () and RunLedger(old).view().roles == led.view().roles
    bad = dict(led.state()) | {"verdicts": {"run-1": {"input-bound": {"seconds": "x"}, "balanced": {
        "seconds": 1.0, "windows": 1, "evidence": {}, "detail": ""}}, "gone-run": {}}}
    [kept] = RunLedger(bad).view().verdicts  # the malformed entry alone is dropped
    assert [v.name for v in kept.verdicts] == ["balanced"] and RunLedger(bad).view().roles == led.view().roles


def test_report_prints_the_verdict_and_its_json_has_it(tmp_path: Path) -> None:
    view = fed(window(101, INPUT[0]), window(102, Verdict("balanced")), window(103, INPUT[1])).view()
    table = format_table(view)
    assert "run run-1 · verdict: input-bound 67% of the time, 2 of 3 windows (trainer.data_wait=0.60)" in table
    assert "also: balanced 33%" in table
    [v] = ledger_json(view)["verdicts"]
    assert v["run"] == "run-1" and v["dominant"] == "input-bound" and v["evidence"] == {"trainer.data_wait": 0.6}
    assert [(x["verdict"], x["windows"]) for x in v["verdicts"]] == [("input-bound", 2), ("balanced", 1)]
    assert v["verdicts"][0]["time_share"] == pytest.approx(2 / 3)


LOOP = r"""
import os, sys, time
from trainer_shim import telemetry
telemetry.configure(sys.argv[1], "trainer", "0", flush_interval_s=0.05, run_label="slow-input")
step = 0
deadline = time.monotonic() + 120
while time.monotonic() < deadline and not os.path.exists(sys.argv[2]):  # runs until the test says stop
    t = time.perf_counter()
    time.sleep(0.1)  # data waits dominate by far, so that a loaded box's late wake-ups cannot turn it
    telemetry.timing("data_time_ms", (time.perf_counter() - t) * 1000)
    f = time.perf_counter()
    time.sleep(0.005)
    telemetry.timing("forward_ms", (time.perf_counter() - f) * 1000)
    b = time.perf_counter()
    time.sleep(0.005)
    telemetry.timing("backward_ms", (time.perf_counter() - b) * 1000)
    telemetry.timing("step_ms", (time.perf_counter() - t) * 1000)
    step += 1
    telemetry.publish(step, {})
telemetry.flush(1.0)
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sidecar", *args], capture_output=True, text=True, env=env(),
                          timeout=60)


def test_after_the_run_and_the_daemon_are_gone_report_and_explain_say_why_it_was_slow(tmp_path: Path) -> None:
    state = tmp_path / "state"
    args = ("--no-gpu-metrics", "--state-dir", str(state))
    d = DaemonProc(tmp_path, *args, interval=1.0)
    endpoint = d.endpoint
    stop = tmp_path / "stop"
    trainer = subprocess.Popen([sys.executable, "-c", LOOP, endpoint, str(stop)], env=env())
    try:
        wait_for(lambda: d.value("dflash_pipeline_bottleneck", verdict="input-bound") == 1, timeout_s=20,
                 what="an input-bound window")
        d.stop()  # a daemon restart while the trainer runs
        [before] = json.loads(_cli("report", "--json", "--state-dir", str(state)).stdout)["verdicts"]
        d = DaemonProc(tmp_path, *args, interval=1.0, endpoint=endpoint)
        wait_for(lambda: d.value("dflash_pipeline_bottleneck", verdict="input-bound") == 1, timeout_s=20,
                 what="an input-bound window after the restart")
        stop.touch()
        assert trainer.wait(timeout=60) == 0
        wait_for(lambda: d.value("dflash_pipeline_bottleneck", verdict="idle") == 1, timeout_s=20,
                 what="the daemon to see the trainer gone")
    finally:
        trainer.kill()
        d.stop()
    out = _cli("report", "--json", "--run", "slow-input", "--state-dir", str(state))
    assert out.returncode == 0, out.stderr
    [v] = json.loads(out.stdout)["verdicts"]
    assert v["dominant"] == "input-bound", v
    assert v["evidence"]["trainer.data_wait"] > 0.4, v
    by_name = {x["verdict"]: x for x in v["verdicts"]}
    # continued across the restart: the windows before it, and more
    assert by_name["input-bound"]["windows"] > before["verdicts"][0]["windows"] >= 1, (before, v)
    assert "verdict: input-bound" in _cli("report", "--state-dir", str(state)).stdout
    explained = _cli("explain", "--run", "slow-input", "--state-dir", str(state))
    assert explained.returncode == 0, explained.stderr
    assert "verdict: input-bound" in explained.stdout and "trainer.data_wait=" in explained.stdout
    missing = _cli("explain", "--run", "no-such-run", "--state-dir", str(state))
    assert missing.returncode == 1 and "no run 'no-such-run'" in missing.stderr and "slow-input" in missing.stderr
