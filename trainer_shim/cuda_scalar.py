"""Zero-synchronization publishing of GPU scalars (loss, grad norm).

``telemetry.scalar(name, tensor)`` must never wait for the GPU, and must cost the caller about
what the copy itself costs. For a CUDA tensor the caller's thread does two things, both on its
current stream and therefore after the kernels that produced the value:

1. an asynchronous copy (``non_blocking=True``) into a slot of pinned host memory (a copy, not a
   kernel: the shim launches no kernel on the trainer's thread, see below);
2. appending ``(slot, source)`` to that stream's open batch, under a lock.

A resolver turn records one CUDA event per stream on which copies were enqueued since the last
turn: that event follows every copy of the batch in stream order, whichever thread enqueued it.
Events on one stream complete in order, so a turn queries only the oldest batch of each stream
with ``event.query()`` (never ``synchronize()``); once it completed it reads the slots on the
host, publishes the values and releases slots, event and sources. A turn's cost grows with the
number of streams, not with the scalars in flight or the calls per second. The publisher's
flusher takes one turn per flush cycle, a wake-up it makes anyway, so scalars cost the trainer
no wake-up of their own (each wake-up of a Python thread takes the GIL from the trainer once);
only a producer fast enough to have ``HIGH_WATER`` scalars in flight wakes the resolver thread,
which then takes turns every ``POLL_INTERVAL_S`` until fewer than ``LOW_WATER`` are left.

The source tensor stays referenced until its batch's event completed, so the caching allocator
cannot hand its memory to other work before the copy ran (no ``record_stream`` needed). While a
CUDA graph is being captured on the current stream nothing is enqueued (``graph_capture``).

One-time set-up (pinned blocks) runs on the resolver thread, started by ``configure()`` (and the
default channel's creation) when CUDA is already initialised, else when CUDA initialises (torch's
lazy-initialisation hook), see ``prepare()``; failing both (torch imported after
``configure()``), by the first CUDA scalar. A scalar submitted before the set-up finished is
held (its source referenced, nothing enqueued); the set-up thread then records an event on the
caller's stream, makes a side stream wait for it and copies there: the value is the one the
producing kernels left, unless later work on the caller's stream overwrote the tensor in place
before the copy ran.

No kernel on the trainer's thread: under CUDA's default lazy module loading the first launch of
any kernel waits for the whole device, a synchronization sync-debug mode does not report. The
caller's thread only queries the stream, copies and appends (``tests/test_shim_cuda_scalar.py``
checks every operation with a fake backend that fails on anything else).

torch is never imported here: this module is only used once the trainer has imported torch.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger("trainer_shim")

MAX_IN_FLIGHT = 2048
"""Scalars awaiting their copy; beyond this new ones are dropped (``scalar_backlog``)."""

HIGH_WATER = MAX_IN_FLIGHT // 4
"""Scalars in flight from which the resolver thread takes turns of its own, until they are
fewer than ``LOW_WATER``; below it the publisher's flusher takes one turn per flush cycle."""

LOW_WATER = MAX_IN_FLIGHT // 16

POLL_INTERVAL_S = 0.005
"""The resolver thread's cadence while it takes turns (seconds): a producer that fast gets the
values out before the in-flight bound drops them."""

IDLE_WAIT_S = 1.0
"""Longest sleep of the resolver thread while the flusher's turns suffice."""

SLOTS_PER_DTYPE = MAX_IN_FLIGHT
SLOT_RESERVE = 64
"""Free slots of each dtype kept made ahead by the set-up and the resolver's turns."""
PREPARED_DTYPES = ("float32", "bfloat16", "float16", "float64")
"""dtypes whose pinned block the set-up allocates; another dtype's block is allocated by its
first scalar, on the caller's thread."""


class _Sink(Protocol):
    def _append_resolved(self, name: str, value: float) -> None: ...
    def _count_dropped(self, reason: str) -> None: ...


class CudaBackend(Protocol):
    """What the resolver needs from torch; a fake implements it in the unit tests."""

    def setup(self, device: Any) -> None:
        """One-time set-up (pinned blocks) for ``device``; runs on the resolver thread."""

    def current_stream(self, tensor: Any) -> Any:
        """The caller's current stream on ``tensor``'s device."""

    def capturing(self, tensor: Any) -> bool:
        """True while a CUDA graph is being captured on the current stream of ``tensor``'s device."""

    def pinned_slot(self, dtype: Any) -> Any:
        """A free 0-dim pinned host tensor of ``dtype``, or None when all are in use."""

    def release_slot(self, slot: Any) -> None:
        """Return a slot whose copy has completed and whose value was read."""

    def new_event(self, stream: Any) -> Any:
        """A free CUDA event usable on ``stream``'s device (resolver thread only)."""

    def release_event(self, event: Any) -> None:
        """Return an event that has completed (resolver thread only)."""

    def copy_after(self, slot: Any, src: Any, stream: Any) -> Any:
        """Copy ``src`` into ``slot`` on a side stream, after the work enqueued on ``stream`` so
        far (an event); returns the side stream. For scalars held during the set-up."""

    def top_up(self) -> None:
        """Make free slots ahead, off the caller's thread (each resolver turn)."""


