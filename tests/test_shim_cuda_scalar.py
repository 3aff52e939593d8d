"""The zero-sync scalar path: stream logic against a fake CUDA backend, and CPU tensors for real.

The fake implements ``cuda_scalar.CudaBackend`` and fake tensors, slots, streams and events that
write every operation, with its thread, to one shared log, so the tests check the order of
operations the GPU would see: on the caller's thread only a ``non_blocking`` copy into a pinned
slot on the current stream (no kernel, no event, no sync); on the resolver's turn one event per
stream after that turn's copies, the oldest batch of each stream queried, values read only once
``event.query()`` is True, and slots and events reused only after that.
"""

from __future__ import annotations

import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

from tests.fake_cuda import FakeBackend, FakeCudaTensor, FakeStream
from tests.shim_helpers import wait_until
from trainer_shim import cuda_scalar
from trainer_shim.channel import Channel
from trainer_shim.cuda_scalar import ScalarResolver
from trainer_shim.wire import RecordKind

CALLER_OPS = {"capturing", "current_stream", "pinned_slot", "slot.copy_"}
"""Everything the trainer's thread may do for a CUDA scalar once the set-up is done."""


def channel() -> Channel:
    return Channel("trainer", "0", 1000, [])


def ready(backend: FakeBackend, **kw: Any) -> ScalarResolver:
    resolver = ScalarResolver(backend, autostart=False, **kw)
    resolver.setup("cuda:0")
    backend.log.clear()
    return resolver


def test_copy_on_the_current_stream_and_one_event_per_turn_after_it() -> None:
    backend = FakeBackend()
    resolver = ready(backend)
    ch = channel()
    src = FakeCudaTensor(backend.log, 2.5)
    resolver.submit(ch, "loss", src)
    resolver.submit(ch, "grad_norm", FakeCudaTensor(backend.log, 0.5))
    assert backend.log.names() == ["capturing", "current_stream", "pinned_slot", "slot.copy_"] * 2
    assert all(entry[3] is True for entry in backend.log if entry[0] == "slot.copy_")  # non_blocking
    assert resolver._open[backend.stream][0][3] is src  # the source stays referenced until the copy ran

    backend.log.clear()
    assert resolver.resolve_ready() == 0  # one event after both copies, on their stream; not done
    assert backend.log.names() == ["new_event", "event.record", "event.query"]
    assert backend.log[1][2] is backend.stream
    assert ch.pending() == 0 and resolver.in_flight() == 2

    backend.complete()
    backend.log.clear()
    assert resolver.resolve_ready() == 2
    assert backend.log.names() == ["event.query", "slot.item", "release_slot", "slot.item", "release_slot",
                                   "release_event"]
    assert ch.drain() == [(RecordKind.SCALAR, "loss", 2.5), (RecordKind.SCALAR, "grad_norm", 0.5)]
    assert resolver.in_flight() == 0 and ch.dropped == {}


def test_a_turn_queries_only_the_oldest_batch_of_a_stream() -> None:
    """Events on one stream complete in order: however many are in flight, one query a turn."""
    backend = FakeBackend(slots=64)
    resolver = ready(backend)
    ch = channel()
    for turn in range(10):
        for i in range(5):
            resolver.submit(ch, "x", FakeCudaTensor(backend.log, float(turn * 5 + i)))
        backend.log.clear()
        resolver.resolve_ready()
        assert backend.log.names() == ["new_event", "event.record", "event.query"]
    assert resolver.in_flight() == 50 and ch.pending() == 0
    backend.log.clear()
    backend.complete()
    assert resolver.resolve_ready() == 50
    assert backend.log.names().count("event.query") == 10  # each completed batch once
    assert [r[2] for r in ch.drain()] == [float(i) for i in range(50)]  # call order within a stream


