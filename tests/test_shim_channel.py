"""The hot path in isolation: what each call queues, bad arguments, strict mode, module API.

No sockets here: channels are exercised directly and the flusher is not involved, except for the
module-level tests, which point the default publisher at an endpoint nobody binds.
"""

from __future__ import annotations

import importlib
import math
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import msgspec
import numpy as np
import pytest

from trainer_shim import endpoint, telemetry, wire
from trainer_shim.allocator import AllocatorSampler
from trainer_shim.channel import Channel, StrictChannel, Timer, strict_from_env
from trainer_shim.publisher import Publisher, _coerce, _header_step, env_worker
from trainer_shim.wandb_info import wandb_run_info
from trainer_shim.wire import RecordKind

K = RecordKind


def make(strict: bool = False, cap: int = 1000) -> Channel:
    return (StrictChannel if strict else Channel)("trainer", "0", cap, [])


def test_each_call_queues_one_record_in_wire_layout() -> None:
    ch = make()
    ch.timing("step_ms", 12.5)
    ch.count("tokens", 4096)
    ch.count("batches")
    ch.gauge("queue_depth", 3.0)
    ch.category("bucket", 7)
    ch.category("bucket", "long")
    profile = {"forward_ms": 1.0, "loss": 2.0}
    ch.publish(5, profile)
    profile["forward_ms"] = 99.0  # the caller may reuse its dict
    ch.scalar("lr", 3e-4)
    with ch.timer("block"):
        pass
    ch.append_allocator(0, 1, 2, 3)
    records = ch.drain()
    assert [tuple(r[:2]) for r in records[:-2]] == [  # profile snapshots come first
        (K.PROFILE, 5), (K.TIMING, "step_ms"), (K.COUNT, "tokens"), (K.COUNT, "batches"),
        (K.GAUGE, "queue_depth"), (K.CATEGORY, "bucket"), (K.CATEGORY, "bucket"), (K.SCALAR, "lr"),
    ]
    assert records[2][2] == 4096 and records[3][2] == 1
    assert records[0][2] == {"forward_ms": 1.0, "loss": 2.0}
    kind, name, ms = records[-2]
    assert (kind, name) == (K.TIMING, "block") and 0 <= ms < 60_000
    assert records[-1] == (K.ALLOCATOR, 0, [1, 2, 3])
    assert ch.step == 5
    for kind, name, value in records:  # everything a well-behaved trainer sends is valid
        assert wire.record_problem(kind, name, value) is None
    assert ch.pending() == 0 and ch.dropped == {}


def test_timer_records_even_when_the_block_raises() -> None:
    ch = make()
    with pytest.raises(KeyError), ch.timer("failing"):
        raise KeyError("boom")
    ((kind, name, ms),) = ch.drain()
    assert (kind, name) == (K.TIMING, "failing") and ms >= 0
    assert isinstance(ch.timer("x"), Timer)


def test_a_timer_is_queued_as_its_own_record_in_the_wire_form_of_a_timing() -> None:
    """The finished timer itself is the queued record: it encodes exactly as the tuple
    ``timing`` queues, and its value is the block's duration in ms."""
    ch = make()
    before = time.perf_counter()
    with ch.timer("block"):
        time.sleep(0.02)
    elapsed_ms = (time.perf_counter() - before) * 1e3
    (record,) = ch.drain()
    kind, name, ms = record
    assert 20 <= ms <= elapsed_ms
    assert msgspec.msgpack.encode([record]) == msgspec.msgpack.encode([(kind, name, ms)])
    assert wire.record_problem(kind, name, ms) is None


def test_a_timer_entered_again_records_once_and_counts_the_second_use() -> None:
    ch = make()
    before = time.perf_counter()
    t = ch.timer("reused")
    with t:
        pass
    first_ms = (time.perf_counter() - before) * 1e3
    with t:  # the clock was read by timer(): a second block has no start of its own
        time.sleep(0.01)
    ((_, name, ms),) = ch.drain()
    assert name == "reused" and ms <= first_ms  # the first block's time, not the second's
    assert ch.dropped == {"bad_argument": 1}


def test_bound_overflow_is_counted_not_queued() -> None:
    ch = make(cap=10)
    for i in range(25):
        ch.gauge("g", float(i))
    ch.scalar("s", 1.0)
    with ch.timer("t"):
        pass
    for i in range(12):  # publish snapshots have their own bound
        ch.publish(i, {"a": 1.0})
    assert ch.pending() == 20
    assert len(ch.drain()) == 20
    assert ch.dropped == {"buffer_full": 19}
    ch.gauge("g", 1.0)  # room again
    assert ch.pending() == 1


