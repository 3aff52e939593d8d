"""Zero-synchronization publishing of GPU scalars (loss, grad norm).

``telemetry.scalar(name, tensor)`` must never wait for the GPU. For a CUDA tensor it enqueues, on
the caller's current stream and therefore after the kernels that produced the value:

1. ``src.record_stream(stream)``: the caching allocator must not hand ``src``'s memory to another
   stream before our copy has run, even if the trainer drops its last reference right away;
2. an asynchronous copy (``non_blocking=True``) into a slot of pinned host memory;
3. a CUDA event recorded after the copy.

A resolver thread polls the events with ``event.query()`` (never ``synchronize()``) and, once an
event has completed, reads the slot on the host and publishes the value. A slot and its event are
reused only after that, and ``src`` is kept referenced until then as well. The value must be
ready on the current stream, as for any torch operation issued there. While a CUDA graph is being
captured nothing is enqueued (the sample is dropped and counted as ``graph_capture``).

torch is never imported here: this module is only loaded once the trainer passes a CUDA tensor.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger("trainer_shim")

MAX_IN_FLIGHT = 1024
"""Scalars awaiting their copy; beyond this new ones are dropped (``scalar_backlog``)."""

POLL_INTERVAL_S = 0.002
"""How often the resolver queries pending events while any are in flight."""

SLOTS_PER_DTYPE = 256


class _Sink(Protocol):
    def _append_resolved(self, name: str, value: float) -> None: ...
    def _count_dropped(self, reason: str) -> None: ...


class CudaBackend(Protocol):
    """What the resolver needs from torch; a fake implements it in the unit tests."""

    def current_stream(self, tensor: Any) -> Any:
        """The caller's current stream on ``tensor``'s device."""

    def capturing(self, tensor: Any) -> bool:
        """True while a CUDA graph is being captured on the current stream."""

    def pinned_slot(self, dtype: Any) -> Any:
        """A free 0-dim pinned host tensor of ``dtype``, or None when all are in use."""

    def release_slot(self, slot: Any) -> None:
        """Return a slot whose copy has completed and whose value was read."""

    def new_event(self, stream: Any) -> Any:
        """A free CUDA event usable on ``stream``'s device."""

    def release_event(self, event: Any) -> None:
        """Return an event that has completed."""


@dataclass(slots=True)
class _InFlight:
    sink: _Sink
    name: str
    slot: Any
    event: Any
    src: Any  # kept alive until the copy completed


class TorchBackend:
    """The real backend: pools of pinned slots per dtype and of CUDA events per device. The
    first scalar of a dtype allocates its pinned block once (``SLOTS_PER_DTYPE`` slots)."""

    def __init__(self) -> None:
        self.torch = sys.modules["torch"]
        self._free: dict[Any, list[Any]] = {}
        self._events: dict[Any, list[Any]] = {}
        self._event_device: dict[Any, Any] = {}  # event -> the device whose pool it belongs to
        self._lock = threading.Lock()

    def current_stream(self, tensor: Any) -> Any:
        return self.torch.cuda.current_stream(tensor.device)

    def capturing(self, tensor: Any) -> bool:
        with self.torch.cuda.device(tensor.device):
            return bool(self.torch.cuda.is_current_stream_capturing())

    def pinned_slot(self, dtype: Any) -> Any:
        with self._lock:
            free = self._free.get(dtype)
            if free is None:
                block = self.torch.empty(SLOTS_PER_DTYPE, dtype=dtype, pin_memory=True)
                free = self._free[dtype] = [block[i] for i in range(SLOTS_PER_DTYPE)]
            return free.pop() if free else None

    def release_slot(self, slot: Any) -> None:
        with self._lock:
            self._free[slot.dtype].append(slot)

    def new_event(self, stream: Any) -> Any:
        with self._lock:
            pool = self._events.setdefault(stream.device, [])
            if pool:
                return pool.pop()
            event = self.torch.cuda.Event()
            self._event_device[event] = stream.device
            return event

    def release_event(self, event: Any) -> None:
        with self._lock:
            self._events[self._event_device[event]].append(event)


