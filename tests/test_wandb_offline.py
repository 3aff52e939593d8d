"""The W&B exporter against the real ``wandb`` library in offline mode, in a subprocess.

Each scenario runs the exporter in a child process (this file run as a script: the wandb
service, the environment cleaning and exit hooks are per process), then the test reads what
was logged back from the run's ``.wandb`` file with ``wandb_records`` (wandb's own protobuf
``Record``). Shared mode needs the W&B server, so the runs here are the daemon's own offline
runs; the shared-join settings are unit-tested in test_wandb_join.py.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

FAKE_KEY = "0123456789abcdef" * 2 + "8badf00d"
TRAINER_ENV = {  # what a daemon started from the trainer's shell would inherit
    "WANDB_SERVICE": "3-999999-unix-/nonexistent/wandb-trainer.sock",
    "WANDB_RUN_ID": "trainer-own-id",
    "WANDB_RESUME": "must",
    "WANDB_X_PRIMARY": "true",
    "WANDB_RUN_GROUP": "trainer-group",
}


# ---- the child side ---------------------------------------------------------------------

def _child(scenario: str, wandb_dir: str) -> dict[str, Any]:
    from sidecar.exporters.wandb.exporter import WandbConfig, WandbExporter, wandb_core_children
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr,
                        format="%(asctime)s %(threadName)s %(name)s %(message)s")

    def until(pred, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout_s
        while not pred():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{scenario}: condition not reached")
            time.sleep(0.02)

    if scenario == "roundtrip":
        ex = WandbExporter(WandbConfig(run="trainer-abc", project="proj", dir=wandb_dir),
                           host="box1")
        ex.start()
        until(lambda: ex.stats().state.value == "offline")
        ex.submit({"gpu/0/utilization": 0.25}, None)  # before the trainer published steps
        for i in range(5):
            ex.submit({"timing/fwd/p50_s": 0.01 * (i + 1), "gpu/0/utilization": 0.9,
                       "queue/fill_ratio": i / 4, "bad": "not a number"}, 10 + i)
        ex.submit({"gpu/0/power_w": 300.0}, None)  # steps known: stays on the axis
        run_id = ex.stats().run_id
        ex.shutdown()  # flushes the queued rows
        return {"run_id": run_id, "stats": _plain(ex.stats())}

    if scenario == "picture":  # the run's page as an HTML panel when the exporter leaves the run
        import dataclasses

        import timeline_synth
        from insight_synth import report, worker

        from sidecar.model.ends import EndsView, SenderEnd
        book, fed = timeline_synth.book(120, 10.0, gpus=2)
        window = dataclasses.replace(report(worker("trainer", "0", {"forward": 10}, 5)),
                                     run_ledger=timeline_synth.ledger_view(fed, 100, 10.0),
                                     timelines={timeline_synth.RUN: book.view()})
        end = SenderEnd("trainer", "0", "clean", "", 4242, 7, time.time(), 0)
        ended = dataclasses.replace(window, senders=(), run_ledger=timeline_synth.ledger_view(fed, 120, 10.0),
                                    ends=EndsView(new=(end,)))  # its last sender ended: the picture now
        later = dataclasses.replace(ended, timelines={}, ends=EndsView(),  # idle afterwards: no second one
                                    run_ledger=timeline_synth.ledger_view(fed, 240, 10.0))
        ex = WandbExporter(WandbConfig(run=timeline_synth.RUN, project="proj", dir=wandb_dir), host="box1")
        ex.start()
        until(lambda: ex.stats().state.value == "offline")
        windows = (window, ended, later) if wandb_dir.endswith("ended") else (window,)  # else: the daemon stops
        for w in windows:
            ex.consume(w)
        until(lambda: ex.stats().rows_logged == len(windows))
        run_id = ex.stats().run_id
        ex.shutdown()
        return {"run_id": run_id, "stats": _plain(ex.stats())}

    if scenario == "reattach":
        ex = WandbExporter(WandbConfig(run="auto", dir=wandb_dir), host="box1")
        ex.start()
        ex.on_trainer_hello("runA", "projA", None, "offline", True)
        for i in range(3):
            ex.submit({"x": float(i)}, i)
        ex.on_trainer_hello("runB", "projB", None, "offline", True)  # a new training run
        ex.on_trainer_hello("runA", "projA", None, "offline", True)  # late hello: no flap
        for i in range(2):
            ex.submit({"y": float(i)}, 100 + i)
        until(lambda: ex.stats().rows_logged == 5)
        ex.shutdown()
        return {"stats": _plain(ex.stats())}

    if scenario == "no-project":  # neither the settings nor the trainer's hello name a project
        ex = WandbExporter(WandbConfig(run="auto", dir=wandb_dir), host="box1")
        ex.start()
        ex.on_trainer_hello("runN", None, None, "offline", True)
        ex.submit({"x": 1.0}, 1)
        until(lambda: ex.stats().rows_logged == 1)
        ex.shutdown()
        return {"stats": _plain(ex.stats())}

    if scenario == "stall":
        ex = WandbExporter(WandbConfig(run="trainer-s", dir=wandb_dir, queue_size=8),
                           host="box1")
        ex.start()
        ex.submit({"warmup": 1.0}, 0)
        until(lambda: ex.stats().rows_logged == 1)
        pids = wandb_core_children()
        print(json.dumps({"service_pids": pids}), flush=True)  # for the parent's clean-up
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        worst, submitted, t_end = 0.0, 0, time.monotonic() + 20
        row = {f"gpu/{g}/{k}": 0.5 for g in range(8) for k in ("util", "mem", "power")}
        while ex.stats().rows_dropped.get("queue_full", 0) < 20 and time.monotonic() < t_end:
            t0 = time.perf_counter()
            ex.submit(row, submitted)
            worst = max(worst, time.perf_counter() - t0)
            submitted += 1
            time.sleep(0.001)
        before = _plain(ex.stats())
        t0 = time.monotonic()
        ex.shutdown(timeout_s=2)
        shutdown_s = time.monotonic() - t0
        alive = [p for p in pids if _running(p)]
        print(json.dumps({"shutdown_returned": True}), flush=True)
        return {"worst_submit_s": worst, "submitted": submitted, "before": before,
                "after": _plain(ex.stats()), "shutdown_s": shutdown_s, "alive": alive}

    if scenario == "shared-unreachable":
        ex = WandbExporter(WandbConfig(run="auto", dir=wandb_dir), host="box1")
        ex.start()
        ex.on_trainer_hello("trainer-xyz", "proj", "ent", "shared", True)
        until(lambda: ex.stats().state.value == "error")
        queued = [ex.submit({"x": 1.0}, i) for i in range(3)]
        error = _plain(ex.stats())
        t0 = time.monotonic()
        ex.shutdown(timeout_s=2)
        return {"error": error, "queued": queued, "shutdown_s": time.monotonic() - t0,
                "after": _plain(ex.stats())}

    raise ValueError(scenario)


def _plain(stats: Any) -> dict[str, Any]:
    out = dict(vars(stats))
    out["state"] = stats.state.value
    out["rows_dropped"] = dict(stats.rows_dropped)
    return out


def _running(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


# ---- the parent side --------------------------------------------------------------------

def run_child(scenario: str, tmp: pathlib.Path, extra_env: dict[str, str],
              timeout_s: float = 60) -> tuple[dict[str, Any], str, str]:
    """Run a scenario; return (its result, stdout, stderr). Any wandb-core it announced is
    resumed and killed afterwards if still there."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_DIR=str(tmp), WANDB_SILENT="true", WANDB_CONFIG_DIR=str(tmp / "config"),
               WANDB_CACHE_DIR=str(tmp / "cache"), WANDB_DATA_DIR=str(tmp / "data"),
               PYTHONPATH=str(ROOT), HOME=str(tmp))
    env.update(extra_env)
    proc = subprocess.Popen([sys.executable, __file__, scenario, str(tmp)], env=env, cwd=tmp,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            out, err = proc.communicate()
        for line in (out or "").splitlines():
            if line.startswith('{"service_pids"'):
                for pid in json.loads(line)["service_pids"]:
                    _release(pid)
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{err[-4000:]}"
    lines = out.strip().splitlines()
    return json.loads(lines[-1]), out, err


def _release(pid: int) -> None:
    """Resume and end a wandb-core the test stopped, if it is still there."""
    if _running(pid):
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except OSError:
                pass


@pytest.fixture(scope="module")
def roundtrip(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, ...]]:
    tmp = tmp_path_factory.mktemp("wandb-roundtrip")
    env = dict(TRAINER_ENV, WANDB_MODE="offline", WANDB_API_KEY=FAKE_KEY)
    result, out, err = run_child("roundtrip", tmp, env)
    yield result, out, err, tmp


