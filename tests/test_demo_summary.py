"""``dflash-sidecar demo`` as a new user meets it: a progress line from the first second, a summary
at the end with the commands to try next, and ``report`` finding the demo's ledger (real daemon,
real shim threads, real sockets)."""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sidecar.cli.demo_report import Progress
from tests.daemon_harness import env, free_port


def _demo(tmp_path: Path, *args: str, **environ: str) -> tuple[subprocess.CompletedProcess[str], str]:
    addr = f"127.0.0.1:{free_port()}"
    out = subprocess.run([sys.executable, "-m", "sidecar", "demo", "--duration", "7", "--no-gpu-metrics",
                          "--interval", "5", "--endpoint", f"ipc://{tmp_path}/demo.sock", "--prometheus-addr", addr,
                          *args], capture_output=True, text=True, env=env(**environ), timeout=120)
    assert out.returncode == 0, out.stderr
    return out, addr


def _report(*args: str, **environ: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sidecar", "report", *args], capture_output=True, text=True,
                          env=env(**environ), timeout=60)


def test_the_demo_shows_progress_before_its_first_window_and_ends_with_a_summary(tmp_path: Path) -> None:
    state = tmp_path / "mine"
    out, addr = _demo(tmp_path, "--state-dir", str(state))
    lines = out.stderr.splitlines()
    progress = [i for i, line in enumerate(lines) if line.startswith("demo ") and " of 7 s · " in line]
    windows = [i for i, line in enumerate(lines) if " INFO sidecar: window " in line]
    # progress before the first window (at 1 s; the window closes at 5 s)
    assert progress and windows and progress[0] < windows[0], out.stderr
    summary = out.stdout
    assert "demo summary" in summary and "verdict: " in summary and "role drafter: wall " in summary, summary
    for command in (f"curl -s http://{addr}/metrics", f"dflash-sidecar top --prometheus-addr {addr}",
                    f"dflash-sidecar report --state-dir {state}"):
        assert command in summary, summary
    report = _report("--json", "--state-dir", str(state))  # the folder given is the demo's own
    assert report.returncode == 0, report.stderr
    assert {r["role"] for r in json.loads(report.stdout)["runs"]} >= {"drafter", "target"}


def test_the_demos_default_folder_is_apart_and_report_points_at_it(tmp_path: Path) -> None:
    xdg = str(tmp_path / "xdg")
    out, _ = _demo(tmp_path, XDG_STATE_HOME=xdg)
    demo_dir = Path(xdg) / "dflash-sidecar" / "demo"
    assert f"dflash-sidecar report --state-dir {demo_dir}" in out.stdout, out.stdout
    missing = _report(XDG_STATE_HOME=xdg)  # real runs' folder: no ledger there, but the demo's is named
    assert missing.returncode == 1
    assert f"the demo's ledger is in {demo_dir}: dflash-sidecar report --state-dir {demo_dir}" in missing.stderr
    assert _report("--state-dir", str(demo_dir)).returncode == 0


def test_without_a_duration_the_progress_line_says_how_to_stop() -> None:
    line = Progress(lambda: None, lambda: 12, interval_s=10.0, duration_s=None, out=io.StringIO()).line()
    assert line.startswith("demo 0 s (Ctrl-C to stop) · 12 steps · verdict: first at the window's end, in 10 s")
    assert " of 30 s " in Progress(lambda: None, lambda: 0, 10.0, 30.0, out=io.StringIO()).line()


@pytest.mark.parametrize("style", ["channels", "generic"])
def test_every_role_of_the_demo_has_time_in_the_ledger(tmp_path: Path, style: str) -> None:
    # the target role and the plain loop's occurrence form never call publish(step): their steps are
    # told from their timings and batches counters, and the demo has no sender that sends nothing
    state = tmp_path / "state"
    _demo(tmp_path, "--style", style, "--state-dir", str(state))
    runs = json.loads(_report("--json", "--state-dir", str(state)).stdout)["runs"]
    assert runs and all(r["wall_s"] > 0 for r in runs), [(r["role"], r["wall_s"]) for r in runs]


def test_a_second_demo_in_the_same_folder_sums_up_its_own_run_only(tmp_path: Path) -> None:
    """The folder keeps every demo's runs (``report`` lists them all); the summary at the end of a
    demo speaks of the runs that demo fed, not of the earlier demos' too."""
    state = tmp_path / "mine"
    gap = ("--run-gap-s", "1")
    first, _ = _demo(tmp_path, "--state-dir", str(state), *gap)
    # the second demo starts well past the run gap after the first one's last message, so it is a
    # run of its own (started at once, it can come within a second: ``--run-gap-s``'s own case)
    time.sleep(2.0)
    second, _ = _demo(tmp_path, "--state-dir", str(state), *gap)
    runs = [line for line in second.stdout.splitlines() if line.startswith("run ")]
    assert len(runs) == 1, second.stdout
    assert [line for line in first.stdout.splitlines() if line.startswith("run ")] != runs, (first.stdout, runs)
    listed = {r["run"] for r in json.loads(_report("--json", "--state-dir", str(state)).stdout)["runs"]}
    assert len(listed) == 2, listed
    # the report command the second summary gives, run as printed, shows that demo's run alone
    given = next(line for line in second.stdout.splitlines() if "dflash-sidecar report " in line)
    command = shlex.split(given.split("#")[0])
    assert command[:2] == ["dflash-sidecar", "report"] and "--run" in command, given
    shown = {r["run"] for r in json.loads(_report(*command[2:], "--json").stdout)["runs"]}
    assert len(shown) == 1 and shown < listed and runs[0].startswith(f"run {next(iter(shown))}: "), (shown, runs)
