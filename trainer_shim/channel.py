"""A channel: one worker's stream of records, and the whole cost the trainer pays per call.

Each call builds one small tuple (a timer: the timer itself, see ``Timer``) and appends it to a
bounded deque (thread-safe, no lock); a background flusher drains the deque, encodes and sends.
Nothing on this path validates, encodes, locks or touches a socket, so a call costs about as much
as the append itself. Validation happens in the daemon, which counts every rejected record by
reason; ``StrictChannel`` (development mode,
``DFLASH_TELEMETRY_STRICT=1``) validates here and raises instead.
"""

from __future__ import annotations

import collections
import numbers
import os
import random
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from itertools import repeat
from operator import call as _call
from time import perf_counter
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypedDict

import msgspec

from trainer_shim import capture, wire
from trainer_shim.coerce import coerce as _coerce
from trainer_shim.wire import RecordKind

if TYPE_CHECKING:
    from trainer_shim.cuda_scalar import ScalarResolver

_TIMING = int(RecordKind.TIMING)
_COUNT = int(RecordKind.COUNT)
_GAUGE = int(RecordKind.GAUGE)
_CATEGORY = int(RecordKind.CATEGORY)
_SCALAR = int(RecordKind.SCALAR)
_PROFILE = int(RecordKind.PROFILE)
_ALLOCATOR = int(RecordKind.ALLOCATOR)
_STEP_KEY = "\x00step"
"""Where ``publish`` keeps the step inside its snapshot; never a valid metric name (a control
character), so a well-formed profile cannot contain it."""


def new_sender_id() -> int:
    """A random 63-bit sender id (positive, fits msgpack int64)."""
    return random.SystemRandom().getrandbits(63)


class Channel:
    """Records from one (role, worker). Every method is safe from any thread, never blocks and
    never raises into the caller; see ``docs/SHIM.md`` for what happens to bad arguments.

    The recording calls (``timing``, ``count``, ``gauge``, ``category``, ``publish``, ``scalar``,
    ``timer``) are plain functions stored on the instance, not methods: a bound method would be
    traced by ``torch.compile``, a plain function can be substituted there by a call of a shim
    operator (``trainer_shim.compile_support``). Each keeps a direct reference to the channel's queue, so a
    call is one bounded append."""

    __slots__ = (
        "__weakref__",
        "_cap",
        "_overflow",
        "_overflow_lock",
        "_pq",
        "_q",
        "category",
        "count",
        "devices",
        "dropped",
        "gauge",
        "hello_due",
        "last_hello_monotonic",
        "last_sent_monotonic",
        "publish",
        "records_total",
        "relabel",
        "role",
        "scalar",
        "sender",
        "seq",
        "step",
        "thread",
        "timer",
        "timing",
        "worker",
    )

    timing: Callable[[str, float], None]
    count: Callable[..., None]
    gauge: Callable[[str, float], None]
    category: Callable[[str, str | int], None]
    publish: Callable[[int, Mapping[str, float]], None]
    scalar: Callable[[str, Any], None]
    timer: Callable[[str], AbstractContextManager[None]]

    def __init__(self, role: str, worker: str, max_pending: int, devices: list[int]) -> None:
        self.role = role
        self.worker = worker
        self.devices = devices
        self.thread = threading.current_thread().name
        self.relabel = False
        self._cap = max_pending
        self._q: collections.deque[Record] = collections.deque()
        self._pq: collections.deque[dict[str, float]] = collections.deque()  # publish() snapshots
        self.reset()
        self._bind()

    def reset(self) -> None:
        """Start a fresh sender identity (at creation, and in a forked child). The queues are
        emptied in place: the recording functions keep referring to them."""
        self.sender = new_sender_id()
        self.seq = 0
        self.records_total = 0
        self.dropped: dict[str, int] = {}
        self.step: int | None = None
        self.hello_due = True
        self.last_hello_monotonic = 0.0
        self.last_sent_monotonic = 0.0
        self._q.clear()
        self._pq.clear()
        self._overflow = 0
        self._overflow_lock = threading.Lock()

    def _bind(self) -> None:
        fns = _recording_functions(self)
        for name, fn in fns.items():
            setattr(self, name, fn)
        from trainer_shim import compile_support

        compile_support.register(fns, fresh_scalar=self._append_resolved)

    def _scalar(self, name: str, tensor: Any) -> None:
        try:
            if getattr(tensor, "is_cuda", False):
                gpu = _gpu_scalars or gpu_scalars()
                (gpu.current() or gpu.resolver(tensor.device)).submit(self, name, tensor)
                return
            if getattr(getattr(tensor, "device", None), "type", "cpu") != "cpu":
                self._count_dropped("bad_argument")
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

    def _count_dropped(self, reason: str, n: int = 1) -> None:
        """Count ``n`` records dropped for ``reason`` (any thread)."""
        with self._overflow_lock:
            self.dropped[reason] = self.dropped.get(reason, 0) + n

    def drain(self) -> list[Record]:
        """Take every queued record, oldest first (profile snapshots ahead of the other records
        queued in the same interval), and fold the overflow count into ``dropped``. A record is
        a ``(kind, name, value)`` tuple or a finished ``Timer``, which unpacks and encodes the
        same way (it cannot be indexed). Only the flusher calls this."""
        q, pq = self._q, self._pq
        records: list[Record] = list(map(_call, repeat(q.popleft, len(q))))  # one C loop, ~15 ns a record
        if pq:
            snapshots = list(map(_call, repeat(pq.popleft, len(pq))))
            records[:0] = [(_PROFILE, p.pop(_STEP_KEY, None), p) for p in snapshots]
        if self._overflow:
            with self._overflow_lock:
                overflow, self._overflow = self._overflow, 0
                self.dropped["buffer_full"] = self.dropped.get("buffer_full", 0) + overflow
        return records

    def pending(self) -> int:
        """Records queued and not yet drained."""
        return len(self._q) + len(self._pq)


