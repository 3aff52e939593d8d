"""The shim's side of a capture on request, in this process: a real channel's ``publish`` is the
step boundary, the real ``torch.profiler`` runs, the request and result files are real files.
What the trainer may never see: an exception. What the requester must always get: an answer."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer_shim import capture
from trainer_shim.channel import Channel


@pytest.fixture
def shim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Channel]]:
    capture._after_fork_in_child()  # a fresh capture state, as a new process has
    monkeypatch.setenv(capture.MIN_GAP_ENV, "0")
    yield tmp_path, Channel("trainer", "0", 1000, [])
    capture._after_fork_in_child()


def ask(directory: Path, steps: int = 2, **extra: Any) -> str:
    rid = extra.pop("id", f"r{time.monotonic_ns()}")
    body = {"id": rid, "steps": steps, "deadline_unix_s": time.time() + 30, **extra}
    path = directory / (capture.stem(os.getpid(), capture._own_ticks()) + capture.REQUEST_SUFFIX)
    path.unlink(missing_ok=True)
    path.write_text(json.dumps(body))
    return rid


def answer(directory: Path) -> dict[str, Any]:
    capture._state["next_poll"] = 0.0
    capture.poll(str(directory), time.monotonic(), "run-7")
    path = directory / (capture.stem(os.getpid(), capture._own_ticks()) + capture.RESULT_SUFFIX)
    return dict(json.loads(path.read_text()))


def steps(ch: Channel, n: int) -> None:
    x = torch.randn(8, 8)
    for i in range(n):
        (x @ x).sum()
        ch.publish(100 + i, {"step_ms": 1.0})


def test_a_request_arms_the_flag_and_n_publishes_capture_n_steps(shim: tuple[Path, Channel]) -> None:
    directory, ch = shim
    assert capture.armed is False
    ask(directory, steps=3)
    assert answer(directory)["status"] == "accepted" and capture.armed is True
    steps(ch, 4)  # the first starts the profiler, the next three are the captured steps
    assert capture.armed is False
    deadline = time.monotonic() + 30
    while (got := answer(directory))["status"] != "done" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert got["status"] == "done" and got["steps"] == [101, 102, 103] and got["run"] == "run-7"
    assert got["trace"].endswith(capture.TRACE_SUFFIX) and os.path.getsize(got["trace"]) > 0
    capture.remove_own_files(str(directory))
    assert not os.path.exists(got["trace"])


def test_refusals_each_say_why(shim: tuple[Path, Channel], monkeypatch: pytest.MonkeyPatch) -> None:
    directory, ch = shim
    ask(directory, steps=99)
    assert answer(directory)["status"] == "bad_request"
    (directory / (capture.stem(os.getpid(), capture._own_ticks()) + capture.REQUEST_SUFFIX)).write_text("{")
    assert answer(directory)["status"] == "bad_request"
    monkeypatch.setenv(capture.ENABLE_ENV, "0")
    ask(directory)
    assert answer(directory)["status"] == "disabled" and capture.armed is False
    monkeypatch.delenv(capture.ENABLE_ENV)
    ask(directory)
    assert answer(directory)["status"] == "accepted"
    ask(directory)
    assert answer(directory)["status"] == "busy"
    capture._state.update(capture=None, last_end=time.monotonic())
    capture.armed = False
    monkeypatch.setenv(capture.MIN_GAP_ENV, "60")
    ask(directory)
    got = answer(directory)
    assert got["status"] == "too_soon" and "DFLASH_TRACE_MIN_GAP_S=60" in got["detail"]


def test_a_request_whose_steps_never_come_expires(shim: tuple[Path, Channel]) -> None:
    directory, _ = shim
    ask(directory, deadline_unix_s=time.time() - 1)
    assert answer(directory)["status"] == "accepted"
    got = answer(directory)
    assert got["status"] == "expired" and "no step boundary came" in got["detail"] and capture.armed is False


def test_the_trainers_own_profiler_is_never_disturbed(shim: tuple[Path, Channel]) -> None:
    directory, ch = shim
    with torch.profiler.profile():  # running when the request comes: refused
        ask(directory)
        got = answer(directory)
        assert got["status"] == "busy" and "own torch.profiler" in got["detail"]
    ask(directory)
    assert answer(directory)["status"] == "accepted"
    with torch.profiler.profile() as own:  # started after the request was accepted: the capture fails
        steps(ch, 3)  # must not raise
        torch.randn(4, 4).sum()
    assert capture.armed is False
    got = answer(directory)
    assert got["status"] == "failed" and got["failures"] == 1 and "own torch.profiler" in got["detail"]
    assert any(e.name == "aten::sum" for e in own.events())  # the trainer's profile is whole


def test_a_loop_with_both_boundaries_counts_each_step_once(shim: tuple[Path, Channel]) -> None:
    import gzip

    from trainer_shim.integrations.loader import timed

    directory, ch = shim
    ask(directory, steps=3)
    assert answer(directory)["status"] == "accepted"
    x = torch.randn(8, 8)
    for i, _ in enumerate(timed(range(8), channel=ch)):  # the loader's boundary comes first in each step
        (x @ x).sum()
        ch.publish(i, {"step_ms": 1.0})
    deadline = time.monotonic() + 30
    while (got := answer(directory))["status"] != "done" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert got["status"] == "done" and got["steps"] == [2, 3, 4]  # the loader's batch counts
    events = json.load(gzip.open(got["trace"]))["traceEvents"]
    assert sorted(e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")
                  and e.get("cat") == "user_annotation") == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
