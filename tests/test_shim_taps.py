"""Taps on the trainer's own loggers (``trainer_shim.integrations.taps``), with the real libraries:
TensorBoard's writer (torch's and tensorboardX) to a temporary folder, W&B offline, MLflow's file
store. Each script runs in a fresh interpreter against a real receiver; the logger's own output
with the tap is compared with its output without it, written by the same script.

What cannot be equal between two runs and is left out of the comparison: TensorBoard's
``file_version`` event carries the time the file was opened (its ``wall_time`` is zeroed; every
scalar event is compared as written, the script passes ``walltime``); W&B's rows carry
``_timestamp`` and ``_runtime`` (left out; every other item is compared as its JSON text, the
items of a row sorted by key, as wandb-core writes them in no fixed order); MLflow's
metric files are compared byte for byte (the script passes ``timestamp``), the run folders' names
(run ids) aside. MLflow 3's file store refuses to open unless ``MLFLOW_ALLOW_FILE_STORE=true`` (it
is in maintenance mode there); the scripts set it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import wandb_records
from tests.shim_helpers import ReceiverProcess, SenderBook, only_book, run_script
from trainer_shim.wire import RecordKind

pytest_plugins = ["tests.shim_fixtures"]

PROFILE, SCALAR = int(RecordKind.PROFILE), int(RecordKind.SCALAR)


def result(proc: Any) -> dict[str, Any]:
    """The script's last stdout line, a JSON object."""
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def profiles(book: SenderBook) -> list[tuple[int, dict[str, Any]]]:
    """The ``publish`` records (step, dict) in order."""
    return [(r[1], r[2]) for r in book.records if r[0] == PROFILE]


def others(book: SenderBook) -> list[tuple[int, Any, Any]]:
    """The other records (kind, name, value) in order."""
    return [(r[0], r[1], r[2]) for r in book.records if r[0] != PROFILE]


TENSORBOARD = """
    import json, torch
    from trainer_shim.integrations import taps
    from {module} import SummaryWriter

    def calls(w):
        out = [w.add_scalar("data_time_ms", 20.0 + i, i, walltime=1000.0 + i) for i in range(3)]
        out.append(w.add_scalars("phase", {{"fwd_ms": 1.5, "bwd_ms": 2}}, 3, walltime=1003.0))
        out.append(w.add_scalar("loss", torch.tensor(0.5), global_step=4, walltime=1004.0))
        out.append(w.add_scalar("no_step", 7.0, walltime=1005.0))
        try:
            w.add_scalar("bad", object(), 5)
        except Exception as exc:
            out.append(repr(exc))
        w.close()
        return out

    originals = (SummaryWriter.add_scalar, SummaryWriter.add_scalars)
    plain = calls(SummaryWriter("plain"))
    taps.tap("tensorboard")
    tapped = calls(SummaryWriter("tapped"))
    on = SummaryWriter.add_scalar is not originals[0]
    telemetry.close()  # closing the channel takes the tap off
    off = (SummaryWriter.add_scalar, SummaryWriter.add_scalars) == originals
    print(json.dumps({{"plain": plain, "tapped": tapped, "on": on, "off": off, "stats": taps.stats()}}))
"""