def test_slots_and_events_are_reused_only_after_completion() -> None:
    backend = FakeBackend(slots=2)
    resolver = ready(backend)
    ch = channel()
    resolver.submit(ch, "a", FakeCudaTensor(backend.log, 1.0))
    resolver.resolve_ready()
    resolver.submit(ch, "b", FakeCudaTensor(backend.log, 2.0))
    resolver.resolve_ready()
    first, second = resolver._closed[backend.stream]
    assert first.items[0][2] is not second.items[0][2] and first.event is not second.event
    resolver.submit(ch, "c", FakeCudaTensor(backend.log, 3.0))  # both slots busy
    assert ch.dropped == {"scalar_backlog": 1}

    first.event.done = True
    assert resolver.resolve_ready() == 1
    resolver.submit(ch, "d", FakeCudaTensor(backend.log, 4.0))
    resolver.resolve_ready()
    third = resolver._closed[backend.stream][-1]
    assert third.items[0][2] is first.items[0][2] and third.event is first.event  # recycled after completion
    assert third.items[0][2] is not second.items[0][2] and third.event is not second.event  # still in flight
    backend.complete()
    assert resolver.resolve_ready() == 2
    assert [r[1:] for r in ch.drain()] == [("a", 1.0), ("b", 2.0), ("d", 4.0)]


def test_backlog_bound_counts_and_enqueues_nothing() -> None:
    backend = FakeBackend(slots=10)
    resolver = ready(backend, max_in_flight=3)
    ch = channel()
    for i in range(5):
        resolver.submit(ch, "x", FakeCudaTensor(backend.log, float(i)))
    assert resolver.in_flight() == 3
    assert ch.dropped == {"scalar_backlog": 2}
    assert backend.log.names().count("slot.copy_") == 3


def test_graph_capture_drops_without_touching_the_stream() -> None:
    backend = FakeBackend(capturing=True)
    resolver = ready(backend)
    ch = channel()
    resolver.submit(ch, "loss", FakeCudaTensor(backend.log, 1.0))
    assert ch.dropped == {"graph_capture": 1}
    assert backend.log.names() == ["capturing"] and resolver.in_flight() == 0


def test_wrong_shape_is_a_bad_argument() -> None:
    backend = FakeBackend()
    resolver = ready(backend)
    ch = channel()
    resolver.submit(ch, "x", FakeCudaTensor(backend.log, 1.0, numel=4))
    assert ch.dropped == {"bad_argument": 1} and backend.log == []


def test_failure_while_enqueueing_is_counted_and_the_slot_never_reused() -> None:
    backend = FakeBackend(slots=1)
    resolver = ready(backend)
    ch = channel()
    backend.free_slots[0].copy_ = lambda *a, **k: 1 / 0  # type: ignore[method-assign,assignment]
    resolver.submit(ch, "x", FakeCudaTensor(backend.log, 1.0))
    assert ch.dropped == {"scalar_error": 1}
    assert resolver.in_flight() == 0 and backend.free_slots == []


def test_event_error_is_counted_and_resolution_goes_on() -> None:
    backend = FakeBackend()
    resolver = ready(backend)
    ch = channel()
    resolver.submit(ch, "bad", FakeCudaTensor(backend.log, 1.0))
    resolver.resolve_ready()
    resolver.submit(ch, "good", FakeCudaTensor(backend.log, 2.0))
    resolver.resolve_ready()
    bad, good = resolver._closed[backend.stream]

    def broken_query() -> bool:
        raise RuntimeError("CUDA error")

    bad.event.query = broken_query  # type: ignore[method-assign]
    good.event.done = True
    assert resolver.resolve_ready() == 1
    assert ch.drain() == [(RecordKind.SCALAR, "good", 2.0)]
    assert ch.dropped == {"scalar_error": 1} and resolver.in_flight() == 0


def test_abandon_pending_counts_only_the_given_channels() -> None:
    backend = FakeBackend()
    resolver = ready(backend)
    mine, other = channel(), channel()
    resolver.submit(mine, "a", FakeCudaTensor(backend.log, 1.0))
    resolver.submit(other, "b", FakeCudaTensor(backend.log, 2.0))
    resolver.resolve_ready()
    resolver.submit(mine, "c", FakeCudaTensor(backend.log, 3.0))
    assert resolver.abandon_pending({mine}) == 2
    assert mine.dropped == {"scalar_unresolved": 2} and other.dropped == {}
    assert resolver.in_flight() == 1
    backend.complete()
    assert resolver.resolve_ready() == 1 and other.drain() == [(RecordKind.SCALAR, "b", 2.0)]