_gpu_scalars: ModuleType | None = None
"""``trainer_shim.cuda_scalar`` once ``gpu_scalars()`` imported it. Kept here because an import
statement in ``Channel._scalar`` cost each call about 1 µs, as much as the rest of the call
(``bench/bench_scalar.py``); a global read costs tens of ns."""


def gpu_scalars() -> ModuleType:
    """``trainer_shim.cuda_scalar``, imported at the first call: only a trainer that imported torch
    calls this (the first CUDA scalar, or ``configure()`` with torch imported)."""
    global _gpu_scalars
    if _gpu_scalars is None:
        from trainer_shim import cuda_scalar

        _gpu_scalars = cuda_scalar
    return _gpu_scalars


def current_scalar_resolver() -> ScalarResolver | None:
    """The GPU scalar resolver if the trainer ever made one, else None; never imports."""
    return _gpu_scalars.current() if _gpu_scalars is not None else None


def _recording_functions(ch: Channel) -> dict[str, Any]:
    """The hot path of one channel as plain functions (see ``Channel``); each builds one small
    tuple and appends it to the bounded queue. Plain closures: ``torch.compile`` traces them."""

    def scalar(name: str, tensor: Any) -> None:
        """Publish a 1-element tensor's value without synchronizing with the GPU: a CUDA tensor is
        copied asynchronously (ordered on the current stream) and published once its copy event
        completes; a CPU tensor or a plain number is published at once. A tensor on any other
        device, or one that is not a single element, is dropped and counted (``bad_argument``):
        reading it would synchronize."""
        ch._scalar(name, tensor)

    return {**_record_functions(ch), "publish": _publish_function(ch), "timer": _timer_function(ch),
            "scalar": scalar}


def _record_functions(ch: Channel) -> dict[str, Any]:
    """``timing``, ``count``, ``gauge`` and ``category`` of ``ch``."""
    q, cap = ch._q, ch._cap
    append = q.append  # one lookup less per call
    overflow = ch._count_overflow

    def timing(name: str, ms: float) -> None:
        """Record a duration of ``ms`` milliseconds under ``name``."""
        if len(q) < cap:
            append((_TIMING, name, ms))
        else:
            overflow()

    def count(name: str, n: float = 1) -> None:
        """Add ``n`` (>= 0) to the counter ``name``."""
        if len(q) < cap:
            append((_COUNT, name, n))
        else:
            overflow()

    def gauge(name: str, value: float) -> None:
        """Record the current ``value`` of ``name`` (a queue depth, a batch size...)."""
        if len(q) < cap:
            append((_GAUGE, name, value))
        else:
            overflow()

    def category(name: str, key: str | int) -> None:
        """Record one categorical sample, e.g. the hidden-state bucket a batch came from."""
        if len(q) < cap:
            append((_CATEGORY, name, key))
        else:
            overflow()

    return {"timing": timing, "count": count, "gauge": gauge, "category": category}


def _publish_function(ch: Channel) -> Callable[[int, Mapping[str, float]], None]:
    """``publish`` of ``ch``."""
    pq, cap = ch._pq, ch._cap
    overflow, count_dropped = ch._count_overflow, ch._count_dropped

    def publish(step: int, profile: Mapping[str, float]) -> None:
        """Publish the trainer's profile snapshot for ``step``. Keys ending in ``_ms`` are
        timings in milliseconds, all others gauges. The mapping is copied (shallow), so the
        caller may reuse it; anything that is not a mapping is dropped and counted
        (``bad_argument``)."""
        if len(pq) < cap:
            try:
                snapshot = {**profile}
            except Exception:  # noqa: BLE001 - not a mapping: counted, never raised
                count_dropped("bad_argument")
                return
            # The step rides inside the copy: a dict of numbers is not tracked by the garbage
            # collector, a (kind, step, dict) tuple would be, and at high publish rates those
            # tuples survived into older generations and triggered full collections.
            snapshot[_STEP_KEY] = step
            pq.append(snapshot)
            ch.step = step
        else:
            overflow()
        if capture.armed:  # the step boundary a capture on request waits for (trainer_shim.capture)
            capture.at_step(ch, step)

    return publish