def test_rows_land_under_sidecar_prefix_on_the_trainer_step_axis(
        roundtrip: tuple[Any, ...]) -> None:
    import wandb_records
    result, _, _, tmp = roundtrip
    assert result["stats"]["rows_logged"] == 7 and result["stats"]["values_skipped"] == 5
    assert result["stats"]["rows_dropped"] == {}
    path = wandb_records.find_run_file(tmp, result["run_id"])
    rows = [{k: v for k, v in row.items() if not k.startswith("_")}
            for row in wandb_records.history_rows(path)]
    assert rows[0] == {"sidecar/gpu/0/utilization": 0.25}
    for i, row in enumerate(rows[1:6]):
        assert row == pytest.approx({"sidecar/timing/fwd/p50_s": 0.01 * (i + 1),
                                     "sidecar/gpu/0/utilization": 0.9,
                                     "sidecar/queue/fill_ratio": i / 4,
                                     "sidecar/trainer_step": 10 + i})
    # a row without a step after steps are known gets the last one (step_sync)
    assert rows[6] == {"sidecar/gpu/0/power_w": 300.0, "sidecar/trainer_step": 14}
    assert len(rows) == 7
    metrics = wandb_records.of_type(path, "metric")
    assert [(m.name, m.glob_name, m.step_metric) for m in metrics] == [
        ("sidecar/trainer_step", "", ""), ("", "sidecar/*", "sidecar/trainer_step")]


