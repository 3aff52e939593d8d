"""The W&B exporter's caller side, in process: states, refusal, bounded queue, lifecycle.

None of these tests lets the exporter start a W&B run (they keep it waiting or refused), so
no wandb service is started here; runs and the stalled service are in test_wandb_offline.py.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator

import pytest

from sidecar.exporters.wandb.exporter import WandbConfig, WandbExporter, WandbState
from tests.waiting import wait_until

HOST = "box1"


@pytest.fixture(autouse=True)
def restore_environ() -> Iterator[None]:
    """``start()`` removes inherited WANDB_* variables from ``os.environ``: undo it."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def exporter(run: str | None, env: dict[str, str] | None = None, **kw: object) -> WandbExporter:
    log = logging.getLogger("test.wandb")
    return WandbExporter(WandbConfig(run=run, **kw), host=HOST, log=log,  # type: ignore[arg-type]
                         environ=env or {})


def wait_for(predicate, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    """``tests.waiting.wait_until`` polling every 20 ms."""
    wait_until(predicate, timeout_s, 0.02)


def test_disabled_without_run_and_shutdown_is_idempotent_without_start() -> None:
    ex = exporter(None)
    ex.start()
    assert ex.stats().state is WandbState.DISABLED
    assert ex.submit({"a": 1.0}, 1) is False
    assert ex.stats().rows_dropped == {"disabled": 1}
    ex.shutdown()
    ex.shutdown(0)
    assert ex.stats().state is WandbState.DISABLED
    never_started = exporter("r1")
    never_started.shutdown()
    never_started.shutdown()
    assert never_started.submit({"a": 1.0}, None) is False
    assert never_started.stats().rows_dropped == {"shutdown": 1}


def test_wandb_mode_disabled_turns_the_exporter_off() -> None:
    ex = exporter("r1", env={"WANDB_MODE": "disabled"})
    ex.start()
    stats = ex.stats()
    assert stats.state is WandbState.DISABLED and "WANDB_MODE=disabled" in stats.reason
    ex.shutdown()


@pytest.mark.parametrize(("run", "mode"), [("r1", "online"), ("auto", "online"),
                                           ("r1", "run")])
def test_refuses_a_non_shared_trainer_run(run: str, mode: str | None,
                                          caplog: pytest.LogCaptureFixture) -> None:
    ex = exporter(run)
    caplog.set_level(logging.INFO, logger="test.wandb")
    ex.start()
    assert "no W&B credentials" in caplog.text  # this environment has none: start warns of it
    caplog.clear()
    ex.on_trainer_hello("r1", "proj", None, mode, True)
    stats = ex.stats()
    assert stats.state is WandbState.REFUSED and stats.trainer_run_id == "r1"
    assert ex.submit({"a": 1.0}, 3) is False
    assert ex.stats().rows_dropped == {"refused": 1}
    refusals = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(refusals) == 1
    assert "WANDB_MODE=shared" in refusals[0].getMessage()
    assert "WANDB_X_PRIMARY=true" in refusals[0].getMessage()
    ex.on_trainer_hello("r1", "proj", None, mode, True)  # same news: logged once
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    ex.shutdown(1)


def test_waits_for_the_mode_and_holds_rows_in_a_bounded_queue() -> None:
    ex = exporter("r1", queue_size=4)
    ex.start()
    ex.on_trainer_hello("r1", None, None, None, None)  # mode unknown: never join blindly
    assert ex.stats().state is WandbState.WAITING
    accepted = 0
    for i in range(50):  # never blocks: with the queue full and nothing draining it, a put that waited would hang
        accepted += ex.submit({"gpu/0/utilization": 0.5}, i)
    stats = ex.stats()
    # the thread holds one row aside while it waits; the queue holds queue_size more
    assert accepted in (4, 5) and stats.rows_dropped == {"queue_full": 50 - accepted}
    assert stats.queue_capacity == 4 and stats.rows_logged == 0
    t0 = time.monotonic()
    ex.shutdown(timeout_s=2)
    assert time.monotonic() - t0 < 10
    assert ex.stats().rows_dropped == {"queue_full": 50 - accepted, "shutdown": accepted}
    assert ex.stats().state is WandbState.DISABLED


def test_auto_mode_follows_new_runs_but_never_flaps_back() -> None:
    ex = exporter("auto")
    ex.start()
    assert ex.stats().state is WandbState.WAITING
    ex.on_trainer_hello("runA", None, None, "online", True)
    assert (ex.stats().trainer_run_id, ex.stats().state) == ("runA", WandbState.REFUSED)
    ex.on_trainer_hello("runB", None, None, None, None)
    assert (ex.stats().trainer_run_id, ex.stats().state) == ("runB", WandbState.WAITING)
    ex.on_trainer_hello("runA", None, None, "online", True)  # seen before: no flap back
    assert ex.stats().trainer_run_id == "runB"
    ex.on_trainer_hello(None, None, None, None, None)  # a trainer without W&B: ignored
    assert ex.stats().trainer_run_id == "runB"
    ex.shutdown(1)


def test_hellos_of_one_run_merge_what_each_worker_knows() -> None:
    ex = exporter("r1", env={"WANDB_MODE": "offline"}, project="cfg")
    # not started: decisions only, no thread and no wandb
    ex.on_trainer_hello("r1", "tp", None, "shared", True)
    first = ex.stats()
    ex.on_trainer_hello("r1", None, None, None, None)  # a worker that knows less
    assert ex.stats() == first
    ex.shutdown()


def test_start_removes_inherited_run_variables_only() -> None:
    os.environ.update({"WANDB_SERVICE": "3-1-unix-/nonexistent", "WANDB_RUN_ID": "trainer",
                       "WANDB_X_PRIMARY": "true", "WANDB_PROJECT": "p"})
    ex = exporter("r1")
    ex.start()
    assert "WANDB_SERVICE" not in os.environ and "WANDB_RUN_ID" not in os.environ
    assert "WANDB_X_PRIMARY" not in os.environ and os.environ["WANDB_PROJECT"] == "p"
    ex.shutdown(1)


def test_invalid_config_fails_fast() -> None:
    for bad in (dict(run=""), dict(run="a/b"), dict(run="r", queue_size=0),
                dict(run="r", shutdown_timeout_s=-1)):
        with pytest.raises(ValueError):
            WandbExporter(WandbConfig(**bad), host=HOST)  # type: ignore[arg-type]


def test_submit_while_waiting_for_the_first_hello_then_refused_drops_them() -> None:
    ex = exporter("auto", queue_size=8)
    ex.start()
    for i in range(3):
        assert ex.submit({"a": float(i)}, i)
    ex.on_trainer_hello("r1", None, None, "online", None)
    wait_for(lambda: ex.stats().rows_dropped.get("refused", 0) == 3)
    assert ex.stats().queue_depth == 0
    ex.shutdown(1)


def test_wandb_is_imported_only_by_a_started_enabled_exporter() -> None:
    import subprocess
    import sys
    code = (
        "import sys, logging\n"
        "from sidecar.exporters.wandb.exporter import WandbConfig, WandbExporter\n"
        "ex = WandbExporter(WandbConfig(run=None), host='h')\n"
        "ex.start(); ex.submit({'a': 1.0}, 1); ex.shutdown()\n"
        "assert 'wandb' not in sys.modules, 'wandb imported'\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60,
                   env=dict(os.environ, PYTHONPATH=root))