@pytest.mark.parametrize("profile", [None, [("a", 1.0)], "ab", 3, object()])
def test_non_mapping_profile_is_counted_as_bad_argument(profile: object) -> None:
    ch = make()
    ch.publish(1, profile)  # type: ignore[arg-type]
    assert ch.pending() == 0
    assert ch.dropped == {"bad_argument": 1}
    assert ch.step is None


def test_bad_values_are_forwarded_for_the_daemon_to_reject() -> None:
    """Default (production) mode: no validation on the hot path. The record goes out as is and
    the daemon drops and counts it by reason; ``wire.record_problem`` names that reason."""
    ch = make()
    huge = "x" * 1000
    calls = [
        (ch.timing, "t", math.nan, "invalid_value"),
        (ch.timing, "t", -1.0, "invalid_value"),
        (ch.gauge, "g", math.inf, "invalid_value"),
        (ch.gauge, "g", "12", "invalid_value"),
        (ch.gauge, "g", None, "invalid_value"),
        (ch.gauge, "g", True, "invalid_value"),
        (ch.count, "c", -3, "invalid_value"),
        (ch.category, "c", 1.5, "invalid_value"),
        (ch.gauge, huge, 1.0, "bad_name"),
        (ch.gauge, "", 1.0, "bad_name"),
        (ch.gauge, "a\nb", 1.0, "bad_name"),
        (ch.gauge, None, 1.0, "bad_name"),
        (ch.timing, 42, 1.0, "bad_name"),
    ]
    for fn, name, value, _ in calls:
        fn(name, value)
    records = ch.drain()
    assert [wire.record_problem(*r) for r in records] == [reason for *_, reason in calls]
    assert ch.dropped == {}


def test_scalar_bad_arguments_never_raise() -> None:
    torch = pytest.importorskip("torch")
    ch = make()
    ch.scalar("s", torch.ones(3))  # not one element
    ch.scalar("s", torch.empty(1, device="meta"))  # not readable on the host
    ch.scalar("s", types.SimpleNamespace(item=lambda: 1 / 0))
    assert ch.dropped == {"bad_argument": 3}
    ch.scalar("s", torch.tensor([2.5], dtype=torch.bfloat16))
    ch.scalar("s", np.float32(0.5))
    assert ch.drain() == [(K.SCALAR, "s", 2.5), (K.SCALAR, "s", 0.5)]


