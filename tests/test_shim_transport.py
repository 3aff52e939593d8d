"""The shim against a real receiver process over real ZeroMQ sockets.

Each test runs the shim in this process and ``shim_helpers.py receive`` in a child process, which
binds a SUB socket and writes every frame it gets to a file. The waits are liveness bounds (how
long to wait for something that must happen), never performance thresholds.

Accounting, checked everywhere: for every sender, ``calls == records_total + sum(dropped)`` once
flushed, and a receiver's ``received == records_total - proven missing`` (``SenderBook.consistent``).
"""

from __future__ import annotations

import math
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.shim_helpers import ReceiverProcess, SenderBook, books_of, wait_until
from trainer_shim import __version__, flusher, telemetry, transport, wire
from trainer_shim.publisher import Publisher
from trainer_shim.wire import RecordKind

pytest_plugins = ["tests.shim_fixtures"]

FLUSH_S = 0.02


@pytest.fixture
def publishers() -> Iterator[Callable[..., Publisher]]:
    made: list[Publisher] = []

    def make(endpoint: str, **kwargs: Any) -> Publisher:
        kwargs.setdefault("flush_interval_s", FLUSH_S)
        kwargs.setdefault("allocator_interval_s", 0)
        pub = Publisher(endpoint, **kwargs)
        made.append(pub)
        return pub

    yield make
    for pub in made:
        pub.close()


def accounted(stats: dict[str, Any]) -> int:
    return stats["records_total"] + sum(stats["dropped"].values()) + stats["pending"]


def one_book(rx: ReceiverProcess) -> SenderBook:
    books = books_of(rx.messages())
    assert len(books) == 1, books.keys()
    return next(iter(books.values()))


def received_up_to(rx: ReceiverProcess, sender: int, total: int) -> Callable[[], bool]:
    def check() -> bool:
        book = books_of(rx.messages()).get(sender)
        return book is not None and book.last_total >= total
    return check


def every_kind(ch: Any, i: int) -> int:
    """One call of each kind; returns how many records that is."""
    ch.timing("step_ms", 10.0 + i)
    ch.count("tokens", 4096)
    ch.gauge("queue_depth", float(i % 7))
    ch.category("bucket", i % 4)
    ch.publish(i, {"forward_ms": 1.5, "backward_ms": 3.0, "loss": 0.25})
    ch.scalar("lr", 1e-4)
    with ch.timer("data_wait"):
        pass
    return 7


def test_live_receiver_gets_every_record(ep: str, receivers, publishers) -> None:  # type: ignore[no-untyped-def]
    rx = receivers(ep)
    pub = publishers(ep)
    ch = pub.channel("drafter", "3", devices=[6])
    calls = sum(every_kind(ch, i) for i in range(500))
    assert pub.flush(wait_s=30)
    (stats,) = pub.stats().values()
    assert stats["dropped"] == {} and stats["records_total"] == calls
    wait_until(received_up_to(rx, ch.sender, calls))
    book = one_book(rx)
    assert book.received == calls and book.missing == 0 and book.baseline == 0 and book.consistent()
    assert book.seq_gaps == 0 and (book.role, book.worker) == ("drafter", "3")
    kinds = {rec[0] for rec in book.records}
    assert kinds == {RecordKind.TIMING, RecordKind.COUNT, RecordKind.GAUGE, RecordKind.CATEGORY,
                     RecordKind.PROFILE, RecordKind.SCALAR}
    assert all(wire.record_problem(*rec) is None for rec in book.records)
    hello = book.hellos[0]
    assert hello["role"] == "drafter" and hello["worker"] == "3" and hello["devices"] == [6]
    assert hello["protocol_version"] == wire.PROTOCOL_VERSION == 1


def test_absent_receiver_drops_and_counts(ep: str, publishers) -> None:  # type: ignore[no-untyped-def]
    pub = publishers(ep)
    ch = pub.channel("trainer", "0")
    calls = sum(every_kind(ch, i) for i in range(200))
    assert pub.flush(wait_s=30)
    (stats,) = pub.stats().values()
    assert stats == {**stats, "records_total": 0, "pending": 0, "dropped": {"no_receiver": calls}}
    pub.close()
    calls += every_kind(ch, 0)  # after close: queued, never sent, never raised
    assert accounted(pub.stats()[("trainer", "0")]) == calls


