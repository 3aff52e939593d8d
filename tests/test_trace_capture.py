"""``dflash-sidecar trace`` against real trainers under a real daemon: real torch CPU loops (with a
DataLoader's worker processes), a compiled step, the HF and Lightning callbacks, two trainers on
one daemon, a trainer without torch, no trainer. Each asks from another process, as a user would,
and reads the Chrome trace the capture kept."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import wandb_records
from tests.daemon_harness import DaemonProc, env, require_tool
from tests.deploy_support import exposition_families, load_metric_names
from tests.waiting import wait_until


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProc]:
    d = DaemonProc(tmp_path)
    yield d
    d.stop()


class Loop:
    """A training loop of ``tests.capture_loops`` in a child process."""

    def __init__(self, tmp: Path, kind: str, endpoint: str, role: str, **extra_env: str) -> None:
        self.progress = tmp / f"progress-{role}.json"
        self.log = tmp / f"loop-{role}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.capture_loops", kind, str(self.progress)],
            env=env(DFLASH_SIDECAR_ENDPOINT=endpoint, DFLASH_ROLE=role, DFLASH_TRACE_MIN_GAP_S="0", **extra_env),
            stdout=self.log.open("w"), stderr=subprocess.STDOUT)

    def state(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.progress.read_text()))
        except (OSError, ValueError):
            return {"steps": 0}

    def steps(self) -> int:
        return int(self.state()["steps"])

    def wait_steps(self, n: int, timeout_s: float = 120.0) -> None:
        wait_until(lambda: self.proc.poll() is None and self.steps() >= n or self.proc.poll() is not None,
                   timeout_s=timeout_s)
        assert self.proc.poll() is None, self.log.read_text()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def trace(d: DaemonProc, state: Path, *args: str, timeout_s: float = 180.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sidecar", "trace", "--endpoint", d.endpoint, "--state-dir",
                           str(state), "--wait", "60", *args], env=env(), capture_output=True, text=True,
                          timeout=timeout_s)


def kept_trace(state: Path) -> dict[str, Any]:
    (trace_file,) = sorted((state / "traces").glob("*.trace.json.gz"))
    return dict(json.load(gzip.open(trace_file)))


def profiler_steps(trace_json: dict[str, Any]) -> list[str]:
    return [e["name"] for e in trace_json["traceEvents"] if e.get("cat") == "user_annotation"
            and str(e.get("name", "")).startswith("ProfilerStep#")]


def asked_and_kept(d: DaemonProc, tmp: Path, loop: Loop, steps: int = 4, *args: str) -> str:
    """Ask ``loop`` for ``steps`` steps; the trace's ProfilerStep spans are checked, the loop
    must go on stepping afterwards. Returns the command's output."""
    loop.wait_steps(3)
    state = tmp / "state"
    t0 = time.monotonic()
    out = trace(d, state, "--steps", str(steps), *args)
    assert out.returncode == 0, out.stderr + loop.log.read_text()
    assert time.monotonic() - t0 < 60
    assert profiler_steps(kept_trace(state)) == [f"ProfilerStep#{i}" for i in range(steps)]
    assert out.stdout.count("ProfilerStep#") == steps and "no GPU activity in the trace" in out.stdout
    after = loop.steps()
    loop.wait_steps(after + 5)
    return out.stdout