Item = tuple[_Sink, str, Any, Any]  # sink, name, slot, source (kept alive until the copy completed)


@dataclass(slots=True)
class _Batch:
    event: Any
    items: list[Item] = field(default_factory=list)


class _Pool:
    """One dtype's pinned block; its 0-dim slot views are made as they are needed (a view costs
    microseconds and hundreds of bytes: made ahead only ``SLOT_RESERVE`` at a time)."""

    def __init__(self, block: Any) -> None:
        self.block, self.made = block, 0
        self.free: collections.deque[Any] = collections.deque()

    def grow(self, n: int) -> None:
        """Make up to ``n`` more slots (fewer at the end of the block)."""
        end = min(self.made + n, len(self.block))
        self.free.extend(self.block[i] for i in range(self.made, end))
        self.made = end


class TorchBackend:
    """The real backend: a block of ``SLOTS_PER_DTYPE`` pinned slots per dtype (the common ones
    allocated by ``setup``), CUDA events pooled per device."""

    def __init__(self) -> None:
        self.torch = sys.modules["torch"]
        self._pools: dict[Any, _Pool] = {}
        self._events: dict[Any, list[Any]] = {}
        self._event_device: dict[Any, Any] = {}  # event -> the device whose pool it belongs to
        self._side: dict[Any, Any] = {}  # device -> side stream (set-up only)
        self._lock = threading.Lock()  # pools grow under it; taking and returning use deques

    def setup(self, device: Any) -> None:
        torch = self.torch
        with torch.cuda.device(device):  # pinned memory in the caller's device's context
            for name in PREPARED_DTYPES:
                self._pool(getattr(torch, name))
        self.top_up()

    def _pool(self, dtype: Any) -> _Pool:
        with self._lock:
            pool = self._pools.get(dtype)
            if pool is None:
                block = self.torch.empty(SLOTS_PER_DTYPE, dtype=dtype, pin_memory=True)
                pool = self._pools[dtype] = _Pool(block)
            return pool

    def top_up(self) -> None:
        """Keep ``SLOT_RESERVE`` free slots made ahead in each pool (off the caller's thread)."""
        for pool in list(self._pools.values()):
            if len(pool.free) < SLOT_RESERVE // 2 and pool.made < len(pool.block):
                with self._lock:
                    pool.grow(SLOT_RESERVE)

    def current_stream(self, tensor: Any) -> Any:
        return self.torch.cuda.current_stream(tensor.device)

    def capturing(self, tensor: Any) -> bool:
        cuda = self.torch.cuda
        if tensor.device.index == cuda.current_device():  # the usual case: no device switch
            return bool(cuda.is_current_stream_capturing())
        with cuda.device(tensor.device):
            return bool(cuda.is_current_stream_capturing())

    def pinned_slot(self, dtype: Any) -> Any:
        pool = self._pools.get(dtype) or self._pool(dtype)
        try:
            return pool.free.popleft()
        except IndexError:  # the reserve ran out before a turn topped it up: make one here
            with self._lock:
                pool.grow(1)
            return pool.free.popleft() if pool.free else None

    def release_slot(self, slot: Any) -> None:
        self._pools[slot.dtype].free.append(slot)

    def new_event(self, stream: Any) -> Any:
        pool = self._events.setdefault(stream.device, [])
        if pool:
            return pool.pop()
        event = self.torch.cuda.Event()  # the CUDA event is created at its first record
        self._event_device[event] = stream.device
        return event

    def release_event(self, event: Any) -> None:
        self._events[self._event_device[event]].append(event)

    def copy_after(self, slot: Any, src: Any, stream: Any) -> Any:
        cuda = self.torch.cuda
        side = self._side.get(stream.device)
        if side is None:
            side = self._side[stream.device] = cuda.Stream(stream.device)
        event = cuda.Event()
        event.record(stream)
        side.wait_event(event)
        with cuda.stream(side):
            slot.copy_(src, non_blocking=True)
        return side