def test_a_scalar_before_the_set_up_is_held_then_copied_after_its_stream() -> None:
    """Before the set-up the caller's thread enqueues nothing; the set-up then copies on a side
    stream that waits for an event recorded on the caller's stream."""
    backend = FakeBackend()
    resolver = ScalarResolver(backend, autostart=False)
    ch = channel()
    resolver.submit(ch, "first", FakeCudaTensor(backend.log, 7.0))
    assert backend.log.names() == ["capturing", "current_stream"] and resolver.in_flight() == 1
    backend.log.clear()
    resolver.setup("cuda:0")
    assert backend.log.names() == ["setup", "pinned_slot", "new_event", "event.record", "stream.wait_event",
                                   "slot.copy_"]
    assert backend.log[3][2] is backend.stream  # the event follows the caller's stream
    backend.log.clear()
    resolver.resolve_ready()
    assert backend.log[1] == ("event.record", backend.log[0][1], backend.side)  # the batch event: after the copy
    backend.complete()
    assert resolver.resolve_ready() == 1 and ch.drain() == [(RecordKind.SCALAR, "first", 7.0)]


def test_a_failed_set_up_counts_held_and_later_scalars() -> None:
    backend = FakeBackend()
    backend.setup = lambda device: 1 / 0  # type: ignore[method-assign,assignment]
    resolver = ScalarResolver(backend, autostart=False)
    ch = channel()
    resolver.submit(ch, "held", FakeCudaTensor(backend.log, 1.0))
    resolver.setup("cuda:0")
    resolver.submit(ch, "later", FakeCudaTensor(backend.log, 2.0))
    assert ch.dropped == {"scalar_error": 2} and resolver.in_flight() == 0


def test_no_wake_up_per_call_below_the_high_water_mark(monkeypatch: pytest.MonkeyPatch) -> None:
    """The flusher's turns serve ordinary rates; only a backlog wakes the resolver thread."""
    monkeypatch.setattr(cuda_scalar, "HIGH_WATER", 50)
    backend = FakeBackend(slots=100)
    resolver = ready(backend)
    ch = channel()
    for i in range(49):
        resolver.submit(ch, "x", FakeCudaTensor(backend.log, float(i)))
    assert not resolver._wake.is_set()
    resolver.submit(ch, "x", FakeCudaTensor(backend.log, 49.0))
    assert resolver._wake.is_set()  # the 50th in flight wakes it
    resolver._wake.clear()
    resolver._turning = True
    resolver.submit(ch, "x", FakeCudaTensor(backend.log, 50.0))
    assert not resolver._wake.is_set()  # already taking turns: no wake-up per call


def test_the_resolver_thread_takes_turns_only_while_the_backlog_lasts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_scalar, "HIGH_WATER", 8)
    monkeypatch.setattr(cuda_scalar, "LOW_WATER", 2)
    backend = FakeBackend(slots=16)
    resolver = ScalarResolver(backend)
    wait_until(lambda: backend.setups == [None])
    ch = channel()
    for i in range(8):
        resolver.submit(ch, "x", FakeCudaTensor(backend.log, float(i)))
    wait_until(lambda: "event.record" in backend.log.on("trainer-shim-scalars"))
    wait_until(lambda: backend.complete() >= 0 and resolver.in_flight() == 0)
    assert sorted(r[2] for r in ch.drain()) == [float(i) for i in range(8)]
    wait_until(lambda: not resolver._turning)
    backend.log.clear()
    resolver.submit(ch, "y", FakeCudaTensor(backend.log, 9.0))  # one in flight: left to the flusher
    time.sleep(0.1)
    assert backend.log.on("trainer-shim-scalars") == [] and resolver.in_flight() == 1