def test_a_cpu_loop_with_dataloader_workers_gives_four_steps_and_keeps_stepping(daemon: DaemonProc,
                                                                                 tmp_path: Path) -> None:
    loop = Loop(tmp_path, "plain", daemon.endpoint, "trainer")
    try:
        out = asked_and_kept(daemon, tmp_path, loop)
        assert "top host ops (self time): " in out and "aten::" in out
        # The capture's record: its trainer steps and who it was.
        meta = json.loads(next((tmp_path / "state" / "traces").glob("*.capture.json")).read_text())["meta"]
        assert meta["role"] == "trainer" and len(meta["steps"]) == 4 and meta["cuda"] is False
        # explain shows it beside the verdict, report lists it under its run.
        state = str(tmp_path / "state")
        explained = subprocess.run([sys.executable, "-m", "sidecar", "explain", "--prometheus-addr",
                                    f"127.0.0.1:{daemon.port}", "--state-dir", state], env=env(),
                                   capture_output=True, text=True, timeout=60)
        assert explained.stdout.startswith("verdict: ") and "last capture (dflash-sidecar trace):" in explained.stdout
        assert "ProfilerStep#3" in explained.stdout
        reported = subprocess.run([sys.executable, "-m", "sidecar", "report", "--state-dir", state], env=env(),
                                  capture_output=True, text=True, timeout=60)
        assert "captures (dflash-sidecar trace):" in reported.stdout and "trainer/MainThread 4 steps" in reported.stdout
        # Prometheus: the last capture's figures, host side only (no GPU here), a page promtool accepts.
        wait_until(lambda: daemon.value("dflash_capture_step_seconds", role="trainer") is not None, timeout_s=30)
        assert 0 < (daemon.value("dflash_capture_host_ops_ratio", role="trainer") or 0) <= 1
        assert daemon.value("dflash_capture_gpu_busy_ratio") is None
        promtool = require_tool("promtool")
        lint = subprocess.run([promtool, "check", "metrics"], input=daemon.text(), capture_output=True, text=True)
        assert lint.returncode == 0 and not (lint.stdout + lint.stderr).strip(), lint.stdout + lint.stderr
        listed = {n: kind for n, (kind, source) in load_metric_names().items() if source == "capture"}
        scraped = {n: k for n, k in exposition_families(daemon.text()).items() if n.startswith("dflash_capture_")}
        assert scraped and all(listed.get(n) == k for n, k in scraped.items()), (scraped, listed)
    finally:
        loop.stop()


def test_a_compiled_step_is_captured_without_graph_break(daemon: DaemonProc, tmp_path: Path) -> None:
    loop = Loop(tmp_path, "compiled", daemon.endpoint, "trainer")
    try:
        asked_and_kept(daemon, tmp_path, loop)
        state = loop.state()
        assert state["graph_breaks"] == 0 and state["recompiles"] == 0, state
    finally:
        loop.stop()


@pytest.mark.parametrize("kind", ["hf", "lightning", "loader"])
def test_framework_callbacks_are_step_boundaries(kind: str, daemon: DaemonProc, tmp_path: Path) -> None:
    """The HF and Lightning callbacks' step end, and a ``timed`` loader's batches (no publish)."""
    loop = Loop(tmp_path, kind, daemon.endpoint, "trainer")
    try:
        asked_and_kept(daemon, tmp_path, loop, 3)
    finally:
        loop.stop()


def test_two_trainers_role_picks_one(daemon: DaemonProc, tmp_path: Path) -> None:
    a = Loop(tmp_path, "plain", daemon.endpoint, "target")
    b = Loop(tmp_path, "notorch", daemon.endpoint, "drafter")
    try:
        b.wait_steps(3)
        out = asked_and_kept(daemon, tmp_path, a, 2, "--role", "target")
        assert "capture of target/" in out
    finally:
        a.stop()
        b.stop()


def test_a_trainer_without_torch_gets_a_clear_answer(daemon: DaemonProc, tmp_path: Path) -> None:
    loop = Loop(tmp_path, "notorch", daemon.endpoint, "trainer")
    try:
        loop.wait_steps(3)
        out = trace(daemon, tmp_path / "state")
        assert out.returncode == 1
        assert "a trainer without torch: this process never imported torch" in out.stderr
        assert not (tmp_path / "state" / "traces").exists()
    finally:
        loop.stop()