def _timer_function(ch: Channel) -> Callable[[str], AbstractContextManager[None]]:
    """``timer`` of ``ch``."""
    q, cap = ch._q, ch._cap
    append = q.append
    overflow, count_dropped = ch._count_overflow, ch._count_dropped

    class ChannelTimer(Timer):
        def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
            start = self.value
            if start < 0.0:  # open (0.0: a float compare is the fast one)
                self.value = (perf_counter() + start) * 1e3
                if len(q) < cap:
                    append(self)  # a record: see Timer
                else:
                    overflow()
            else:
                count_dropped("bad_argument")  # entered again

    def timer(name: str) -> AbstractContextManager[None]:
        """A context manager timing its ``with`` block on the host clock (from this call),
        recorded as a timing (ms) when the block ends, also when it raises. Host wall time only: for GPU work this
        measures launch time, not execution. Inside a ``torch.compile``d function it reads the
        clock when the graph runs (see ``trainer_shim.compile_support``)."""
        return ChannelTimer(_TIMING, name, -perf_counter())

    return timer


_enter: Callable[..., None] = None.__init__  # type: ignore[misc]
"""A timer's ``__enter__``: a C function that takes any arguments and returns None
(``object.__init__`` bound to None). A builtin stored on a class is not bound to the instance,
so ``with`` calls it without one and ``ExitStack.enter_context`` with one; a Python
``__enter__`` cost a Python call (~40 ns of a ~0.4 us timer on an idle machine)."""


class Timer(msgspec.Struct, array_like=True, gc=False):
    """What ``timer(name)`` returns: times its ``with`` block on the host clock, from the
    ``timer()`` call (which reads the clock, so ``__enter__`` is ``_enter`` and does nothing) to
    the block's end, also when it raises, and then is its own record. Each channel has a
    subclass whose ``__exit__`` queues the timer itself, as ``timing`` queues a tuple: msgpack
    encodes it as ``[TIMING, name, ms]``, the wire form of a timing (``array_like``). Not tracked
    by the garbage collector (``gc=False``): it holds an int, the caller's name and a float (a
    name that is no str and refers back to its timer would never be freed; the daemon drops such
    a record as ``bad_name``).

    Why this shape: a slotted object that built a ``(kind, name, ms)`` tuple in ``__exit__`` cost
    0.40-0.43 us a block, this 0.31-0.34 us, on an idle 2-core machine (fresh interpreters,
    interleaved; bench/RESULTS.md). A msgspec Struct is built in one C call and is not tracked by
    the garbage collector; queued as it is, it needs no encode hook. The few lines that close a
    timer are written in both subclasses' ``__exit__`` (the channel's, ``telemetry._Timer``) on
    purpose: a shared helper would be one more Python call per block.

    Fields: ``kind`` (``TIMING``); ``name``; ``value``: while the block runs, minus the host clock
    at ``timer()`` (``perf_counter``, s; negative marks it open), then the duration in ms. Use a
    timer in its ``with`` statement once: a timer entered again records nothing and counts
    a ``bad_argument`` drop."""

    kind: int
    name: str
    value: float

    __enter__ = _enter

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        """Records nothing: each channel's subclass queues the timer in that channel."""

    def __iter__(self) -> Iterator[int | str | float]:
        """Unpacks as the tuples in a channel's queue do: ``kind, name, ms = timer``."""
        return iter((self.kind, self.name, self.value))


Record = tuple[object, ...] | Timer
"""One queued record: a ``(kind, name, value)`` tuple (a profile snapshot drained as
``(kind, step, snapshot)``), or a finished ``Timer``, which unpacks and encodes the same way."""


class ChannelStats(TypedDict):
    """One channel's figures in ``Publisher.stats()``: its sender id, messages sent (``seq``),
    records sent, drops by reason, records queued."""

    sender: int
    seq: int
    records_total: int
    dropped: dict[str, int]
    pending: int


class StrictChannel(Channel):
    """Development mode: validates every call and raises ``TypeError`` (wrong type: a name that
    is not a str, a value that is not a number) or ``ValueError`` (right type, unusable value:
    NaN, inf, a negative duration, a value out of range, an empty or over-long name) at the call
    site, so a wrong argument is seen where it is made. The verdict is the daemon's: the record as
    the flusher would encode it, judged by ``wire.RECORD_RULES``; the message names the reason the
    daemon would drop it for. Slower; not for production."""

    __slots__ = ()

    def _bind(self) -> None:
        fast = _recording_functions(self)
        fns = _strict_functions(fast)
        for name, fn in fns.items():
            setattr(self, name, fn)
        from trainer_shim import compile_support

        compile_support.register(fns)