def test_the_flusher_takes_a_turn_each_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a real publisher: events recorded and queried, values read, on the flusher's thread."""
    from trainer_shim.publisher import Publisher

    backend = FakeBackend()
    resolver = ready(backend)  # no resolver thread
    monkeypatch.setattr(cuda_scalar, "_resolver", resolver)
    pub = Publisher(f"ipc://{tmp_path}/nobody.sock", flush_interval_s=0.01)
    try:
        ch = pub.channel("trainer", "0")
        ch.scalar("loss", FakeCudaTensor(backend.log, 1.5))
        wait_until(lambda: "event.query" in backend.log.on("trainer-shim-flusher"))
        backend.complete()
        wait_until(lambda: resolver.in_flight() == 0)
        assert {"event.record", "event.query", "slot.item"} <= set(backend.log.on("trainer-shim-flusher"))
        assert "scalar_unresolved" not in ch.dropped
    finally:
        pub.close()


def test_the_trainer_thread_issues_only_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """The no-kernel rule, end to end through ``Channel.scalar`` with the resolver's own thread
    taking the turns: on the trainer's thread only stream queries, pinned slots and
    non-blocking copies; events are recorded and queried elsewhere. The fake tensor fails on any
    attribute that would launch a kernel (arithmetic, ``to``, ``clone``, ``float``...)."""
    monkeypatch.setattr(cuda_scalar, "HIGH_WATER", 1)  # every scalar wakes the thread: it takes the turns
    monkeypatch.setattr(cuda_scalar, "LOW_WATER", 1)
    backend = FakeBackend(slots=64)
    resolver = ScalarResolver(backend)
    monkeypatch.setattr(cuda_scalar, "_resolver", resolver)
    wait_until(lambda: backend.setups == [None])
    ch = channel()
    values = [float(i) for i in range(40)]

    def trainer() -> None:
        for v in values:
            ch.scalar("loss", FakeCudaTensor(backend.log, v))

    thread = threading.Thread(target=trainer, name="trainer")
    thread.start()
    thread.join()
    wait_until(lambda: backend.complete() >= 0 and ch.pending() == len(values))
    assert sorted(r[2] for r in ch.drain()) == values and ch.dropped == {}
    assert set(backend.log.on("trainer")) == CALLER_OPS
    resolver_ops = set(backend.log.on("trainer-shim-scalars"))
    assert {"event.record", "event.query", "slot.item"} <= resolver_ops
    assert not resolver_ops & {"slot.copy_", "capturing", "current_stream"}


def test_prepare_sets_up_on_the_resolver_thread_when_cuda_is_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """``configure()`` with CUDA initialised starts the set-up off the caller's thread."""
    from trainer_shim import telemetry

    backend = FakeBackend()
    fake_torch = types.ModuleType("torch")
    fake_torch.cuda = types.SimpleNamespace(is_initialized=lambda: True, current_device=lambda: 3)  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "torch", fake_torch)
    monkeypatch.setattr(cuda_scalar, "TorchBackend", lambda: backend)
    monkeypatch.setattr(cuda_scalar, "_resolver", None)
    try:
        telemetry.configure(endpoint="ipc:///nonexistent/dfs-prepare.sock", role="trainer", worker="0")
        wait_until(lambda: backend.setups == [3])
        assert backend.log.threads == ["trainer-shim-scalars"]
        assert cuda_scalar.current() is not None and cuda_scalar.current().backend is backend  # type: ignore[union-attr]
    finally:
        telemetry.close()