def test_stalled_receiver_from_the_start(ep: str, receivers, publishers,  # type: ignore[no-untyped-def]
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A bound SUB that is never read never subscribes: everything is counted as ``no_receiver``,
    and the count reaches the receiver once it recovers."""
    monkeypatch.setattr(flusher, "HEARTBEAT_S", 0.1)
    rx = receivers(ep, stalled=True)
    pub = publishers(ep)
    ch = pub.channel("trainer", "0")
    before = sum(every_kind(ch, i) for i in range(300))
    assert pub.flush(wait_s=30)
    assert pub.stats()[("trainer", "0")]["dropped"] == {"no_receiver": before}
    rx.resume()
    book = wait_until(lambda: (b := books_of(rx.messages()).get(ch.sender)) and b.batches and b)
    assert book.hellos and book.dropped == {"no_receiver": before}  # the heartbeat tells
    after = sum(every_kind(ch, i) for i in range(100))
    assert pub.flush(wait_s=30)
    wait_until(received_up_to(rx, ch.sender, after))
    book = one_book(rx)
    assert book.received == after == book.last_total and book.consistent()
    assert accounted(pub.stats()[("trainer", "0")]) == before + after


def test_receiver_that_stops_reading(ep: str, receivers, publishers,  # type: ignore[no-untyped-def]
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon that subscribed and then hangs: ZeroMQ drops silently once its queues are full;
    publishing never blocks and the receiver proves every loss from ``records_total``."""
    rx = receivers(ep)
    pub = publishers(ep)
    ch = pub.channel("trainer", "0")
    ch.count("warmup")
    assert pub.flush(wait_s=30)
    wait_until(received_up_to(rx, ch.sender, 1))
    rx.stall()
    monkeypatch.setattr(wire, "MAX_RECORDS_PER_BATCH", 1)  # one message per record: fill the pipe
    calls = 1
    # More messages than the stalled receiver's own queue (RCVHWM 100,000, which its I/O thread
    # keeps filling) plus the shim's send queue and the kernel buffers hold, in rounds that stay
    # under the channel's cap: past that ZeroMQ drops, whatever the machine's speed.
    for _ in range(4):
        for i in range(60_000):
            ch.gauge("g", float(i))
        calls += 60_000
        assert pub.flush(wait_s=60)
    rx.resume()
    monkeypatch.setattr(wire, "MAX_RECORDS_PER_BATCH", 4096)

    def after_arrived() -> bool:
        # While the receiver drains its backlog the shim's queue may still be full, and a record
        # sent then is lost (and counted): send until one arrives behind the backlog.
        nonlocal calls
        ch.count("after")
        calls += 1
        assert pub.flush(wait_s=30)
        return bool(one_book(rx).records[-1] == [RecordKind.COUNT, "after", 1])

    wait_until(after_arrived, timeout_s=60, interval_s=0.2)
    (stats,) = pub.stats().values()
    assert accounted(stats) == calls and stats["dropped"] == {}  # the shim handed everything over
    wait_until(received_up_to(rx, ch.sender, stats["records_total"]))
    book = one_book(rx)
    assert book.consistent() and book.last_total == calls
    assert book.missing > 0 and book.received + book.missing == calls  # lost in transit, counted
    assert book.records[-1] == [RecordKind.COUNT, "after", 1]


def test_receiver_restarted_mid_stream(ep: str, receivers, publishers) -> None:  # type: ignore[no-untyped-def]
    first = receivers(ep, name="first")
    pub = publishers(ep)
    ch = pub.channel("trainer", "0")
    calls = 0
    stop = threading.Event()

    def produce() -> None:
        nonlocal calls
        while not stop.is_set():
            for i in range(50):
                ch.gauge("g", float(i))
            calls += 50
            time.sleep(0.002)

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        wait_until(received_up_to(first, ch.sender, 1000))
        first.kill()  # no goodbye: the shim notices the broken connection
        wait_until(lambda: pub.stats()[("trainer", "0")]["dropped"].get("no_receiver", 0) > 0)
        second = receivers(ep, name="second")
        total_now = pub.stats()[("trainer", "0")]["records_total"]
        wait_until(received_up_to(second, ch.sender, total_now + 1000))
    finally:
        stop.set()
        thread.join()
    pub.close()
    (stats,) = pub.stats().values()
    assert accounted(stats) == calls and stats["pending"] == 0
    wait_until(received_up_to(second, ch.sender, stats["records_total"]))
    a, b = one_book(first), one_book(second)
    assert a.consistent() and b.consistent()
    assert b.hellos, "the restarted receiver is greeted again"
    assert b.last_total == stats["records_total"]  # the last batch reached it at close
    assert a.baseline == 0 and (b.baseline or 0) >= a.last_total
    lost_between = (b.baseline or 0) - a.last_total  # sent into the dying connection
    assert a.received + a.missing + lost_between + b.received + b.missing == stats["records_total"]


def test_many_threads_publishing_at_once(ep: str, receivers, publishers) -> None:  # type: ignore[no-untyped-def]
    rx = receivers(ep)
    pub = publishers(ep)
    shared = pub.channel("drafter", "shared")
    n = 5000
    barrier = threading.Barrier(12)

    def own_channel(k: int) -> None:
        ch = pub.channel("drafter", f"t{k}")
        barrier.wait()
        for i in range(n):
            ch.gauge("seq", i)

    def shared_channel(k: int) -> None:
        barrier.wait()
        for i in range(n):
            shared.category(f"thread{k}", i)

    threads = [threading.Thread(target=own_channel, args=(k,)) for k in range(8)]
    threads += [threading.Thread(target=shared_channel, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pub.flush(wait_s=60)
    stats = pub.stats()
    assert len(stats) == 9
    for key, st in stats.items():
        assert accounted(st) == (4 * n if key[1] == "shared" else n), key
    senders = {pub.channel(*key).sender: key for key in stats}
    wait_until(lambda: all(received_up_to(rx, s, stats[k]["records_total"])() for s, k in senders.items()))
    books = books_of(rx.messages())
    for sender, key in senders.items():
        book = books[sender]
        assert book.consistent() and book.worker == key[1]
        if book.missing == 0 and not stats[key]["dropped"]:
            if key[1] == "shared":
                for k in range(4):  # each thread's records stay in its own order
                    assert [v for _, name, v in book.records if name == f"thread{k}"] == list(range(n))
            else:
                assert [v for *_, v in book.records] == list(range(n))


def test_hello_heartbeats_and_wandb(ep: str, receivers, publishers,  # type: ignore[no-untyped-def]
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flusher, "HEARTBEAT_S", 0.1)
    monkeypatch.setattr(flusher, "HELLO_REFRESH_S", 0.2)
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    rx = receivers(ep)
    pub = publishers(ep)
    ch = pub.channel("target", "1", devices=[0, 1])
    ch.count("start")
    wait_until(lambda: (b := books_of(rx.messages()).get(ch.sender)) and b.batches >= 3 and b.hellos)
    book = one_book(rx)
    hello = book.hellos[0]
    assert hello["pid"] == __import__("os").getpid()
    assert hello["host"] == __import__("socket").gethostname()
    assert (hello["role"], hello["worker"], hello["devices"]) == ("target", "1", [0, 1])
    assert hello["shim_version"] == __version__ and hello["protocol_version"] == 1
    assert hello["thread"] == threading.current_thread().name
    assert abs(hello["started_unix_s"] - time.time()) < 3600
    assert hello["wandb_run_id"] is None
    assert book.received == 1 and book.batches >= 3  # the others are empty heartbeats

    run = types.SimpleNamespace(id="run42", project="dflash", entity="lab",
                                settings=types.SimpleNamespace(mode="shared", x_primary=True))
    wandb = types.ModuleType("wandb")
    wandb.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    book = wait_until(lambda: (b := one_book(rx)) and b.hellos[-1]["wandb_run_id"] == "run42" and b)
    assert {k: book.hellos[-1][k] for k in ("wandb_project", "wandb_entity", "wandb_mode",
                                            "wandb_primary")} == {
        "wandb_project": "dflash", "wandb_entity": "lab", "wandb_mode": "shared",
        "wandb_primary": True}
    wait_until(lambda: len(one_book(rx).hellos) >= 4)  # repeated every HELLO_REFRESH_S
    assert one_book(rx).seq_gaps == 0


def test_bad_arguments_end_to_end(ep: str, receivers, publishers) -> None:  # type: ignore[no-untyped-def]
    """Production mode: nothing raises; what the shim cannot send is counted by the shim, the
    rest reaches the receiver, where ``wire.record_problem`` names the daemon's drop reason."""
    rx = receivers(ep)
    pub = publishers(ep)
    ch = pub.channel("trainer", "0")

    class CudaLike:
        is_cuda = True

        def __float__(self) -> float:
            raise AssertionError("must never be read")

    loop: dict[str, Any] = {}
    loop["self"] = loop
    forwarded = [
        ("timing", "t", math.nan), ("timing", "t", -math.inf), ("gauge", "g", math.inf),
        ("gauge", "g", "fast"), ("gauge", "g", None), ("gauge", "g", CudaLike()),
        ("gauge", "n" * 300, 1.0), ("count", "c", -1), ("category", "c", 2.5),
    ]
    for method, name, value in forwarded:
        getattr(ch, method)(name, value)
    ch.publish("not a step", {"a": 1.0})  # the record goes; the batch header's step stays sane
    ch.publish(3, None)  # type: ignore[arg-type]             -> bad_argument (shim)
    ch.publish(4, loop)  #                                      -> unencodable (shim)
    ch.gauge("big", 2**70)  #                                   -> unencodable (shim)
    ch.gauge("x" * (5 * 1024 * 1024), 1.0)  #                   -> oversized (shim)
    ch.scalar("s", [1.0, 2.0])  #                               forwarded (a list)
    ch.gauge("ok", 1.0)
    calls = len(forwarded) + 7
    assert pub.flush(wait_s=30)
    (stats,) = pub.stats().values()
    assert stats["dropped"] == {"bad_argument": 1, "unencodable": 2, "oversized": 1}
    assert accounted(stats) == calls
    wait_until(received_up_to(rx, ch.sender, stats["records_total"]))
    book = one_book(rx)
    assert book.consistent() and book.received == stats["records_total"] == calls - 4
    problems = [wire.record_problem(*rec) for rec in book.records]
    # profile snapshots first, then the other records in call order
    assert book.records[0] == [RecordKind.PROFILE, "not a step", {"a": 1.0}]
    assert problems == ["invalid_value"] * 7 + ["bad_name"] + ["invalid_value"] * 3 + [None]
    assert book.records[6] == [RecordKind.GAUGE, "g", None]  # the CUDA-like value was never read
    assert book.records[-1] == [RecordKind.GAUGE, "ok", 1.0]


def test_large_batches_are_split_below_the_message_cap(ep: str, receivers, publishers) -> None:  # type: ignore[no-untyped-def]
    rx = receivers(ep)
    pub = publishers(ep, flush_interval_s=1.0)
    ch = pub.channel("trainer", "0")
    name = "n" * 120
    for i in range(3000):  # ~3000 records of ~1.6 kB: one flush would be a ~5 MB frame
        ch.publish(i, {f"{name}{k}": float(k) for k in range(12)})
    assert pub.flush(wait_s=30)
    (stats,) = pub.stats().values()
    assert stats["dropped"] == {} and stats["records_total"] == 3000
    wait_until(received_up_to(rx, ch.sender, 3000))
    book = one_book(rx)
    assert book.received == 3000 and book.missing == 0 and book.batches >= 2


@pytest.mark.parametrize("bad", ["", "nonsense", "tcp://", "ipc://", "tcp://127.0.0.1:notaport",
                                 "udp://127.0.0.1:1", "tcp://no-such-host.invalid:5555"])
def test_malformed_endpoints_never_raise(bad: str, publishers) -> None:  # type: ignore[no-untyped-def]
    pub = publishers(bad)
    ch = pub.channel("trainer", "0")
    calls = sum(every_kind(ch, i) for i in range(20))
    assert pub.flush(wait_s=30)
    pub.close()
    (stats,) = pub.stats().values()
    assert accounted(stats) == calls and stats["records_total"] == 0
    assert set(stats["dropped"]) <= {"transport_error", "no_receiver"}


def test_module_api_with_a_malformed_endpoint_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    monkeypatch.setenv("DFLASH_SIDECAR_ENDPOINT", "definitely not an endpoint")
    tm = importlib.reload(telemetry)
    try:
        for i in range(10):
            every_kind(tm, i)
        assert tm.flush(wait_s=30)
        (stats,) = tm.stats().values()
        assert stats["dropped"] == {"transport_error": 70}
    finally:
        tm.close()
        importlib.reload(telemetry)


def test_unexpected_transport_failure_is_counted(ep: str, receivers, publishers,  # type: ignore[no-untyped-def]
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    rx = receivers(ep)
    pub = publishers(ep)
    ch = pub.channel("trainer", "0")
    ch.count("first")
    assert pub.flush(wait_s=30)
    wait_until(received_up_to(rx, ch.sender, 1))

    def broken_send(self: transport.Transport, frame: bytes) -> bool:
        raise RuntimeError("simulated bug in the transport")

    monkeypatch.setattr(transport.Transport, "send", broken_send)
    for i in range(100):
        ch.gauge("g", float(i))
    assert pub.flush(wait_s=30)
    monkeypatch.undo()
    ch.count("last")
    assert pub.flush(wait_s=30)
    (stats,) = pub.stats().values()
    assert stats["dropped"] == {"internal_error": 100} and accounted(stats) == 102
    assert pub.internal_errors >= 1
    wait_until(received_up_to(rx, ch.sender, 2))
    book = one_book(rx)
    assert book.received == 2 and book.dropped == {"internal_error": 100}


def test_tcp_endpoint(receivers, publishers) -> None:  # type: ignore[no-untyped-def]
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ep = f"tcp://127.0.0.1:{port}"
    rx = receivers(ep)
    pub = publishers(ep)
    ch = pub.channel("trainer", "0")
    calls = sum(every_kind(ch, i) for i in range(100))
    assert pub.flush(wait_s=30)
    wait_until(received_up_to(rx, ch.sender, calls))
    assert one_book(rx).received == calls


def test_allocator_samples_reach_the_receiver(ep: str, receivers, publishers,  # type: ignore[no-untyped-def]
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = types.SimpleNamespace(
        is_initialized=lambda: True, device_count=lambda: 1,
        memory_reserved=lambda d: 3 << 30, memory_allocated=lambda d: 1 << 30,
        max_memory_reserved=lambda d: 4 << 30,
    )
    fake = types.ModuleType("torch")
    fake.cuda = cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake)
    rx = receivers(ep)
    pub = publishers(ep, allocator_interval_s=0.05)
    ch = pub.channel("drafter", "0")
    ch.count("start")
    wait_until(lambda: any(r[0] == RecordKind.ALLOCATOR for r in one_book(rx).records)
               if books_of(rx.messages()) else False)
    rec = next(r for r in one_book(rx).records if r[0] == RecordKind.ALLOCATOR)
    assert rec == [RecordKind.ALLOCATOR, 0, [1 << 30, 3 << 30, 4 << 30]]
    assert wire.record_problem(*rec) is None


def test_close_counts_unresolved_gpu_scalars(ep: str, publishers,  # type: ignore[no-untyped-def]
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.fake_cuda import FakeBackend, FakeCudaTensor
    from trainer_shim import cuda_scalar

    backend = FakeBackend()
    resolver = cuda_scalar.ScalarResolver(backend, autostart=False)
    resolver.setup("cuda:0")
    monkeypatch.setattr(cuda_scalar, "_resolver", resolver)
    pub = publishers(ep)
    ch = pub.channel("trainer", "0")
    ch.scalar("done", FakeCudaTensor(backend.log, 1.0))
    resolver.resolve_ready()  # its event recorded
    backend.complete()  # and completed
    ch.scalar("pending", FakeCudaTensor(backend.log, 2.0))
    pub.close()
    (stats,) = pub.stats().values()
    assert stats["dropped"] == {"no_receiver": 1, "scalar_unresolved": 1}
    assert accounted(stats) == 2 and resolver.in_flight() == 0


def test_the_hello_names_the_run_and_states_flops_per_token(ep: str, receivers, publishers,  # type: ignore[no-untyped-def]
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DFLASH_RUN_LABEL", "TORCHELASTIC_RUN_ID", "DFLASH_FLOPS_PER_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    rx = receivers(ep)
    launched = publishers(ep, flops_per_token=3e9).channel("trainer", "0")  # the label from the launcher
    named = publishers(ep, run_label=" mine ").channel("trainer", "1")
    launched.count("n")
    named.count("n")
    books = wait_until(lambda: (b := books_of(rx.messages())) and all(
        s in b and b[s].hellos for s in (launched.sender, named.sender)) and b)
    first, second = books[launched.sender].hellos[0], books[named.sender].hellos[0]
    assert (first["run_label"], first["flops_per_token"]) == ("slurm:77", 3e9)
    assert (second["run_label"], second["flops_per_token"]) == ("mine", None)