def test_offline_run_is_the_daemons_own_grouped_with_the_trainer_run(
        roundtrip: tuple[Any, ...]) -> None:
    import wandb_records
    result, _, _, tmp = roundtrip
    path = wandb_records.find_run_file(tmp, result["run_id"])
    (run,) = wandb_records.of_type(path, "run")
    assert run.run_id == result["run_id"]
    # inherited WANDB_RUN_ID / WANDB_RUN_GROUP / WANDB_SERVICE did not leak into the run
    assert run.run_id != "trainer-own-id"
    assert (run.run_group, run.job_type, run.project) == ("trainer-abc", "sidecar", "proj")
    assert run.display_name == "sidecar box1"
    assert result["stats"]["state"] == "disabled"  # after shutdown
    assert wandb_records.of_type(path, "exit"), "the own offline run was closed"


def test_api_key_never_appears_in_logs_or_files(roundtrip: tuple[Any, ...]) -> None:
    _, out, err, tmp = roundtrip
    assert "credentials=WANDB_API_KEY" in err  # the source is logged, never the key
    assert FAKE_KEY not in out and FAKE_KEY not in err
    for path in tmp.rglob("*"):
        if path.is_file():
            assert FAKE_KEY.encode() not in path.read_bytes(), path


def test_auto_mode_reattaches_when_the_trainer_announces_a_new_run(tmp_path: pathlib.Path) -> None:
    import wandb_records
    result, _, _ = run_child("reattach", tmp_path, {})
    assert result["stats"]["rows_logged"] == 5 and result["stats"]["rows_dropped"] == {}
    by_group = {}
    for path in tmp_path.rglob("run-*.wandb"):
        if "latest-run" in path.parts:
            continue
        (run,) = wandb_records.of_type(path, "run")
        rows = [{k: v for k, v in r.items() if not k.startswith("_")}
                for r in wandb_records.history_rows(path)]
        by_group[run.run_group] = (run.project, rows)
    assert by_group == {
        "runA": ("projA", [{"sidecar/x": i, "sidecar/trainer_step": i} for i in range(3)]),
        "runB": ("projB", [{"sidecar/y": i, "sidecar/trainer_step": 100 + i}
                           for i in range(2)]),
    }


def test_offline_run_without_a_project_lands_in_the_documented_default(tmp_path: pathlib.Path) -> None:
    """No ``--wandb-project``, no ``WANDB_PROJECT``, a hello without a project: the own offline
    run goes to ``OFFLINE_PROJECT``, not to a project wandb names after the program's folder."""
    import wandb_records

    from sidecar.exporters.wandb.join import OFFLINE_PROJECT
    result, _, _ = run_child("no-project", tmp_path, {})
    assert result["stats"]["rows_logged"] == 1
    [path] = [p for p in tmp_path.rglob("run-*.wandb") if "latest-run" not in p.parts]
    (run,) = wandb_records.of_type(path, "run")
    assert (run.run_group, run.project) == ("runN", OFFLINE_PROJECT) and OFFLINE_PROJECT == "dflash-sidecar"


