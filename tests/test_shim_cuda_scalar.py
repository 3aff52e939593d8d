"""The zero-sync scalar path: stream logic against a fake CUDA backend, and CPU tensors for real.

The fake implements ``cuda_scalar.CudaBackend`` and fake tensors, slots and events that write to
one shared log, so the tests check the order of operations the GPU would see: ``record_stream`` on
the current stream before the copy, a ``non_blocking`` copy into a pinned slot, the event recorded
after the copy on the same stream, the value read only once ``event.query()`` is True, and the
slot and event reused only after that. Nothing may ever call a synchronizing method.
"""

from __future__ import annotations

import pytest

from tests.fake_cuda import FakeBackend, FakeCudaTensor, FakeStream
from trainer_shim import cuda_scalar
from trainer_shim.channel import Channel
from trainer_shim.cuda_scalar import ScalarResolver
from trainer_shim.wire import RecordKind


def channel() -> Channel:
    return Channel("trainer", "0", 1000, [])


def test_copy_is_ordered_on_the_current_stream_and_published_after_the_event() -> None:
    backend = FakeBackend()
    resolver = ScalarResolver(backend, autostart=False)
    ch = channel()
    src = FakeCudaTensor(backend.log, 2.5)
    resolver.submit(ch, "loss", src)
    assert backend.log.names() == ["pinned_slot", "current_stream", "src.record_stream",
                                   "slot.copy_", "new_event", "event.record"]
    assert backend.log[2] == ("src.record_stream", backend.stream)
    assert backend.log[3][3] is True  # non_blocking
    assert backend.log[5][2] is backend.stream  # event on the stream of the copy
    assert resolver._in_flight[0].src is src  # the source stays referenced until the copy ran

    backend.log.clear()
    assert resolver.resolve_ready() == 0  # copy not done: nothing read, nothing published
    assert backend.log.names() == ["event.query"]
    assert ch.pending() == 0 and resolver.in_flight() == 1

    resolver._in_flight[0].event.done = True
    backend.log.clear()
    assert resolver.resolve_ready() == 1
    assert backend.log.names() == ["event.query", "slot.item", "release_slot", "release_event"]
    assert ch.drain() == [(RecordKind.SCALAR, "loss", 2.5)]
    assert resolver.in_flight() == 0 and ch.dropped == {}


def test_slots_and_events_are_reused_only_after_completion() -> None:
    backend = FakeBackend(slots=2)
    resolver = ScalarResolver(backend, autostart=False)
    ch = channel()
    resolver.submit(ch, "a", FakeCudaTensor(backend.log, 1.0))
    resolver.submit(ch, "b", FakeCudaTensor(backend.log, 2.0))
    first, second = list(resolver._in_flight)
    assert first.slot is not second.slot and first.event is not second.event
    resolver.submit(ch, "c", FakeCudaTensor(backend.log, 3.0))  # both slots busy
    assert ch.dropped == {"scalar_backlog": 1}

    second.event.done = True  # completes out of order (another stream)
    assert resolver.resolve_ready() == 1
    resolver.submit(ch, "d", FakeCudaTensor(backend.log, 4.0))
    third = resolver._in_flight[-1]
    assert third.slot is second.slot and third.event is second.event  # recycled after completion
    assert third.slot is not first.slot and third.event is not first.event  # still in flight
    first.event.done = third.event.done = True
    assert resolver.resolve_ready() == 2
    assert sorted(r[1:] for r in ch.drain()) == [("a", 1.0), ("b", 2.0), ("d", 4.0)]


def test_backlog_bound_counts_and_enqueues_nothing() -> None:
    backend = FakeBackend(slots=10)
    resolver = ScalarResolver(backend, max_in_flight=3, autostart=False)
    ch = channel()
    for i in range(5):
        resolver.submit(ch, "x", FakeCudaTensor(backend.log, float(i)))
    assert resolver.in_flight() == 3
    assert ch.dropped == {"scalar_backlog": 2}
    assert backend.log.names().count("slot.copy_") == 3