def test_cuda_like_scalar_without_torch_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA-looking object while torch is not imported: the resolver cannot exist."""
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr("trainer_shim.cuda_scalar._resolver", None)
    ch = make()
    ch.scalar("loss", types.SimpleNamespace(is_cuda=True, numel=lambda: 1))
    assert ch.dropped == {"bad_argument": 1} and ch.pending() == 0


# -- strict mode -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda ch: ch.timing("t", math.nan), ValueError),
        (lambda ch: ch.timing("t", math.inf), ValueError),
        (lambda ch: ch.timing("t", -1), ValueError),
        (lambda ch: ch.timing("t", "1"), TypeError),
        (lambda ch: ch.timing("t", None), TypeError),
        (lambda ch: ch.gauge("g", True), TypeError),
        (lambda ch: ch.gauge("g", -math.inf), ValueError),
        (lambda ch: ch.count("c", -1), ValueError),
        (lambda ch: ch.gauge("x" * (wire.MAX_NAME_BYTES + 1), 1.0), ValueError),
        (lambda ch: ch.gauge("", 1.0), ValueError),
        (lambda ch: ch.gauge("tab\there", 1.0), ValueError),
        (lambda ch: ch.gauge(None, 1.0), TypeError),
        (lambda ch: ch.gauge(b"bytes", 1.0), TypeError),
        (lambda ch: ch.category("c", 1.5), TypeError),
        (lambda ch: ch.category("c", ""), ValueError),
        (lambda ch: ch.category("c", "k" * 65), ValueError),
        (lambda ch: ch.publish(1, None), TypeError),
        (lambda ch: ch.publish(1, [("a", 1.0)]), TypeError),
        (lambda ch: ch.publish("1", {}), TypeError),
        (lambda ch: ch.publish(-1, {}), ValueError),
        (lambda ch: ch.publish(1, {"a": math.nan}), ValueError),
        (lambda ch: ch.publish(1, {"a": "x"}), TypeError),
        (lambda ch: ch.publish(1, {3: 1.0}), TypeError),
        (lambda ch: ch.timer(None), TypeError),
        (lambda ch: ch.scalar("s", "x"), TypeError),
        (lambda ch: ch.scalar("s", math.nan), ValueError),
        (lambda ch: ch.scalar(1, 1.0), TypeError),
    ],
)
def test_strict_mode_raises_at_the_call_site(call, error) -> None:  # type: ignore[no-untyped-def]
    ch = make(strict=True)
    with pytest.raises(error, match="telemetry"):
        call(ch)
    assert ch.pending() == 0 and ch.dropped == {}


def test_strict_mode_accepts_what_production_sends_correctly() -> None:
    ch = make(strict=True)
    ch.timing("t", 0)
    ch.timing("t", np.float32(1.5))
    ch.count("c", np.int64(3))
    ch.gauge("g", -2.5)
    ch.category("c", np.int64(4))
    ch.category("c", "bucket-3")
    ch.publish(np.int64(7), {"a_ms": 1.0, "b": np.float64(2.0), "c": 3})
    ch.scalar("s", 2.0)
    with ch.timer("t"):
        pass
    assert ch.pending() == 9


def test_strict_mode_checks_tensors() -> None:
    torch = pytest.importorskip("torch")
    ch = make(strict=True)
    with pytest.raises(ValueError, match="3 elements"):
        ch.scalar("s", torch.ones(3))
    with pytest.raises(ValueError, match="finite"):
        ch.scalar("s", torch.tensor(math.nan))
    with pytest.raises(TypeError, match=r"telemetry\.scalar"):
        ch.gauge("g", torch.tensor(1.0))
    ch.scalar("s", torch.tensor(1.0))
    assert ch.drain() == [(K.SCALAR, "s", 1.0)]


@pytest.mark.parametrize("value, expected", [("1", True), ("true", True), ("ON", True),
                                             ("", False), ("0", False), ("no", False)])
def test_strict_from_env(value: str, expected: bool) -> None:
    assert strict_from_env({"DFLASH_TELEMETRY_STRICT": value}) is expected


# -- what the flusher does to values the hot path let through ---------------------------------------


def test_encode_hook_converts_numbers_and_never_touches_cuda() -> None:
    torch = pytest.importorskip("torch")
    assert _coerce(np.float32(1.5)) == 1.5 and type(_coerce(np.float32(1.5))) is float
    assert _coerce(np.int64(7)) == 7 and type(_coerce(np.int64(7))) is int
    assert _coerce(torch.tensor(2.5)) == 2.5
    assert _coerce(torch.tensor([3])) == 3.0
    assert _coerce(object()) is None
    assert _coerce(torch.ones(2)) is None

    class FakeCuda:
        is_cuda = True

        def __float__(self) -> float:
            raise AssertionError("a CUDA value must never be read (it would synchronize)")

    assert _coerce(FakeCuda()) is None
    assert _coerce(torch.empty(1, device="meta")) is None


@pytest.mark.parametrize("step, expected", [(5, 5), (np.int64(6), 6), (None, None), ("7", None),
                                            (-1, None), (2**64, None), (True, None), (1.5, None)])
def test_batch_header_step_is_always_encodable(step: object, expected: int | None) -> None:
    assert _header_step(step) == expected


# -- module API --------------------------------------------------------------------------------------


@pytest.fixture
def fresh_telemetry(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Iterator[types.ModuleType]:  # type: ignore[no-untyped-def]
    """A freshly loaded ``telemetry`` module whose default publisher goes nowhere."""
    for var in ("DFLASH_ROLE", "RANK", "LOCAL_RANK", "DFLASH_TELEMETRY_STRICT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DFLASH_SIDECAR_ENDPOINT", f"ipc://{tmp_path}/nobody.sock")
    module = importlib.reload(telemetry)
    yield module
    module.close()
    importlib.reload(telemetry)


def test_module_functions_are_stable_and_feed_the_default_channel(
    fresh_telemetry: types.ModuleType,
) -> None:
    """The module's functions never change identity (torch.compile guards on it) and append to
    the default channel's queue, created by the first call."""
    tm = fresh_telemetry
    before = {name: getattr(tm, name) for name in
              ("publish", "timing", "count", "gauge", "category", "timer", "scalar")}
    tm.timing("step_ms", 1.0)
    ch = tm.channel()
    tm.count("n", 2)
    tm.gauge("g", 3.0)
    tm.category("c", "k")
    tm.publish(4, {"x": 1.0})
    tm.scalar("s", 5.0)
    with tm.timer("t"):
        pass
    assert {name: getattr(tm, name) for name in before} == before
    records = ch.drain()
    assert [tuple(r)[:2] for r in records] == [(6, 4), (1, "step_ms"), (2, "n"), (3, "g"), (4, "c"),
                                         (5, "s"), (1, "t")]
    assert ch.step == 4 and (ch.role, ch.worker) == ("trainer", threading.current_thread().name)
    tm.publish(5, None)  # type: ignore[arg-type]
    assert ch.dropped == {"bad_argument": 1}


