"""A channel: one worker's stream of records, and the whole cost the trainer pays per call.

Each call builds one small tuple and appends it to a bounded deque (thread-safe, no lock); a
background flusher drains the deque, encodes and sends. Nothing on this path validates, encodes,
locks or touches a socket, so a call costs about as much as the append itself. Validation happens
in the daemon, which counts every rejected record by reason; ``StrictChannel`` (development mode,
``DFLASH_TELEMETRY_STRICT=1``) validates here and raises instead.
"""

from __future__ import annotations

import collections
import os
import random
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from trainer_shim import wire
from trainer_shim.wire import RecordKind

_TIMING = int(RecordKind.TIMING)
_COUNT = int(RecordKind.COUNT)
_GAUGE = int(RecordKind.GAUGE)
_CATEGORY = int(RecordKind.CATEGORY)
_SCALAR = int(RecordKind.SCALAR)
_PROFILE = int(RecordKind.PROFILE)
_ALLOCATOR = int(RecordKind.ALLOCATOR)


def new_sender_id() -> int:
    """A random 63-bit sender id (positive, fits msgpack int64)."""
    return random.SystemRandom().getrandbits(63)


class Channel:
    """Records from one (role, worker). Every method is safe from any thread, never blocks and
    never raises into the caller; see ``docs/SHIM.md`` for what happens to bad arguments."""

    __slots__ = (
        "role", "worker", "devices", "thread", "sender", "seq", "records_total", "dropped", "step",
        "hello_due", "last_sent_monotonic", "_q", "_cap", "_overflow", "_overflow_lock",
        "__weakref__",
    )

    def __init__(self, role: str, worker: str, max_pending: int, devices: list[int]) -> None:
        self.role = role
        self.worker = worker
        self.devices = devices
        self.thread = threading.current_thread().name
        self._cap = max_pending
        self.reset()

    def reset(self) -> None:
        """Start a fresh sender identity (at creation, and in a forked child)."""
        self.sender = new_sender_id()
        self.seq = 0
        self.records_total = 0
        self.dropped: dict[str, int] = {}
        self.step: int | None = None
        self.hello_due = True
        self.last_sent_monotonic = 0.0
        self._q: collections.deque[tuple[Any, ...]] = collections.deque()
        self._overflow = 0
        self._overflow_lock = threading.Lock()

    # -- the hot path: one bounded append each -------------------------------------------------

    def timing(self, name: str, ms: float) -> None:
        """Record a duration of ``ms`` milliseconds under ``name``."""
        q = self._q
        if len(q) < self._cap:
            q.append((_TIMING, name, ms))
        else:
            self._count_overflow()

    def count(self, name: str, n: float = 1) -> None:
        """Add ``n`` (>= 0) to the counter ``name``."""
        q = self._q
        if len(q) < self._cap:
            q.append((_COUNT, name, n))
        else:
            self._count_overflow()

    def gauge(self, name: str, value: float) -> None:
        """Record the current ``value`` of ``name`` (a queue depth, a batch size...)."""
        q = self._q
        if len(q) < self._cap:
            q.append((_GAUGE, name, value))
        else:
            self._count_overflow()

    def category(self, name: str, key: str | int) -> None:
        """Record one categorical sample, e.g. the hidden-state bucket a batch came from."""
        q = self._q
        if len(q) < self._cap:
            q.append((_CATEGORY, name, key))
        else:
            self._count_overflow()

    def publish(self, step: int, profile: Mapping[str, float]) -> None:
        """Publish the trainer's profile snapshot for ``step``. Keys ending in ``_ms`` are
        timings in milliseconds, all others gauges. The dict is copied, so the caller may reuse
        it."""
        q = self._q
        if len(q) < self._cap:
            try:
                q.append((_PROFILE, step, dict(profile)))
            except (TypeError, ValueError):
                self._count_dropped("bad_argument")
                return
            self.step = step
        else:
            self._count_overflow()

    @contextmanager
    def timer(self, name: str) -> Iterator[None]:
        """Time the ``with`` block on the host clock and record it as a timing (ms). Host wall
        time only: for GPU work this measures launch time, not execution."""
        start = time.perf_counter_ns()
        try:
            yield
        finally:
            self.timing(name, (time.perf_counter_ns() - start) * 1e-6)

    def scalar(self, name: str, tensor: Any) -> None:
        """Publish a 1-element tensor's value without synchronizing with the GPU: a CUDA tensor is
        copied asynchronously (ordered on the current stream) and published once its copy event
        completes; a CPU tensor or a plain number is published at once."""
        try:
            if getattr(tensor, "is_cuda", False):
                from trainer_shim.cuda_scalar import resolver

                resolver().submit(self, name, tensor)
                return
            value = tensor.item() if hasattr(tensor, "item") else tensor
        except Exception:  # noqa: BLE001 - the trainer must never see our failure
            self._count_dropped("bad_argument")
            return
        self._append_resolved(name, value)

    # -- used by the scalar resolver, allocator sampler and flusher -----------------------------

    def _append_resolved(self, name: str, value: float) -> None:
        q = self._q
        if len(q) < self._cap:
            q.append((_SCALAR, name, value))
        else:
            self._count_overflow()

    def append_allocator(self, device: int, allocated: int, reserved: int, max_reserved: int) -> None:
        """Queue one allocator sample (bytes) for ``device``."""
        q = self._q
        if len(q) < self._cap:
            q.append((_ALLOCATOR, device, [allocated, reserved, max_reserved]))
        else:
            self._count_overflow()

    def _count_overflow(self) -> None:
        with self._overflow_lock:
            self._overflow += 1

    def _count_dropped(self, reason: str) -> None:
        with self._overflow_lock:
            self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def drain(self) -> list[tuple[Any, ...]]:
        """Take every queued record, oldest first, and fold the overflow count into ``dropped``.
        Only the flusher calls this."""
        q = self._q
        popleft = q.popleft
        records = [popleft() for _ in range(len(q))]
        if self._overflow:
            with self._overflow_lock:
                overflow, self._overflow = self._overflow, 0
                self.dropped["buffer_full"] = self.dropped.get("buffer_full", 0) + overflow
        return records

    def pending(self) -> int:
        """Records queued and not yet drained."""
        return len(self._q)


class StrictChannel(Channel):
    """Development mode: validates every call and raises ``TypeError``/``ValueError`` at the
    call site, so a wrong argument is seen where it is made. Slower; never use in production."""

    __slots__ = ()

    def timing(self, name: str, ms: float) -> None:
        wire.check_record(_TIMING, name, ms)
        super().timing(name, ms)

    def count(self, name: str, n: float = 1) -> None:
        wire.check_record(_COUNT, name, n)
        super().count(name, n)

    def gauge(self, name: str, value: float) -> None:
        wire.check_record(_GAUGE, name, value)
        super().gauge(name, value)

    def category(self, name: str, key: str | int) -> None:
        wire.check_record(_CATEGORY, name, key)
        super().category(name, key)

    def publish(self, step: int, profile: Mapping[str, float]) -> None:
        wire.check_record(_PROFILE, step, profile)
        super().publish(step, profile)

    def scalar(self, name: str, tensor: Any) -> None:
        wire.check_name(name)
        super().scalar(name, tensor)


def strict_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    """True when ``DFLASH_TELEMETRY_STRICT`` asks for development-mode validation."""
    return environ.get("DFLASH_TELEMETRY_STRICT", "").lower() in {"1", "true", "yes", "on"}