def test_graph_capture_drops_without_touching_the_stream() -> None:
    backend = FakeBackend(capturing=True)
    resolver = ScalarResolver(backend, autostart=False)
    ch = channel()
    resolver.submit(ch, "loss", FakeCudaTensor(backend.log, 1.0))
    assert ch.dropped == {"graph_capture": 1}
    assert backend.log == [] and resolver.in_flight() == 0


def test_wrong_shape_is_a_bad_argument() -> None:
    backend = FakeBackend()
    resolver = ScalarResolver(backend, autostart=False)
    ch = channel()
    resolver.submit(ch, "x", FakeCudaTensor(backend.log, 1.0, numel=4))
    assert ch.dropped == {"bad_argument": 1} and backend.log == []


def test_failure_while_enqueueing_is_counted_and_the_slot_never_reused() -> None:
    backend = FakeBackend(slots=1)
    resolver = ScalarResolver(backend, autostart=False)
    ch = channel()

    class Broken(FakeCudaTensor):
        def record_stream(self, stream: FakeStream) -> None:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    resolver.submit(ch, "x", Broken(backend.log, 1.0))
    assert ch.dropped == {"scalar_error": 1}
    assert resolver.in_flight() == 0 and backend.free_slots == []


def test_event_error_is_counted_and_resolution_goes_on() -> None:
    backend = FakeBackend()
    resolver = ScalarResolver(backend, autostart=False)
    ch = channel()
    resolver.submit(ch, "bad", FakeCudaTensor(backend.log, 1.0))
    resolver.submit(ch, "good", FakeCudaTensor(backend.log, 2.0))
    bad, good = list(resolver._in_flight)

    def broken_query() -> bool:
        raise RuntimeError("CUDA error")

    bad.event.query = broken_query  # type: ignore[method-assign]
    good.event.done = True
    assert resolver.resolve_ready() == 1
    assert ch.drain() == [(RecordKind.SCALAR, "good", 2.0)]
    assert ch.dropped == {"scalar_error": 1} and resolver.in_flight() == 0


def test_abandon_pending_counts_only_the_given_channels() -> None:
    backend = FakeBackend()
    resolver = ScalarResolver(backend, autostart=False)
    mine, other = channel(), channel()
    resolver.submit(mine, "a", FakeCudaTensor(backend.log, 1.0))
    resolver.submit(other, "b", FakeCudaTensor(backend.log, 2.0))
    assert resolver.abandon_pending({mine}) == 1
    assert mine.dropped == {"scalar_unresolved": 1} and other.dropped == {}
    assert resolver.in_flight() == 1


def test_channel_scalar_goes_through_the_resolver_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end through ``Channel.scalar`` with the resolver's own polling thread."""
    from tests.shim_helpers import wait_until

    backend = FakeBackend()
    resolver = ScalarResolver(backend)
    monkeypatch.setattr(cuda_scalar, "_resolver", resolver)
    ch = channel()
    src = FakeCudaTensor(backend.log, 0.125)
    ch.scalar("grad_norm", src)
    assert ch.pending() == 0  # nothing until the copy completes
    wait_until(lambda: backend.log.names().count("event.query") >= 2)
    assert ch.pending() == 0
    backend.events[0].done = True  # (the resolver thread may hold the item right now)
    wait_until(lambda: ch.pending() == 1)
    assert ch.drain() == [(RecordKind.SCALAR, "grad_norm", 0.125)]


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


def test_torch_backend_pools_on_cpu_build() -> None:
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
    import types

    class Event:
        pass

    fake = types.ModuleType("torch")
    fake.cuda = types.SimpleNamespace(Event=Event)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake)
    backend = cuda_scalar.TorchBackend()
    s0, s1 = types.SimpleNamespace(device="cuda:0"), types.SimpleNamespace(device="cuda:1")
    e0, e1 = backend.new_event(s0), backend.new_event(s1)
    assert e0 is not e1
    backend.release_event(e0)
    backend.release_event(e1)
    assert backend.new_event(s1) is e1 and backend.new_event(s0) is e0
    assert backend.new_event(s0) not in (e0, e1)  # pool empty again: a new one