def test_a_timer_open_across_configure_is_recorded_by_the_new_default_channel(
    fresh_telemetry: types.ModuleType, tmp_path: Path,
) -> None:
    """``telemetry.timer`` queues where ``timing`` would when the block ends: a block open while
    ``configure()`` replaces the default channel is the new channel's record, not one left in
    the closed channel's queue, sent by nobody and counted nowhere."""
    tm = fresh_telemetry
    tm.count("warm")
    with tm.timer("straddle"):
        new = tm.configure(endpoint=f"ipc://{tmp_path}/other.sock")
    assert [tuple(r)[:2] for r in new.drain()] == [(K.TIMING, "straddle")]


def test_configure_overrides_environment(fresh_telemetry: types.ModuleType,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_ROLE", "drafter")
    monkeypatch.setenv("RANK", "3")
    tm = fresh_telemetry
    tm.count("x")
    ch = tm.channel()
    assert (ch.role, ch.worker) == ("drafter", "3")
    ch2 = tm.configure(role="target", worker="w7", devices=[2], strict=True)
    assert (ch2.role, ch2.worker, ch2.devices) == ("target", "w7", [2])
    assert isinstance(ch2, StrictChannel)
    with pytest.raises(ValueError):
        tm.gauge("g", float("nan"))  # the module's functions now go through the strict channel
    tm.gauge("g", 1.0)
    assert ch2.pending() == 1
    assert tm.channel(worker="other").role == "target"
    with pytest.raises(ValueError):
        tm.configure(flush_interval_s=0)


def test_first_calls_from_many_threads_make_one_default_channel(
    fresh_telemetry: types.ModuleType,
) -> None:
    tm = fresh_telemetry
    barrier = threading.Barrier(8)

    def first_call() -> None:
        barrier.wait()
        tm.count("started")

    threads = [threading.Thread(target=first_call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = tm.stats()
    assert len(stats) == 1
    (only,) = stats.values()
    assert only["pending"] + only["records_total"] + sum(only["dropped"].values()) == 8


def test_worker_and_devices_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert env_worker({"RANK": "2", "LOCAL_RANK": "1"}) == "2"
    assert env_worker({"LOCAL_RANK": "1"}) == "1"
    assert env_worker({}) == threading.current_thread().name
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert telemetry._env_devices() == [5]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert telemetry._env_devices() == [1]


def test_endpoint_resolution(tmp_path: Path) -> None:
    # the full table of cases, daemon beside shim, is tests/test_endpoint_rule.py
    absent = str(tmp_path / "no-system-dir")
    assert endpoint.shim_endpoint({"DFLASH_SIDECAR_ENDPOINT": "tcp://127.0.0.1:5"}, absent) == "tcp://127.0.0.1:5"
    assert endpoint.daemon_endpoint({"RUNTIME_DIRECTORY": "/run/x:/run/y"}) == "ipc:///run/x/sidecar.sock"
    env = {"XDG_RUNTIME_DIR": "/run/user/7"}
    assert endpoint.shim_endpoint(env, absent) == "ipc:///run/user/7/dflash-sidecar/sidecar.sock"
    assert endpoint.daemon_endpoint(env) == "ipc:///run/user/7/dflash-sidecar/sidecar.sock"


# -- allocator sampler and W&B info with fakes ------------------------------------------------------


class _Sink:
    def __init__(self) -> None:
        self.samples: list[tuple[int, int, int, int]] = []

    def append_allocator(self, device: int, allocated: int, reserved: int, max_reserved: int) -> None:
        self.samples.append((device, allocated, reserved, max_reserved))


def _fake_torch(initialized: bool) -> types.ModuleType:
    calls: list[str] = []
    reserved = {0: 4096, 1: 0, 2: 8192}

    def record(name, result):  # type: ignore[no-untyped-def]
        def fn(*args):  # type: ignore[no-untyped-def]
            calls.append(name)
            return result(*args)
        return fn

    cuda = types.SimpleNamespace(
        is_initialized=record("is_initialized", lambda: initialized),
        device_count=record("device_count", lambda: 3),
        memory_reserved=record("memory_reserved", lambda d: reserved[d]),
        memory_allocated=record("memory_allocated", lambda d: reserved[d] // 2),
        max_memory_reserved=record("max_memory_reserved", lambda d: reserved[d] * 2),
        synchronize=lambda *a: pytest.fail("the sampler must never synchronize"),
        init=lambda: pytest.fail("the sampler must never initialize CUDA"),
    )
    torch = types.ModuleType("torch")
    torch.cuda = cuda  # type: ignore[attr-defined]
    torch.calls = calls  # type: ignore[attr-defined]
    return torch


def test_allocator_sampler_reads_host_counters(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_torch(initialized=True)
    monkeypatch.setitem(sys.modules, "torch", fake)
    sampler = AllocatorSampler(5.0)
    assert sampler.due(100.0)
    sink = _Sink()
    assert sampler.sample(sink, now=100.0) == 2
    assert sink.samples == [(0, 2048, 4096, 8192), (2, 4096, 8192, 16384)]  # device 1 unused
    assert not sampler.due(104.9) and sampler.due(105.0)
    assert set(fake.calls) <= {"is_initialized", "device_count", "memory_reserved",  # type: ignore[attr-defined]
                               "memory_allocated", "max_memory_reserved"}


def test_allocator_sampler_never_initializes_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(initialized=False))
    sink = _Sink()
    assert AllocatorSampler(1.0).sample(sink, now=0.0) == 0 and sink.samples == []
    monkeypatch.delitem(sys.modules, "torch")
    assert AllocatorSampler(1.0).sample(sink, now=0.0) == 0
    assert not AllocatorSampler(0).due(1e9)  # 0 disables


def _fake_wandb(run: object) -> types.ModuleType:
    wandb = types.ModuleType("wandb")
    wandb.run = run  # type: ignore[attr-defined]
    return wandb


def test_wandb_info(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    assert wandb_run_info() == ()
    monkeypatch.setitem(sys.modules, "wandb", _fake_wandb(None))
    assert wandb_run_info() == ()
    run = types.SimpleNamespace(id="abc123", project="dflash", entity="team",
                                settings=types.SimpleNamespace(mode="shared", x_primary=True))
    monkeypatch.setitem(sys.modules, "wandb", _fake_wandb(run))
    assert wandb_run_info() == ("abc123", "dflash", "team", "shared", True)
    odd = types.SimpleNamespace(id=12, project=None, entity=object(),
                                settings=types.SimpleNamespace(mode=3, x_primary="yes"))
    monkeypatch.setitem(sys.modules, "wandb", _fake_wandb(odd))
    assert wandb_run_info() == (None, None, None, None, None)

    class Finished:
        @property
        def id(self) -> str:
            raise RuntimeError("run finished")

        settings = None

    monkeypatch.setitem(sys.modules, "wandb", _fake_wandb(Finished()))
    assert wandb_run_info() == ()


def test_publisher_rejects_impossible_settings_only() -> None:
    with pytest.raises(ValueError):
        Publisher("ipc:///nowhere", flush_interval_s=0)
    with pytest.raises(ValueError):
        Publisher("ipc:///nowhere", max_pending=0)
    Publisher("not an endpoint").close()  # a bad endpoint is a run-time, counted problem


def test_queued_records_are_not_tracked_by_the_garbage_collector() -> None:
    """A backlog of GC-tracked containers makes every collection in the trainer slower and,
    surviving into older generations, triggers full collections; numbers stay untracked."""
    import gc

    ch = make(cap=10_000)
    for i in range(100):
        ch.publish(i, {"forward_ms": 1.0, "loss": 0.5})
    gc.collect()
    assert not any(gc.is_tracked(snapshot) for snapshot in ch._pq)
    assert ch.drain()[0] == (K.PROFILE, 0, {"forward_ms": 1.0, "loss": 0.5})


def test_the_framework_callbacks_loss_never_raises_in_strict_mode() -> None:
    # The callbacks hand a CPU loss tensor on as a gauge; a strict channel refuses a tensor gauge
    # at the call site, which must not reach the trainer from the shim's own integration.
    import torch

    from trainer_shim.integrations._steps import StepClock

    for strict in (False, True):
        ch = make(strict=strict)
        StepClock(ch).scalar("loss", torch.tensor(1.5))
        assert ch.pending() == 1 and ch.dropped == {}