def tensorboard_events(folder: Path) -> dict[str, list[bytes]]:
    """Per sub-folder, the serialized events of its event files; ``file_version`` events'
    ``wall_time`` zeroed (the time the file was opened)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    out: dict[str, list[bytes]] = {}
    for path in sorted(folder.rglob("events.out.tfevents.*")):
        events = []
        for event in EventFileLoader(str(path)).Load():
            if event.HasField("file_version"):
                event.wall_time = 0.0
            events.append(event.SerializeToString())
        out.setdefault(str(path.parent.relative_to(folder)), []).extend(events)
    return out


@pytest.mark.parametrize("module", ["torch.utils.tensorboard", "tensorboardX"])
def test_tensorboard_scalars_reach_the_sidecar_and_the_event_files_stay_the_same(
        module: str, workdir: Path, ep: str, receivers: Callable[..., ReceiverProcess]) -> None:
    rx = receivers(ep)
    out = result(run_script(workdir, TENSORBOARD.format(module=module), ep))
    assert out["tapped"] == out["plain"] and "bad" not in str(out["plain"][:6])
    assert out["on"] and out["off"] and out["stats"]["errors"] == 0
    plain, tapped = tensorboard_events(workdir / "plain"), tensorboard_events(workdir / "tapped")
    assert plain == tapped and sum(map(len, plain.values())) >= 9
    book = only_book(rx, lambda b: sum(r[0] == PROFILE for r in b.records) >= 5)
    assert profiles(book) == [(0, {"data_time_ms": 20.0}), (1, {"data_time_ms": 21.0}), (2, {"data_time_ms": 22.0}),
                              (3, {"phase/fwd_ms": 1.5, "phase/bwd_ms": 2}),
                              (4, {"no_step": 7.0})]  # no step: the last one seen
    assert others(book) == [(SCALAR, "loss", 0.5)]  # a tensor goes to scalar()


WANDB = """
    import json, wandb
    from trainer_shim.integrations import taps

    def calls(run):
        out = [wandb.log({"data_time_ms": 20.0 + i, "step_ms": 25.0, "note": "text"}, step=i) for i in range(3)]
        out.append(run.log({"loss": 0.5}, commit=False))  # no step: joins the open row (2)
        out.append(run.log({"lr": 0.1, "hist": wandb.Histogram([1, 2, 3])}))  # and commits it
        out.append(wandb.log(data={"data_time_ms": 1.0}))  # row 3
        out.append(wandb.log({"loss": 0.25, "train/global_step": 40}))  # row 4, the Trainer's step 40
        try:
            wandb.log([1, 2])
        except Exception as exc:
            out.append(repr(exc))
        ident = run.id
        run.finish()
        return out, ident

    original = wandb.Run.log
    plain, plain_id = calls(wandb.init(mode="offline", project="p"))
    run = wandb.init(mode="offline", project="p")
    taps.tap("wandb")  # after init: wandb.log, bound to the run's log, is tapped too
    tapped, tapped_id = calls(run)
    telemetry.close()
    print(json.dumps({"plain": plain, "tapped": tapped, "ids": [plain_id, tapped_id],
                      "off": wandb.Run.log is original, "stats": taps.stats()}))
"""


def wandb_rows(root: Path, run_id: str) -> list[list[tuple[str, str]]]:
    """The run's history rows, each its sorted (key, JSON text) items (wandb-core writes them in
    no fixed order), ``_timestamp`` and ``_runtime`` left out."""
    path = wandb_records.find_run_file(root, run_id)
    rows = [[("/".join(item.nested_key) or item.key, item.value_json) for item in history.item]
            for history in wandb_records.of_type(path, "history")]
    return [sorted(item for item in row if item[0] not in ("_timestamp", "_runtime")) for row in rows]


def test_wandb_log_reaches_the_sidecar_and_the_run_stays_the_same(
        workdir: Path, ep: str, receivers: Callable[..., ReceiverProcess]) -> None:
    rx = receivers(ep)
    env = {"WANDB_DIR": str(workdir), "WANDB_SILENT": "true", "WANDB_MODE": "offline"}
    out = result(run_script(workdir, WANDB, ep, env=env))
    assert out["tapped"] == out["plain"] and "TypeError" in out["plain"][-1]
    assert out["off"] and out["stats"]["errors"] == 0 and out["stats"]["skipped"] == 4  # 3 texts, 1 histogram
    plain, tapped = (wandb_rows(workdir, run_id) for run_id in out["ids"])
    assert plain == tapped and len(plain) == 5
    book = only_book(rx, lambda b: len(profiles(b)) >= 7)
    assert profiles(book) == [(i, {"data_time_ms": 20.0 + i, "step_ms": 25.0}) for i in range(3)] + [
        (2, {"loss": 0.5}), (2, {"lr": 0.1}), (3, {"data_time_ms": 1.0}),
        (40, {"loss": 0.25, "train/global_step": 40})]
    for step, data in profiles(book)[:-1]:  # each forwarded with the step of the row W&B put it in
        [row] = [dict(r) for r in tapped if ("_step", str(step)) in r]
        assert {k: json.loads(row[k]) for k in data} == data


MLFLOW = """
    import json, mlflow
    from trainer_shim.integrations import taps

    def calls(name):
        mlflow.start_run(run_name=name)
        out = [mlflow.log_metric("data_time_ms", 20.0 + i, step=i, timestamp=1000 + i) for i in range(3)]
        out.append(mlflow.log_metrics({"step_ms": 25.0, "loss": 0.5}, step=3, timestamp=1003))
        out.append(mlflow.log_metric("no_step", 7, timestamp=1004))
        try:
            mlflow.log_metric("bad", "text", step=5, timestamp=1005)
        except Exception as exc:
            out.append(type(exc).__name__)
        ident = mlflow.active_run().info.run_id
        mlflow.end_run()
        return [repr(x) for x in out], ident

    original = mlflow.log_metric
    mlflow.set_tracking_uri("file:" + os.path.abspath("mlruns"))
    plain, plain_id = calls("plain")
    taps.tap("mlflow")
    tapped, tapped_id = calls("tapped")
    telemetry.close()
    print(json.dumps({"plain": plain, "tapped": tapped, "ids": [plain_id, tapped_id],
                      "off": mlflow.log_metric is original, "stats": taps.stats()}))