class ScalarResolver:
    """Enqueues the copies (caller's thread) and publishes completed values (own thread)."""

    def __init__(self, backend: CudaBackend, max_in_flight: int = MAX_IN_FLIGHT,
                 autostart: bool = True, device: Any = None) -> None:
        """``autostart=False`` leaves set-up and polling to explicit ``setup()`` and
        ``resolve_ready()`` calls (tests); else the thread starts at once and sets up for
        ``device`` (None: the current device)."""
        self.backend = backend
        self.max_in_flight = max_in_flight
        self._lock = threading.Lock()  # _open, _early, _count
        self._poll_lock = threading.Lock()  # one resolve_ready at a time (thread and close)
        self._open: dict[Any, list[Item]] = {}  # stream -> items copied since the last turn
        self._closed: dict[Any, collections.deque[_Batch]] = {}  # stream -> batches, oldest first
        self._early: list[tuple[_Sink, str, Any, Any]] = []  # sink, name, source, stream
        self._count = 0
        self._ready = False
        self._failed = False
        self._turning = False  # the resolver thread takes turns of its own
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        if autostart:
            self._thread = threading.Thread(target=self._run, args=(device,), name="trainer-shim-scalars",
                                            daemon=True)
            self._thread.start()

    def submit(self, sink: _Sink, name: str, tensor: Any) -> None:
        """Enqueue the asynchronous copy of ``tensor`` (one element) for publication as ``name``.
        Never synchronizes, launches no kernel; drops and counts instead of failing
        (``bad_argument``, ``scalar_backlog``, ``graph_capture``, ``scalar_error``)."""
        if tensor.numel() != 1:
            sink._count_dropped("bad_argument")
            return
        if self._count >= self.max_in_flight:
            sink._count_dropped("scalar_backlog")
            return
        backend = self.backend
        try:
            if backend.capturing(tensor):
                sink._count_dropped("graph_capture")
                return
            src = tensor.detach()
            if src.dim():
                src = src.reshape(())
            stream = backend.current_stream(src)
            if not self._ready and self._hold(sink, name, src, stream):
                return
            slot = backend.pinned_slot(src.dtype)
            if slot is None:
                sink._count_dropped("scalar_backlog")
                return
            slot.copy_(src, non_blocking=True)
        except Exception:  # noqa: BLE001 - never raise into the trainer
            # The copy may or may not be enqueued: the slot is never reused (a leak of a few
            # bytes beats a slot overwritten by a late copy).
            sink._count_dropped("scalar_error")
            return
        with self._lock:
            items = self._open.get(stream)
            if items is None:
                items = self._open[stream] = []
            items.append((sink, name, slot, src))
            self._count += 1
        if self._count >= HIGH_WATER and not self._turning:
            self._wake.set()

    def _hold(self, sink: _Sink, name: str, src: Any, stream: Any) -> bool:
        """Hold a scalar submitted before the set-up finished; False if it just finished."""
        if self._failed:
            sink._count_dropped("scalar_error")
            return True
        with self._lock:
            if self._ready:
                return False
            self._early.append((sink, name, src, stream))
            self._count += 1
        return True

    def setup(self, device: Any = None) -> None:
        """The one-time set-up, then the scalars held meanwhile are copied (see the module's
        docstring). A failure is logged once; held and later scalars count ``scalar_error``."""
        try:
            self.backend.setup(device)
        except Exception as exc:  # noqa: BLE001 - no CUDA after all: count, never raise
            log.warning("trainer_shim: GPU scalar set-up failed, GPU scalars are dropped: %r", exc)
            self._failed = True
        with self._lock:
            self._ready = not self._failed
            early, self._early = self._early, []
        for sink, name, src, stream in early:
            self._copy_held(sink, name, src, stream)

    def _copy_held(self, sink: _Sink, name: str, src: Any, stream: Any) -> None:
        reason = "scalar_error"
        try:
            if not self._failed:
                slot = self.backend.pinned_slot(src.dtype)
                if slot is None:
                    reason = "scalar_backlog"
                else:
                    side = self.backend.copy_after(slot, src, stream)
                    with self._lock:
                        self._open.setdefault(side, []).append((sink, name, slot, src))
                    return
        except Exception:  # noqa: BLE001
            pass
        sink._count_dropped(reason)
        with self._lock:
            self._count -= 1

    def resolve_ready(self) -> int:
        """One turn: an event after each stream's newly enqueued copies, then publish every
        value whose batch completed; returns how many. Non-blocking: ``event.record`` and
        ``event.query()`` only."""
        with self._poll_lock:
            with self._lock:
                opened, self._open = self._open, {}
            lost = sum(self._close_batch(stream, items) for stream, items in opened.items())
            done = 0
            for stream in list(self._closed):
                n, bad = self._publish_completed(self._closed[stream])
                done, lost = done + n, lost + bad
                if not self._closed[stream]:
                    del self._closed[stream]
            if done or lost:
                with self._lock:
                    self._count -= done + lost
            self.backend.top_up()
        return done

    def _close_batch(self, stream: Any, items: list[Item]) -> int:
        """Record the event that follows ``items``' copies on ``stream``; returns how many were
        dropped (``scalar_error``) because that failed."""
        try:
            event = self.backend.new_event(stream)
            event.record(stream)
        except Exception:  # noqa: BLE001 - slots never reused: the copies may still land
            for sink, *_ in items:
                sink._count_dropped("scalar_error")
            return len(items)
        self._closed.setdefault(stream, collections.deque()).append(_Batch(event, items))
        return 0

    def _publish_completed(self, batches: collections.deque[_Batch]) -> tuple[int, int]:
        """Publish the completed batches at the head of one stream's queue (in order: the first
        one not completed ends the walk); returns (published, dropped)."""
        done = lost = 0
        backend = self.backend
        while batches:
            batch = batches[0]
            try:
                ready = batch.event.query()
            except Exception:  # noqa: BLE001 - a CUDA error: drop this batch, keep going
                batches.popleft()
                for sink, *_ in batch.items:
                    sink._count_dropped("scalar_error")
                lost += len(batch.items)
                continue
            if not ready:
                break
            batches.popleft()
            for sink, name, slot, _src in batch.items:
                sink._append_resolved(name, slot.item())  # pinned host memory: a plain read
                backend.release_slot(slot)
            backend.release_event(batch.event)
            done += len(batch.items)
        return done, lost

    def abandon_pending(self, sinks: Collection[Any] | None = None) -> int:
        """Count every value still waiting for its copy (for one of ``sinks``, default all) as
        dropped (``scalar_unresolved``): used at close, which must not wait for the GPU. Their
        slots are not reused. Returns how many."""
        def mine(item: tuple[Any, ...]) -> bool:
            return sinks is None or item[0] in sinks

        n = 0
        with self._poll_lock, self._lock:
            groups = [*self._open.values(), self._early, *(b.items for q in self._closed.values() for b in q)]
            for items in groups:
                for item in items:
                    if mine(item):
                        item[0]._count_dropped("scalar_unresolved")
                        n += 1
                items[:] = [item for item in items if not mine(item)]
            self._count -= n
        return n

    def in_flight(self) -> int:
        """Scalars submitted and neither published nor dropped yet."""
        return self._count

    def _run(self, device: Any) -> None:
        self.setup(device)
        while True:
            self._wake.wait(IDLE_WAIT_S)
            self._wake.clear()
            self._turning = True
            while self._count >= LOW_WATER:  # a fast producer: the flusher's turns do not suffice
                self.turn()
                time.sleep(POLL_INTERVAL_S)
            self._turning = False

    def turn(self) -> None:
        """``resolve_ready()`` for a thread that must go on: an error is logged, never raised.
        The publisher's flusher calls it once per flush cycle."""
        if not self._count:
            return
        try:
            self.resolve_ready()
        except Exception as exc:  # noqa: BLE001 - never let the resolver die
            log.warning("trainer_shim: scalar resolver error (counted, continuing): %r", exc)


