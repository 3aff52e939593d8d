"""The publisher: owns the channels, the flusher thread and the transport of one process.

Lifecycle: created idle; the flusher thread (and with it the ZeroMQ context and socket) starts
with the first channel, so constructing a publisher costs nothing and the socket is only ever
touched by that one thread. ``close()`` is idempotent and bounded. A forked child gets a clean
publisher (new sender ids, no inherited records, a new socket); at interpreter exit the last batch
goes out with a short linger.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

import msgspec

from trainer_shim import __version__, wire
from trainer_shim.allocator import AllocatorSampler
from trainer_shim.channel import Channel, StrictChannel
from trainer_shim.transport import EXIT_LINGER_MS, Transport
from trainer_shim.wandb_info import wandb_run_info

log = logging.getLogger("trainer_shim")

HEARTBEAT_S = 2.0
"""A channel with nothing to say still sends an empty batch this often, so the daemon can tell an
idle trainer from a dead one and learns the sender's drop counts."""

HELLO_REFRESH_S = 5.0
"""How often the flusher checks whether the hello changed (e.g. the trainer started a W&B run)."""

_LIVE: weakref.WeakSet[Publisher] = weakref.WeakSet()


def _coerce(obj: Any) -> Any:
    """msgspec encode hook for values that are not plain numbers: numpy scalars and CPU tensors
    become floats; a CUDA tensor is never touched (that would synchronize) and, like anything
    else unconvertible, becomes None, which the daemon rejects and counts as ``invalid_value``."""
    if getattr(obj, "is_cuda", False):
        _warn_once("cuda", "telemetry: a CUDA tensor was passed as a plain value and dropped "
                   "(it would synchronize the GPU); use telemetry.scalar(name, tensor)")
        return None
    try:
        return float(obj)
    except Exception:  # noqa: BLE001
        _warn_once(type(obj).__name__, f"telemetry: a {type(obj).__name__} is not a number and "
                   "was dropped (set DFLASH_TELEMETRY_STRICT=1 to raise at the call site)")
        return None


_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