"""


def mlflow_metric_files(root: Path, run_id: str) -> dict[str, bytes]:
    [run] = [p for p in root.rglob(run_id) if (p / "metrics").is_dir()]
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted((run / "metrics").rglob("*")) if p.is_file()}


def test_mlflow_metrics_reach_the_sidecar_and_the_metric_files_stay_the_same(
        workdir: Path, ep: str, receivers: Callable[..., ReceiverProcess]) -> None:
    rx = receivers(ep)
    out = result(run_script(workdir, MLFLOW, ep, env={"MLFLOW_ALLOW_FILE_STORE": "true"}))
    assert out["tapped"] == out["plain"] and out["off"] and out["stats"]["errors"] == 0
    plain, tapped = (mlflow_metric_files(workdir / "mlruns", run_id) for run_id in out["ids"])
    assert plain == tapped and set(plain) == {"metrics/data_time_ms", "metrics/step_ms", "metrics/loss",
                                              "metrics/no_step"}
    book = only_book(rx, lambda b: len(profiles(b)) >= 5)
    assert profiles(book) == [(i, {"data_time_ms": 20.0 + i}) for i in range(3)] + [
        (3, {"step_ms": 25.0, "loss": 0.5}), (3, {"no_step": 7})]


NO_LOOP = """
    import json, time, wandb
    from sidecar.core import config
    from sidecar.core.daemon import Daemon
    from trainer_shim.integrations import taps

    run = wandb.init(mode="offline", project="p")
    taps.tap("wandb")
    cfg = config.load({{"wandb_run": "auto", "endpoint": [os.environ["DFLASH_SIDECAR_ENDPOINT"]],
                       "prometheus_addr": "127.0.0.1:{port}", "interval": 0.5, "gpu_metrics": False,
                       "state_dir": "state"}})
    daemon = Daemon(cfg)  # in this process, as the demo runs it
    daemon.start()
    for i in range({steps}):
        time.sleep(0.1)
        wandb.log({{"data_time_ms": 90.0, "step_ms": 100.0}}, step=i)
    time.sleep(1.5)  # the last windows reach the W&B exporter
    telemetry.flush(wait_s=5)
    trainer_id = run.id
    run.finish()  # before the daemon's shutdown, which tears the process's wandb service down
    daemon.stop()
    daemon.shutdown()  # flushes the exporter's rows
    telemetry.close()
    print(json.dumps({{"trainer": trainer_id, "shim": list(telemetry.stats().values()), "stats": taps.stats()}}))