_resolver: ScalarResolver | None = None
_resolver_lock = threading.Lock()
_hooked = False  # prepare() registered _on_cuda_init with torch


def resolver(device: Any = None) -> ScalarResolver:
    """The process-wide resolver, created on first use with its thread, which does the one-time
    set-up for ``device`` (raises ``KeyError`` if torch was never imported, which
    ``Channel.scalar`` counts as ``bad_argument``)."""
    global _resolver
    if _resolver is None:
        with _resolver_lock:
            if _resolver is None:
                _resolver = ScalarResolver(TorchBackend(), device=device)
    return _resolver


def prepare() -> bool:
    """Start the resolver and its set-up off the caller's thread as soon as CUDA is initialised
    (``configure()`` calls it): now if it already is, else from torch's lazy-initialisation hook
    (once per process). Returns whether it started now. Never raises."""
    global _hooked
    torch = sys.modules.get("torch")
    try:
        if torch is None or _resolver is not None:
            return False
        if torch.cuda.is_initialized():
            resolver(torch.cuda.current_device())
            return True
        if not _hooked:
            _hooked = True
            torch.cuda._lazy_call(_on_cuda_init)  # runs at CUDA's initialisation, on that thread
    except Exception:  # noqa: BLE001 - the first scalar() will set up instead
        pass
    return False


def _on_cuda_init() -> None:
    # Inside torch's CUDA initialisation: only start the thread (its set-up waits for the
    # initialisation to finish); never raise, which would fail the trainer's first CUDA call.
    try:
        resolver()
    except Exception:  # noqa: BLE001
        pass


def current() -> ScalarResolver | None:
    """The resolver if one was created, without creating it."""
    return _resolver


def _forget_in_child() -> None:
    # CUDA state does not survive fork; a child that uses CUDA builds its own resolver.
    global _resolver, _resolver_lock, _hooked
    _resolver = None
    _resolver_lock = threading.Lock()
    _hooked = False


os.register_at_fork(after_in_child=_forget_in_child)