class Publisher:
    """Publishes the records of any number of channels to one endpoint."""

    def __init__(
        self,
        endpoint: str,
        flush_interval_s: float = 0.1,
        max_pending: int = 100_000,
        strict: bool = False,
        allocator_interval_s: float = 5.0,
        wandb_run_id: str | None = None,
    ) -> None:
        """``flush_interval_s``: how often the flusher sends (seconds). ``max_pending``: records
        each channel may queue before further records are dropped and counted (``buffer_full``).
        ``allocator_interval_s``: CUDA allocator sampling period, 0 disables it."""
        if flush_interval_s <= 0:
            raise ValueError("flush_interval_s must be > 0")
        if max_pending < 1:
            raise ValueError("max_pending must be >= 1")
        self.endpoint = endpoint
        self.flush_interval_s = flush_interval_s
        self.max_pending = max_pending
        self.strict = strict
        self.wandb_run_id = wandb_run_id
        self.host = socket.gethostname()
        self.started_unix_s = time.time()
        self.internal_errors = 0
        self._allocator = AllocatorSampler(allocator_interval_s)
        self._encoder = msgspec.msgpack.Encoder(enc_hook=_coerce)
        self._channels: dict[tuple[str, str], Channel] = {}
        self._init_threading()
        _LIVE.add(self)

    def _init_threading(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._wandb: tuple[Any, ...] = ()
        self._next_hello_check = 0.0
        self._transport: Transport | None = None

    # -- public API ------------------------------------------------------------------------------

    def channel(self, role: str, worker: str, devices: list[int] | None = None) -> Channel:
        """The channel for ``(role, worker)``, created on first use (starts the flusher)."""
        key = (role, worker)
        ch = self._channels.get(key)
        if ch is not None:
            return ch
        with self._lock:
            ch = self._channels.get(key)
            if ch is None:
                cls = StrictChannel if self.strict else Channel
                ch = cls(role, worker, self.max_pending, list(devices or []))
                self._channels = {**self._channels, key: ch}
            if self._thread is None and not self._closed:
                self._start_flusher()
        return ch

    def flush(self) -> None:
        """Ask the flusher to send now. Returns at once."""
        self._wake.set()

    def close(self, linger_ms: int = EXIT_LINGER_MS) -> None:
        """Send what is queued and close, waiting at most about ``linger_ms`` plus a short grace.
        Idempotent; records published afterwards are dropped."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stopping = True
            self._linger_ms = linger_ms
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=linger_ms / 1000 + 1.0)

    def stats(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Per channel: sender id, messages and records sent, drops by reason, records queued."""
        return {
            key: {"sender": ch.sender, "seq": ch.seq, "records_total": ch.records_total,
                  "dropped": dict(ch.dropped), "pending": ch.pending()}
            for key, ch in self._channels.items()
        }

    # -- the flusher -----------------------------------------------------------------------------

    def _start_flusher(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trainer-shim-flusher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            transport = Transport(self.endpoint)
        except Exception as exc:  # noqa: BLE001 - e.g. a malformed endpoint
            self._internal_error("cannot create the transport", exc)
            self._drop_forever()
            return
        self._transport = transport
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            stopping = self._stopping
            try:
                self._flush_once(transport, time.monotonic())
            except Exception as exc:  # noqa: BLE001 - never let the flusher die
                self._internal_error("flush failed", exc)
            if stopping:
                transport.close(linger_ms=getattr(self, "_linger_ms", EXIT_LINGER_MS))
                return

    def _drop_forever(self) -> None:
        """Without a transport, keep draining so memory stays bounded; count everything."""
        while not self._stopping:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            for ch in self._channels.values():
                n = len(ch.drain())
                if n:
                    ch.dropped["transport_error"] = ch.dropped.get("transport_error", 0) + n

    def _flush_once(self, transport: Transport, now: float) -> None:
        if transport.poll_subscriptions():
            for ch in self._channels.values():
                ch.hello_due = True
        if now >= self._next_hello_check:
            self._next_hello_check = now + HELLO_REFRESH_S
            self._refresh_wandb()
        channels = self._channels
        if channels and self._allocator.due(now):
            self._allocator.sample(next(iter(channels.values())))
        live = transport.subscribers > 0
        for ch in channels.values():
            records = ch.drain()
            if not live:
                if records:
                    ch.dropped["no_receiver"] = ch.dropped.get("no_receiver", 0) + len(records)
                continue
            if ch.hello_due:
                self._send_hello(transport, ch)
            if records or now - ch.last_sent_monotonic >= HEARTBEAT_S:
                self._send_records(transport, ch, records, now)

    def _send_hello(self, transport: Transport, ch: Channel) -> None:
        run_id, project, entity, mode, primary = self._wandb or (self.wandb_run_id, None, None, None, None)
        hello = wire.Hello(
            pid=os.getpid(), host=self.host, role=ch.role, worker=ch.worker,
            shim_version=__version__, devices=ch.devices,
            thread=ch.thread, started_unix_s=self.started_unix_s,
            wandb_run_id=run_id or self.wandb_run_id, wandb_project=project,
            wandb_entity=entity, wandb_mode=mode, wandb_primary=primary,
        )
        if transport.send(wire.encode_hello(self._encoder, ch.sender, ch.seq, hello)):
            ch.seq += 1
            ch.hello_due = False

    def _send_records(self, transport: Transport, ch: Channel, records: list[Any], now: float) -> None:
        step = wire.MAX_RECORDS_PER_BATCH
        for start in range(0, max(len(records), 1), step):
            chunk = records[start:start + step]
            try:
                frame = self._encode(ch, chunk)
            except (TypeError, ValueError, OverflowError):
                chunk = self._encodable(chunk, ch)
                frame = self._encode(ch, chunk)
            if transport.send(frame):
                ch.seq += 1
                ch.records_total += len(chunk)
                ch.last_sent_monotonic = now
            else:
                ch.dropped["transport_error"] = ch.dropped.get("transport_error", 0) + len(chunk)

    def _encode(self, ch: Channel, chunk: list[Any]) -> bytes:
        return wire.encode_batch(self._encoder, ch.sender, ch.seq, ch.role, ch.worker, ch.step,
                                 ch.records_total + len(chunk), ch.dropped, chunk)

    def _encodable(self, chunk: list[Any], ch: Channel) -> list[Any]:
        """Slow path after a failed encode: keep the records that encode on their own."""
        good = []
        for rec in chunk:
            try:
                self._encoder.encode(rec)
                good.append(rec)
            except (TypeError, ValueError, OverflowError):
                ch.dropped["unencodable"] = ch.dropped.get("unencodable", 0) + 1
                _warn_once("unencodable", f"telemetry: dropped a record msgpack cannot carry: {rec!r:.200}")
        return good

    def _refresh_wandb(self) -> None:
        info = wandb_run_info()
        if info != self._wandb:
            self._wandb = info
            for ch in self._channels.values():
                ch.hello_due = True

    def _internal_error(self, what: str, exc: BaseException) -> None:
        self.internal_errors += 1
        _warn_once("internal:" + what, f"trainer_shim: {what}: {exc!r} (counted; the trainer is unaffected)")

    # -- process lifecycle -----------------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        """The child must not reuse the parent's socket, thread or records."""
        had_thread = self._thread is not None
        closed = self._closed
        if self._transport is not None:
            self._transport.abandon()
        self._init_threading()
        self._closed = closed
        for ch in self._channels.values():
            ch.reset()
        if had_thread and not closed and self._channels:
            self._start_flusher()


def _after_fork_in_child() -> None:
    for publisher in list(_LIVE):
        publisher._after_fork_in_child()


def _close_all_at_exit() -> None:
    for publisher in list(_LIVE):
        if publisher._pid == os.getpid():
            publisher.close()


def env_worker(environ: Mapping[str, str] = os.environ) -> str:
    """The worker label from ``RANK``/``LOCAL_RANK``, else the current thread's name."""
    return environ.get("RANK") or environ.get("LOCAL_RANK") or threading.current_thread().name


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_all_at_exit)