def test_no_trainer_and_no_daemon(daemon: DaemonProc, tmp_path: Path) -> None:
    out = trace(daemon, tmp_path / "state")
    assert out.returncode == 1 and "no live trainer" in out.stderr
    gone = subprocess.run([sys.executable, "-m", "sidecar", "trace", "--endpoint", f"ipc://{tmp_path}/none.sock"],
                          env=env(), capture_output=True, text=True, timeout=60)
    assert gone.returncode == 1 and "no live trainer" in gone.stderr and "is the daemon running?" in gone.stderr


def test_a_capture_already_running_and_steps_that_never_come(daemon: DaemonProc, tmp_path: Path) -> None:
    loop = Loop(tmp_path, "silent", daemon.endpoint, "trainer")
    try:
        loop.wait_steps(3)
        first = subprocess.Popen([sys.executable, "-m", "sidecar", "trace", "--endpoint", daemon.endpoint,
                                  "--state-dir", str(tmp_path / "state"), "--wait", "8"], env=env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        directory = Path(daemon.endpoint.removeprefix("ipc://") + ".tallies")
        wait_until(lambda: any(directory.glob("*.trace-request")), timeout_s=30)
        second = trace(daemon, tmp_path / "state")
        assert second.returncode == 1 and "a capture already running" in second.stderr, second.stderr
        _, err = first.communicate(timeout=120)
        assert first.returncode == 1 and "the steps never came" in err, err
        assert not any(directory.glob("*.trace-request"))  # the requester removed its request
        loop.wait_steps(loop.steps() + 5)  # and the trainer went on
    finally:
        loop.stop()


def test_an_automatic_capture_when_the_step_time_moves_reaches_wandb(tmp_path: Path) -> None:
    wandb_dir = tmp_path / "wandb"
    wandb_dir.mkdir()
    d = DaemonProc(tmp_path, "--capture-on-step-change", "0.5", "--wandb-run", "capture-run",
                   extra_env={"WANDB_MODE": "offline", "WANDB_DIR": str(wandb_dir), "WANDB_SILENT": "true"})
    loop = Loop(tmp_path, "slowdown", d.endpoint, "trainer")
    try:
        kept = tmp_path / "state" / "traces"
        wait_until(lambda: any(kept.glob("*.capture.json")), timeout_s=90)
        meta = json.loads(next(kept.glob("*.capture.json")).read_text())["meta"]
        assert meta["why"].startswith("automatic: the trainer step time moved from "), meta
        assert "sidecar: automatic capture: the trainer step time moved" in d.log()
        logged = (d.value("dflash_sidecar_wandb_rows_logged_total") or 0) + 2
        wait_until(lambda: (d.value("dflash_sidecar_wandb_rows_logged_total") or 0) >= logged, timeout_s=60)
    finally:
        loop.stop()
        d.stop()
    (run_file,) = wandb_dir.rglob("*.wandb")
    rows = wandb_records.history_rows(run_file)
    key = f"sidecar/{socket.gethostname()}/capture/trainer/MainThread/step_s"
    (row,) = [r for r in rows if key in r]
    assert row[key] > 0 and 0 < row[key.replace("step_s", "host_ops_ratio")] <= 1


def test_a_result_that_names_another_file_is_refused(tmp_path: Path) -> None:
    """A "done" result whose trace is not the shim's own file for that request (a forged one names
    a file the requester could move) keeps nothing and says so."""
    from sidecar.core.capture_request import TraceError, Trainer, collect
    from trainer_shim import capture
    from trainer_shim.tally import process_start_ticks

    me = Trainer(os.getpid(), process_start_ticks(os.getpid()) or 0, str(tmp_path), (("trainer", "0"),))
    victim = tmp_path / "precious.json"
    victim.write_text("{}")
    (tmp_path / (me.stem + capture.RESULT_SUFFIX)).write_text(json.dumps(
        {"id": "abc123", "status": "done", "trace": str(victim)}))
    with pytest.raises(TraceError, match="names no trace of the trainer's own"):
        collect(me, "abc123", 5.0, tmp_path / "state")
    assert victim.read_text() == "{}" and not (tmp_path / "state").exists()