class ScalarResolver:
    """Enqueues the copies (caller's thread) and publishes completed values (own thread)."""

    def __init__(self, backend: CudaBackend, max_in_flight: int = MAX_IN_FLIGHT,
                 autostart: bool = True) -> None:
        """``autostart=False`` leaves polling to explicit ``resolve_ready()`` calls (tests)."""
        self.backend = backend
        self.max_in_flight = max_in_flight
        self.autostart = autostart
        self._in_flight: collections.deque[_InFlight] = collections.deque()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def submit(self, sink: _Sink, name: str, tensor: Any) -> None:
        """Enqueue the asynchronous copy of ``tensor`` (one element) for publication as ``name``.
        Never synchronizes; drops and counts instead of failing (``bad_argument``,
        ``scalar_backlog``, ``graph_capture``, ``scalar_error``)."""
        if tensor.numel() != 1:
            sink._count_dropped("bad_argument")
            return
        if len(self._in_flight) >= self.max_in_flight:
            sink._count_dropped("scalar_backlog")
            return
        backend = self.backend
        if backend.capturing(tensor):
            sink._count_dropped("graph_capture")
            return
        src = tensor.detach().reshape(())
        slot = backend.pinned_slot(src.dtype)
        if slot is None:
            sink._count_dropped("scalar_backlog")
            return
        try:
            stream = backend.current_stream(src)
            # Order matters: the allocator must know about the use on `stream` before the copy
            # is enqueued there, and the event must follow the copy on the same stream.
            src.record_stream(stream)
            slot.copy_(src, non_blocking=True)
            event = backend.new_event(stream)
            event.record(stream)
        except Exception:  # noqa: BLE001 - never raise into the trainer
            # The copy may or may not be enqueued: never reuse this slot (a leak of a few bytes
            # beats a slot overwritten by a late copy).
            sink._count_dropped("scalar_error")
            return
        self._in_flight.append(_InFlight(sink, name, slot, event, src))
        if self._thread is None and self.autostart:
            self._start()
        self._wake.set()

    def resolve_ready(self) -> int:
        """Publish every value whose copy has completed; returns how many. Non-blocking: it
        only calls ``event.query()``."""
        done = 0
        for _ in range(len(self._in_flight)):
            try:
                item = self._in_flight.popleft()
            except IndexError:  # another caller (close) took it
                break
            try:
                ready = item.event.query()
            except Exception:  # noqa: BLE001 - a CUDA error: drop this value, keep going
                item.sink._count_dropped("scalar_error")
                continue
            if not ready:
                self._in_flight.append(item)  # keep waiting; order among streams is not FIFO
                continue
            value = item.slot.item()  # pinned host memory: a plain read
            item.sink._append_resolved(item.name, value)
            self.backend.release_slot(item.slot)
            self.backend.release_event(item.event)
            done += 1
        return done

    def abandon_pending(self, sinks: Collection[Any] | None = None) -> int:
        """Count every value still waiting for its copy (for one of ``sinks``, default all) as
        dropped (``scalar_unresolved``): used at close, which must not wait for the GPU. Their
        slots are not reused. Returns how many."""
        n = 0
        for _ in range(len(self._in_flight)):
            try:
                item = self._in_flight.popleft()
            except IndexError:
                break
            if sinks is not None and item.sink not in sinks:
                self._in_flight.append(item)
                continue
            item.sink._count_dropped("scalar_unresolved")
            n += 1
        return n

    def in_flight(self) -> int:
        return len(self._in_flight)

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="trainer-shim-scalars", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            if not self._in_flight:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            try:
                self.resolve_ready()
            except Exception as exc:  # noqa: BLE001 - never let the resolver die
                log.warning("trainer_shim: scalar resolver error (counted, continuing): %r", exc)
            self._wake.wait(POLL_INTERVAL_S)


_resolver: ScalarResolver | None = None
_resolver_lock = threading.Lock()


def resolver() -> ScalarResolver:
    """The process-wide resolver, created on first use (raises ``KeyError`` if torch was never
    imported, which ``Channel.scalar`` counts as ``bad_argument``)."""
    global _resolver
    if _resolver is None:
        with _resolver_lock:
            if _resolver is None:
                _resolver = ScalarResolver(TorchBackend())
    return _resolver


def current() -> ScalarResolver | None:
    """The resolver if one was created, without creating it."""
    return _resolver


def _forget_in_child() -> None:
    # CUDA state does not survive fork; a child that uses CUDA builds its own resolver.
    global _resolver, _resolver_lock
    _resolver = None
    _resolver_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)
