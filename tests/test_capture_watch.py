"""When the daemon takes an automatic capture (``sidecar.core.capture_watch``): the triggers, the
verdicts that never trigger, the period, and that each is told why. The insight is built here
(the window's verdict and a role's batch rate are all it reads); the capture itself runs against
a tally directory with no trainer in it, so it is logged as not taken."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from sidecar.core.capture_watch import CaptureSettings, CaptureWatch
from sidecar.model.insight import PipelineInsight, RoleInsight, Verdict


def insight(verdict: str, batches_per_s: float = 10.0) -> PipelineInsight:
    role = RoleInsight("trainer", 1, batches_per_s, 0.0, None, {})
    return PipelineInsight(0.0, 1.0, {"trainer": role}, (), None, None, None, None, None, None, None, {},
                           Verdict(verdict))


def watch(tmp_path: Path, **settings: object) -> CaptureWatch:
    (tmp_path / "sock.tallies").mkdir(exist_ok=True)
    return CaptureWatch(tmp_path / "state", (f"ipc://{tmp_path}/sock",), replace(CaptureSettings(), **settings), "h")


def test_nothing_is_taken_by_default(tmp_path: Path) -> None:
    w = watch(tmp_path)
    for verdict, rate in (("input-bound", 10.0), ("compute-bound", 10.0), ("compute-bound", 1.0)):
        assert w._why(insight(verdict, rate)) is None


def test_a_verdict_change_triggers_once_per_period_and_never_to_or_from_idle(tmp_path: Path,
                                                                            caplog: pytest.LogCaptureFixture) -> None:
    w = watch(tmp_path, capture_on_verdict_change=True)
    assert w._why(insight("idle")) is None
    assert w._why(insight("input-bound")) is None  # from idle: no
    assert w._why(insight("unknown")) is None  # to unknown: no
    assert w._why(insight("input-bound")) is None
    why = w._why(insight("compute-bound"))
    assert why == "the verdict changed from input-bound to compute-bound"
    with caplog.at_level(logging.INFO, logger="sidecar"):
        w._take(why)
        assert w._thread is not None
        w._thread.join(10)
    assert w.taken == [why]
    assert "automatic capture: the verdict changed from input-bound to compute-bound" in caplog.text
    assert "not taken: no live trainer" in caplog.text
    assert w._why(insight("input-bound")) is None  # within the period


def test_a_step_time_that_moves_by_more_than_the_share_triggers(tmp_path: Path) -> None:
    w = watch(tmp_path, capture_on_step_change=0.5)
    assert w._why(insight("compute-bound", 10.0)) is None  # the reference: 100 ms a step
    assert w._why(insight("compute-bound", 7.0)) is None  # 143 ms: +43 %
    assert w._why(insight("compute-bound", 6.0)) == "the trainer step time moved from 100.0 ms to 166.7 ms"
    assert w._why(insight("compute-bound", 6.0)) is None  # the reference is now the step time at that capture
