"""``dflash-sidecar demo`` as a new user meets it: a progress line from the first second, a summary
at the end with the commands to try next, and ``report`` finding the demo's ledger (real daemon,
real shim threads, real sockets)."""

from __future__ import annotations

import io
import json
import re
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
    _assert_nothing_lost_or_told_why(summary)
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
    """Two demos a few seconds apart, at the default run gap (300 s), are two runs: each demo names
    its own (issue 45: they were one, the second's summary telling "wall 42.6 s" for a 12 s demo,
    its largest badput a restart gap). The folder keeps every demo's runs (``report`` lists them
    all); the summary at the end of a demo speaks of its own run, with its own wall time."""
    state = tmp_path / "mine"
    first, _ = _demo(tmp_path, "--state-dir", str(state))
    time.sleep(3.0)
    second, _ = _demo(tmp_path, "--state-dir", str(state))
    runs = [line for line in second.stdout.splitlines() if line.startswith("run ")]
    assert len(runs) == 1 and runs[0].startswith("run demo-"), second.stdout
    for out in (first, second):
        walls = [float(w) for w in re.findall(r"role \w+: wall ([0-9.]+) s", out.stdout)]
        assert walls and all(w <= 7.0 + 1.5 for w in walls), out.stdout  # a 7 s demo: its own time only
        assert "restart_gap" not in out.stdout, out.stdout
    assert [line for line in first.stdout.splitlines() if line.startswith("run ")] != runs, (first.stdout, runs)
    listed = {r["run"] for r in json.loads(_report("--json", "--state-dir", str(state)).stdout)["runs"]}
    assert len(listed) == 2, listed
    # the report command the second summary gives, run as printed, shows that demo's run alone
    given = next(line for line in second.stdout.splitlines() if "dflash-sidecar report " in line)
    command = shlex.split(given.split("#")[0])
    assert command[:2] == ["dflash-sidecar", "report"] and "--run" in command, given
    shown = {r["run"] for r in json.loads(_report(*command[2:], "--json").stdout)["runs"]}
    assert len(shown) == 1 and shown < listed and runs[0].startswith(f"run {next(iter(shown))}: "), (shown, runs)


def _assert_nothing_lost_or_told_why(summary: str) -> None:
    """A clean demo stop drops nothing, or its summary says what and why (issue 45: "16 dropped" in
    the last window read as the sidecar losing data on a clean stop)."""
    (line,) = [line for line in summary.splitlines() if line.startswith("records: ")]
    if not line.endswith(" accepted, none dropped"):
        reasons = re.findall(r"(\w+) [0-9,]+(?: \(([^)]*)\))?", line.split(" dropped: ", 1)[1])
        assert reasons and all(why for _, why in reasons), line


def test_a_final_window_too_short_to_rate_shows_counts_not_rates() -> None:
    """The last window of a daemon stopped just after a boundary (0.01 s): the log line gives its
    records and no rate (issue 45: "drafter 1304.4 b/s, 19,077 rec/s" against ~40 b/s and ~630
    rec/s all run); a window of a second or more keeps its rates, and so do the windows of a
    daemon run at a sub-second interval (each as long as the one before it)."""
    from dataclasses import replace

    from sidecar.aggregation.insight import compute_insight
    from sidecar.exporters.console import ConsoleExporter
    from tests.insight_synth import pipeline

    for duration_s, rated in ((0.01, False), (1.0, True)):
        rep = pipeline({"data_wait": 4, "forward": 30, "queue_put_wait": 30}, {"queue_wait": 1, "forward": 60},
                       queue_fill=1.0)
        rep = replace(rep, insight=compute_insight(rep.window))
        rep = replace(rep, window=replace(rep.window, duration_s=duration_s), records_accepted_in_window=20)
        console = ConsoleExporter()
        console.line(replace(rep, window=replace(rep.window, duration_s=10.0)))  # the run's windows before it
        line = console.line(rep)
        assert ("rec/s" in line and "b/s" in line) == rated, line
        assert ("| 20 records (too short for rates) |" in line) == (not rated), line
        assert line.startswith(f"window {duration_s:.1f}s | "), line  # the line's head as log readers parse it
    short = ConsoleExporter()
    for _ in range(3):  # --interval 0.5: every window half a second, none a partial one after the first
        line = short.line(replace(rep, window=replace(rep.window, duration_s=0.5)))
    assert "rec/s" in line and "too short" not in line, line