def test_prepare_waits_for_cuda_through_torchs_init_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without torch nothing; before CUDA's initialisation one hook, which starts the resolver
    when CUDA initialises; a CPU-only trainer never gets the thread."""
    monkeypatch.setattr(cuda_scalar, "_resolver", None)
    monkeypatch.setattr(cuda_scalar, "_hooked", False)
    monkeypatch.delitem(__import__("sys").modules, "torch", raising=False)
    assert cuda_scalar.prepare() is False
    hooks: list[Any] = []
    fake_torch = types.ModuleType("torch")
    fake_torch.cuda = types.SimpleNamespace(is_initialized=lambda: False, _lazy_call=hooks.append)  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "torch", fake_torch)
    backend = FakeBackend()
    monkeypatch.setattr(cuda_scalar, "TorchBackend", lambda: backend)
    assert cuda_scalar.prepare() is False and cuda_scalar.prepare() is False
    assert len(hooks) == 1 and cuda_scalar.current() is None
    hooks[0]()  # CUDA initialises
    wait_until(lambda: backend.setups == [None])
    assert backend.log.threads == ["trainer-shim-scalars"]


# -- real torch, CPU -----------------------------------------------------------------------------------


def test_cpu_tensors_are_published_at_once() -> None:
    torch = pytest.importorskip("torch")
    ch = channel()
    loss = torch.tensor(1.75, requires_grad=True) * 2
    ch.scalar("loss", loss)
    ch.scalar("grad_norm", torch.tensor([0.5], dtype=torch.bfloat16))
    ch.scalar("step", torch.tensor(7, dtype=torch.int64))
    assert ch.drain() == [(RecordKind.SCALAR, "loss", 3.5), (RecordKind.SCALAR, "grad_norm", 0.5),
                          (RecordKind.SCALAR, "step", 7)]
    assert ch.dropped == {}


def test_torch_backend_on_cpu_build() -> None:
    """The real backend's pinned pool needs CUDA; on a CPU build only its construction is safe."""
    torch = pytest.importorskip("torch")
    backend = cuda_scalar.TorchBackend()
    assert backend.torch is torch
    if not torch.cuda.is_available():
        pytest.skip("pinned memory and events need CUDA (bench/gpu_check_shim.py covers them)")


def test_torch_backend_pools_events_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """An event is only ever recorded again on a stream of the device it was first used on
    (CUDA refuses to record an event on another device's stream)."""
    import sys

    class Event:
        pass

    fake = types.ModuleType("torch")
    fake.cuda = types.SimpleNamespace(Event=Event)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake)
    backend = cuda_scalar.TorchBackend()
    s0, s1 = FakeStream("s0"), FakeStream("s1")
    s1.device = "cuda:1"
    e0, e1 = backend.new_event(s0), backend.new_event(s1)
    assert e0 is not e1
    backend.release_event(e0)
    backend.release_event(e1)
    assert backend.new_event(s1) is e1 and backend.new_event(s0) is e0
    assert backend.new_event(s0) not in (e0, e1)  # pool empty again: a new one


def test_torch_backend_makes_slots_ahead_and_as_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slot views are made a reserve at a time off the caller's thread (``top_up``), one by the
    caller only when the reserve ran out, none beyond the block."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(cuda_scalar, "SLOT_RESERVE", 2)
    backend = cuda_scalar.TorchBackend()
    pool = backend._pools[torch.float32] = cuda_scalar._Pool(torch.zeros(5))  # pinned memory needs CUDA
    backend.top_up()
    assert pool.made == 2 and len(pool.free) == 2
    taken = [backend.pinned_slot(torch.float32) for _ in range(3)]  # the third made by the caller
    assert pool.made == 3 and all(t is not None and t.dim() == 0 for t in taken)
    backend.top_up()
    assert pool.made == 5
    assert [backend.pinned_slot(torch.float32) is not None for _ in range(3)] == [True, True, False]
    backend.release_slot(taken[0])
    assert backend.pinned_slot(torch.float32) is taken[0]


def test_a_flush_while_the_scalar_module_is_still_importing_keeps_the_flusher(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The flusher looks for the resolver in ``sys.modules``; while another thread is still
    importing ``trainer_shim.cuda_scalar`` the module is there without its functions yet. A flush
    then must neither kill the flusher thread nor count an internal error: the records queued
    meanwhile are still flushed (dropped as ``no_subscriber`` here: nobody listens) and counted."""
    import sys
    import types

    from trainer_shim.publisher import Publisher

    half = types.ModuleType("trainer_shim.cuda_scalar")  # as a module mid-import looks: no `current` yet
    monkeypatch.setitem(sys.modules, "trainer_shim.cuda_scalar", half)
    pub = Publisher(f"ipc://{tmp_path}/nobody.sock", flush_interval_s=0.01)
    try:
        ch = pub.channel("trainer", "0")
        for n in range(3):
            ch.count("n")
            assert pub.flush(wait_s=5.0), f"flush {n}: the flusher is gone"
        assert pub.internal_errors == 0
        assert ch.pending() == 0
    finally:
        pub.close()