def test_stalled_wandb_service_never_blocks_submit_and_shutdown_is_bounded(
        tmp_path: pathlib.Path) -> None:
    t0 = time.monotonic()
    result, _, err = run_child("stall", tmp_path, {"WANDB_MODE": "offline"})
    total_s = time.monotonic() - t0
    assert result["before"]["state"] == "offline"
    assert result["before"]["rows_dropped"].get("queue_full", 0) >= 20
    assert result["before"]["queue_depth"] == 8
    # submit never blocked: the rows above were all submitted while the service was stopped
    # (SIGSTOP) and the queue full, where a submit that waited would never have returned
    assert result["shutdown_s"] < 10, result
    assert result["after"]["rows_dropped"].get("shutdown", 0) >= 8
    assert result["alive"] == [], "the stalled wandb-core was left behind"
    assert "did not answer within the shutdown timeout" in err
    assert total_s < 60  # the child's exit did not hang on wandb's exit hooks


def test_shared_join_is_attempted_as_a_shared_writer_and_failure_is_retried(
        tmp_path: pathlib.Path) -> None:
    """Shared mode needs the server: against an unreachable one the join fails, is retried
    with back-off, rows wait in the queue, and the attempt's local transaction log shows how
    wandb was asked to join (the trainer's id, shared mode, a label)."""
    import wandb_records
    env = {"WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_API_KEY": FAKE_KEY,
           "WANDB_INIT_TIMEOUT": "2", **TRAINER_ENV}
    result, out, err = run_child("shared-unreachable", tmp_path, env)
    error = result["error"]
    assert error["trainer_run_id"] == "trainer-xyz" and "retrying" in error["reason"]
    assert error["last_error"] and "127.0.0.1:9" in error["last_error"]
    assert result["queued"] == [True, True, True] and error["queue_depth"] == 3
    assert result["shutdown_s"] < 10
    assert result["after"]["rows_dropped"] == {"shutdown": 3}
    runs = [wandb_records.of_type(p, "run") for p in tmp_path.rglob("run-trainer-xyz.wandb")
            if "latest-run" not in p.parts]
    assert runs, "no transaction log of the join attempt"
    (run,) = runs[0]
    assert (run.run_id, run.project, run.entity) == ("trainer-xyz", "proj", "ent")
    assert run.telemetry.feature.shared_mode and run.telemetry.feature.user_provided_label
    assert not run.telemetry.feature.resumed and not run.resumed and not run.resume
    assert run.run_group == "" and run.job_type == ""  # inherited WANDB_RUN_GROUP dropped
    assert FAKE_KEY not in out and FAKE_KEY not in err


@pytest.mark.parametrize("how", ["ended", "stopped"])
def test_the_runs_picture_goes_to_the_run_as_an_html_panel_once_when_it_ends_or_the_daemon_stops(
        tmp_path: pathlib.Path, how: str) -> None:
    import wandb_records
    from test_report_html import fetches_nothing
    env = dict(TRAINER_ENV, WANDB_MODE="offline", WANDB_API_KEY=FAKE_KEY)
    folder = tmp_path / how
    folder.mkdir()
    result, _, _ = run_child("picture", folder, env)
    assert result["stats"]["rows_logged"] == (3 if how == "ended" else 1) and result["stats"]["rows_dropped"] == {}
    path = wandb_records.find_run_file(folder, result["run_id"])
    [panel] = [row["sidecar/box1/run_picture"] for row in wandb_records.history_rows(path)
               if "sidecar/box1/run_picture" in row]  # one: when the run ended, none again on leaving it
    assert panel["_type"] == "html-file"
    [page] = list(path.parent.rglob(panel["path"].split("/")[-1]))
    text = page.read_text()
    assert "<h1 id=\"verdict\">balanced for" in text and "uPlot" in text
    # the ledger as the run ended (120 windows), not the idle window's after it; or the one window's
    assert f"trainer: wall {'20.0' if how == 'ended' else '16.7'} min" in text
    fetches_nothing(text)  # no stylesheet injected (inject=False), nothing else fetched


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    res = _child(sys.argv[1], sys.argv[2])
    print(json.dumps(res), flush=True)