def _strict_functions(fast: dict[str, Any]) -> dict[str, Any]:
    """``fast``'s functions behind the strict checks."""

    def timing(name: str, ms: float) -> None:
        _check(_TIMING, name, ms)
        fast["timing"](name, ms)

    def count(name: str, n: float = 1) -> None:
        _check(_COUNT, name, n)
        fast["count"](name, n)

    def gauge(name: str, value: float) -> None:
        _check(_GAUGE, name, value)
        fast["gauge"](name, value)

    def category(name: str, key: str | int) -> None:
        _check(_CATEGORY, name, key)
        fast["category"](name, key)

    def publish(step: int, profile: Mapping[str, float]) -> None:
        if not isinstance(profile, Mapping):
            raise TypeError(f"telemetry: publish: profile must be a mapping of name -> number, "
                            f"not {type(profile).__name__}")
        _check(_PROFILE, step, dict(profile), what="publish")
        for key, value in profile.items():
            _check(wire.profile_entry_kind(key), key, value, what=f"publish: entry {key!r:.80}")
        fast["publish"](step, profile)

    def timer(name: str) -> AbstractContextManager[None]:
        _check(_TIMING, name, 0.0)
        return fast["timer"](name)  # type: ignore[no-any-return]

    def scalar(name: str, tensor: Any) -> None:
        if getattr(tensor, "is_cuda", False) or hasattr(tensor, "numel"):
            _check(_SCALAR, name, 0.0)
            if tensor.numel() != 1:
                raise ValueError(f"telemetry: scalar {name!r}: the tensor has {tensor.numel()} "
                                 "elements, not 1")
            if getattr(tensor, "is_cuda", False):  # its value cannot be checked without a sync
                fast["scalar"](name, tensor)
                return
            if tensor.device.type != "cpu":
                raise ValueError(f"telemetry: scalar {name!r}: a {tensor.device.type} tensor "
                                 "cannot be read without synchronizing")
            _check(_SCALAR, name, tensor.item())
        else:
            _check(_SCALAR, name, tensor)
        fast["scalar"](name, tensor)

    return {"timing": timing, "count": count, "gauge": gauge, "category": category,
            "publish": publish, "timer": timer, "scalar": scalar}


_WIRE_NATIVE = frozenset({int, float, str, bool, type(None), list, dict, tuple, bytes})
"""Types msgpack carries as they are; anything else goes through the flusher's encode hook."""


def _wire_form(value: object) -> object:
    """``value`` as the daemon receives it: numpy scalars (and other real numbers) become int or
    float as the flusher's encode hook makes them; anything else is left for the rules to refuse."""
    if type(value) in _WIRE_NATIVE or not isinstance(value, numbers.Real):
        return value
    return _coerce(value)


def _check(kind: int, name: object, value: object, what: str | None = None) -> None:
    """Raise unless the daemon would accept ``[kind, name, value]`` (``wire.RECORD_RULES``):
    ``TypeError`` for a name or value of a type the kind never takes (and for a tensor passed as
    a plain value), else ``ValueError``. ``what`` names the argument in the message."""
    rule = wire.RECORD_RULES[kind]
    label = what or f"{rule.word} {name!r:.80}"
    wire_name = _wire_form(name)
    _refuse(rule.name_problem(wire_name), wire_name, rule.name_types, label, rule.name_accepts, name)
    if hasattr(value, "numel"):
        raise TypeError(f"telemetry: {label}: the value must be a real number, not "
                        f"{type(value).__name__} (use telemetry.scalar(name, tensor) for tensors)")
    wire_value = _wire_form(value)
    _refuse(rule.value_problem(wire_value), wire_value, rule.value_types, label, rule.accepts, value,
            "the value must be ")


def _refuse(problem: str | None, wire: object, types: tuple[type, ...], label: str, accepts: str,
            given: object, lead: str = "") -> None:
    """Raise for ``problem`` (none: return, building no text): ``ValueError`` where the ``wire``
    form of ``given`` has one of the ``types`` the kind takes, else ``TypeError``; the message says
    what it accepts (``lead`` + ``accepts``)."""
    if problem is not None:
        error = TypeError if type(wire) not in types else ValueError
        raise error(f"telemetry: {label}: {lead}{accepts}, got {given!r:.80} (the daemon would drop it: {problem})")


def strict_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    """True when ``DFLASH_TELEMETRY_STRICT`` asks for development-mode validation."""
    return environ.get("DFLASH_TELEMETRY_STRICT", "").lower() in {"1", "true", "yes", "on"}