"""


def test_the_sidecars_own_wandb_rows_are_never_tapped(workdir: Path, ep: str) -> None:
    """The daemon with its W&B exporter in the trainer's process (as the demo runs it) and a
    tapped ``wandb.log``: the exporter's ``run.log`` goes through the same patched ``Run.log``;
    were it forwarded, the daemon would receive its own rows and export them again, without end."""
    from tests.launcher import free_port

    steps = 30
    env = {"WANDB_DIR": str(workdir), "WANDB_SILENT": "true", "WANDB_MODE": "offline"}
    out = result(run_script(workdir, NO_LOOP.format(port=free_port(), steps=steps), ep, env=env))
    [shim] = out["shim"]
    assert shim["records_total"] + sum(shim["dropped"].values()) + shim["pending"] == steps  # the trainer's rows only
    files = [p for p in workdir.rglob("run-*.wandb") if "latest-run" not in p.parts]
    trainer = wandb_records.find_run_file(workdir, out["trainer"])
    [sidecar] = [p for p in files if p != trainer]
    trainer_keys = {k for row in wandb_records.history_rows(trainer) for k in row}
    assert trainer_keys == {"data_time_ms", "step_ms", "_step", "_timestamp", "_runtime"}
    sidecar_keys = {k for row in wandb_records.history_rows(sidecar) for k in row}
    assert any("data_time" in k for k in sidecar_keys), sorted(sidecar_keys)  # it exported the trainer's series
    assert not [k for k in sidecar_keys if k.count("sidecar/") > 1 or "sidecar_" in k.removeprefix("sidecar/")]


class CudaScalar:
    """What a tap must never read: a one-element CUDA tensor (reading it synchronizes)."""

    is_cuda = True

    def numel(self) -> int:
        return 1

    def item(self) -> float:
        raise AssertionError("read a CUDA tensor")

    __float__ = __index__ = __int__ = item  # type: ignore[assignment]


class Recorded:
    """A sink's target that keeps what it is handed (the routing is under test here; the
    channel's own handling of a CUDA scalar is tests/test_shim_cuda_scalar.py's)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def publish(self, step: int, data: dict[str, Any]) -> None:
        self.calls.append(("publish", step, dict(data)))

    def scalar(self, name: str, value: Any) -> None:
        self.calls.append(("scalar", name, value))


def test_a_cuda_scalar_goes_to_scalar_unread_and_what_is_no_number_is_counted() -> None:
    import numpy as np

    from trainer_shim.integrations.tap_values import TapSink

    target, loss = Recorded(), CudaScalar()
    sink = TapSink(target)
    sink.mapping(7, {"a": 1.0})
    sink.mapping(CudaScalar(), {"loss": loss, "x": 2, "np": np.float32(3.0), "flag": True, "img": object(),
                                "arr": np.array(4.5), "arr3": np.zeros(3)})
    sink.one(np.int64(9), "y", CudaScalar())
    assert target.calls[:3] == [("publish", 7, {"a": 1.0}), ("scalar", "loss", loss),
                                ("publish", 7, {"x": 2, "np": 3.0, "arr": 4.5})]  # a CUDA step: the last step
    assert target.calls[3][:2] == ("scalar", "y") and sink.step == 9 and sink.skipped == 3


def test_the_tap_never_raises_into_the_call_and_the_call_raises_as_before() -> None:
    from trainer_shim.integrations.tap_targets import TapState, _wrap
    from trainer_shim.integrations.tap_values import TapSink

    state = TapState(TapSink(Recorded()))
    failing = _wrap(lambda x: x * 2, state, lambda sink, args, kwargs: 1 / 0)
    assert failing(21) == 42 and state.sink is not None and state.sink.errors == 1
    error = ValueError("the library's own")

    def library(x: int) -> int:
        raise error

    forwarded: list[Any] = []
    wrapped = _wrap(library, state, lambda sink, args, kwargs: forwarded.append(args))
    with pytest.raises(ValueError) as raised:
        wrapped(1)
    assert raised.value is error and forwarded == []


def test_closing_the_channels_publisher_takes_the_tap_off(workdir: Path) -> None:
    import tensorboardX.writer

    from trainer_shim.integrations import post_import, taps
    from trainer_shim.publisher import Publisher

    cls = tensorboardX.writer.SummaryWriter
    originals = (cls.add_scalar, cls.add_scalars)
    publisher = Publisher(f"ipc://{workdir}/none.sock", allocator_interval_s=0)
    try:
        taps.tap("tensorboard", channel=publisher.channel("trainer", "0"))
        assert "tensorboardX.writer" in taps.tapped() and cls.add_scalar is not originals[0]
    finally:
        publisher.close()
    assert taps.tapped() == () and (cls.add_scalar, cls.add_scalars) == originals
    assert "torch.utils.tensorboard.writer" not in post_import.waiting()


def test_tapping_again_waits_for_each_import_once(workdir: Path) -> None:
    """A trainer that calls ``tap()`` at every ``train()`` (a sweep, a callback's set-up) keeps one
    waiting callback per module not yet imported, not one per call (else they grow without bound,
    and the import would run each)."""
    out = run_script(workdir, """
        from trainer_shim.integrations import post_import, taps
        for _ in range(500):
            taps.tap()
        print(sorted({len(v) for v in post_import._finder.callbacks.values()}))
    """, "ipc:///nonexistent/none.sock")
    assert out.stdout.strip().splitlines()[-1] == "[1]", out.stdout
