"""The publisher: owns the channels, the flusher thread and the transport of one process.

Lifecycle: created idle; the flusher thread (and with it the ZeroMQ context and socket) starts
with the first channel, so constructing a publisher costs nothing and the socket is only ever
touched by that one thread. ``close()`` is idempotent and bounded. A forked child gets a clean
publisher (new sender ids, no inherited records, a new socket); at interpreter exit the last batch
goes out with a short linger, each channel's closing hello after it (the daemon counts the sender
gone at once). After every flush cycle the publisher's totals go to its tally
(``trainer_shim.tally``), and a SIGTERM handler writes the final one, so the daemon can book what
never arrived once the process is gone.
"""

from __future__ import annotations

import atexit
import logging
import operator
import os
import signal
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, SupportsIndex, cast

import msgspec

from trainer_shim import __version__, capture, exit_hooks, wire
from trainer_shim.allocator import AllocatorSampler
from trainer_shim.channel import Channel, StrictChannel, current_scalar_resolver
from trainer_shim.coerce import coerce as _coerce
from trainer_shim.coerce import warn_once as _warn_once
from trainer_shim.run_label import MAX_LABEL_CHARS, check_flops, flops_from_env
from trainer_shim.run_label import run_label as env_run_label
from trainer_shim.tally import TallyWriter
from trainer_shim.transport import EXIT_LINGER_MS, Transport
from trainer_shim.wandb_info import wandb_run_info

log = logging.getLogger("trainer_shim")

HEARTBEAT_S = 2.0
"""A channel with nothing to say still sends an empty batch this often, so the daemon can tell an
idle trainer from a dead one and learns the sender's drop counts."""

HELLO_REFRESH_S = 5.0
"""Each channel repeats its hello this often, and the flusher checks this often whether the hello
changed (e.g. the trainer started a W&B run); a changed hello goes out at once."""

CONNECT_GRACE_S = 0.5
"""After the socket is created, records wait this long for a subscriber before they are dropped
as ``no_receiver``: connecting and subscribing take a few milliseconds even when the daemon is up."""

_MAX_STEP = 2**63 - 1

_PUBLISHERS: weakref.WeakSet[Publisher] = weakref.WeakSet()
"""Every publisher of this process not yet garbage collected (closed ones included)."""


def _header_step(step: object) -> int | None:
    """The last published step if it is a usable int, else None: a bad ``step`` argument must
    never make the whole batch undecodable."""
    if type(step) is int:
        return step if 0 <= step <= _MAX_STEP else None
    if step is None or isinstance(step, bool):
        return None
    try:
        value = operator.index(cast(SupportsIndex, step))  # numpy integers; anything else raises
    except Exception:  # noqa: BLE001
        return None
    return value if 0 <= value <= _MAX_STEP else None


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
        run_label: str | None = None,
        flops_per_token: float | None = None,
    ) -> None:
        """``flush_interval_s``: how often the flusher sends (seconds). ``max_pending``: records
        each channel may queue (and, separately, ``publish`` snapshots) before further ones are
        dropped and counted (``buffer_full``).
        ``allocator_interval_s``: CUDA allocator sampling period, 0 disables it. ``run_label`` and
        ``flops_per_token``: said in the hello; unset, from the environment
        (``trainer_shim.run_label``). Raises ``ValueError`` for a non-positive interval or
        ``max_pending``, or FLOPs per token outside 1 to 1e18; never for the endpoint (a bad
        endpoint is counted at run time as ``transport_error``)."""
        if not flush_interval_s > 0:
            raise ValueError("flush_interval_s must be > 0")
        if max_pending < 1:
            raise ValueError("max_pending must be >= 1")
        self.endpoint = endpoint
        self.flush_interval_s = flush_interval_s
        self.max_pending = max_pending
        self.strict = strict
        self.wandb_run_id = wandb_run_id
        label = str(run_label).strip()[:MAX_LABEL_CHARS] if run_label is not None else env_run_label()
        self.run_label = label or None
        self.flops_per_token = check_flops(flops_per_token) if flops_per_token is not None else flops_from_env()
        self.host = socket.gethostname()
        self.started_unix_s = time.time()
        self.internal_errors = 0
        self._allocator = AllocatorSampler(allocator_interval_s)
        self._encoder = msgspec.msgpack.Encoder(enc_hook=_coerce)
        self._channels: dict[tuple[str, str], Channel] = {}
        self._accounted = 0
        self._init_threading()
        _PUBLISHERS.add(self)
        _register_multiprocessing_exit(self)

    def _init_threading(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._cycle = threading.Condition(threading.Lock())
        self._cycles_started = 0
        self._cycles_done = 0
        self._stopping = False
        self._closed = False
        self._close_hooks: list[Callable[[], None]] = []
        self._linger_ms = EXIT_LINGER_MS
        self._exit_waits_for_subscriber = True
        """Whether the last flush may wait for a subscriber. Not in a fork child whose parent's
        socket had none after its connect grace: no daemon is there, and a DataLoader's main
        thread joins its workers at every epoch end, so their exit must not wait ``linger_ms``
        for nobody."""
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._wandb: tuple[Any, ...] = ()
        self._next_hello_check = 0.0
        self._transport: Transport | None = None
        self._transport_since = 0.0
        self._cycle_lock = threading.Lock()
        """Held by the flusher for a whole cycle (drain, send, tally): whoever else writes the
        tally (the SIGTERM handler) takes it to see every record in exactly one column."""
        self._tally = TallyWriter(self.endpoint, self.started_unix_s, self.flush_interval_s, self.max_pending)
        self._at_join: dict[int, int] = {}
        """Per sender id: its ``records_total`` when the transport last saw a subscriber join."""
        self._tally_final = False
        self._tally_key: Any = None

    # -- public API ------------------------------------------------------------------------------

    def channel(self, role: str, worker: str, devices: list[int] | None = None,
                default_worker: bool = False) -> Channel:
        """The channel for ``(role, worker)``, created on first use (starts the flusher; the
        socket is only created once there is something to send). ``default_worker``: the
        label came from the environment, not from the caller; in a multiprocessing child
        (spawn, forkserver) such a label gets the child's suffix (see ``child_suffix``)."""
        key = (role, worker)
        ch = self._channels.get(key)
        if ch is not None:
            return ch
        with self._lock:
            ch = self._channels.get(key)
            if ch is None:
                cls = StrictChannel if self.strict else Channel
                ch = cls(role, worker, self.max_pending, list(devices or []))
                ch.relabel = default_worker and _in_multiprocessing_child()
                self._channels = {**self._channels, key: ch}
            if self._thread is None and not self._closed:
                self._start_flusher()
        return ch

    def flush(self, wait_s: float = 0.0) -> bool:
        """Ask the flusher to send what is queued now. Returns at once unless ``wait_s`` > 0:
        then waits at most ``wait_s`` seconds for a flush that started after this call to drain
        every channel (sent, or dropped and counted), and returns whether it did. "Sent" means
        handed to ZeroMQ, whose I/O thread writes it shortly after: True does not say the daemon
        read it (PUB/SUB has no acknowledgement; ``stats()`` has the drops). What never arrives
        is booked by the daemon from the batches' counters, or from this process's tally once it
        is gone (docs/RELIABILITY.md). Before ``os._exit`` use ``close()``, which lingers until
        the data is written. Right after the socket is created a flush may wait up to
        ``CONNECT_GRACE_S`` for the daemon's subscription."""
        with self._cycle:
            target = self._cycles_started + 1
        self._wake.set()
        if wait_s <= 0 or self._thread is None:
            return False
        deadline = time.monotonic() + wait_s
        with self._cycle:
            while self._cycles_done < target:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._thread is None or not self._thread.is_alive():
                    return False
                self._cycle.wait(remaining)
        return True

    def close(self, linger_ms: int = EXIT_LINGER_MS) -> None:
        """Send what is queued and close, waiting at most about twice ``linger_ms`` plus a short
        grace: up to ``linger_ms`` for a subscriber if none is connected yet, then up to
        ``linger_ms`` for unsent frames. Idempotent; records published afterwards stay queued
        (bounded by ``max_pending``) and are never sent. Scalars whose GPU copy has not completed
        are counted as dropped (``scalar_unresolved``): close never waits for the GPU. The
        ``on_close`` callbacks run first."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._linger_ms = linger_ms
            thread = self._thread
            hooks, self._close_hooks = self._close_hooks, []
        for hook in hooks:
            try:
                hook()
            except Exception as exc:  # noqa: BLE001 - closing goes on
                self._internal_error("a close callback", exc)
        self._settle_scalars()
        self._stopping = True
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2 * linger_ms / 1000 + 1.0)

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once, when this publisher closes (at once if it is closed)."""
        with self._lock:
            if not self._closed:
                self._close_hooks.append(callback)
                return
        callback()

    def refresh_wandb(self, run_id: str | None = None) -> None:
        """Look for the trainer's W&B run at the next flush instead of within
        ``HELLO_REFRESH_S`` (a framework callback calls this once the run exists).
        ``run_id``: announce this id when ``wandb.run`` is not visible (another process owns
        the run)."""
        if run_id:
            self.wandb_run_id = run_id
            for ch in self._channels.values():
                ch.hello_due = True
        self._next_hello_check = 0.0
        self._wake.set()

    def stats(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Per channel: sender id, messages and records sent, drops by reason, records queued."""
        return {
            key: {"sender": ch.sender, "seq": ch.seq, "records_total": ch.records_total,
                  "dropped": dict(ch.dropped), "pending": ch.pending()}
            for key, ch in self._channels.items()
        }

    # -- the flusher -----------------------------------------------------------------------------

    def _start_flusher(self) -> None:
        _install_signal_handlers()
        exit_hooks.install_excepthook()
        self._thread = threading.Thread(target=self._run, name="trainer-shim-flusher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        transport: Transport | None = None
        broken = False  # the transport cannot be created: drain and count, never retry
        drained = True
        while True:
            # While records wait for the first subscription, look again soon.
            self._wake.wait(self.flush_interval_s if drained else min(self.flush_interval_s, 0.02))
            self._wake.clear()
            stopping = self._stopping
            with self._cycle:
                self._cycles_started += 1
            drained = True
            with self._cycle_lock:
                self._resolve_scalars()
                try:
                    if transport is None and not broken and any(
                        ch.pending() for ch in self._channels.values()
                    ):
                        transport = self._connect()
                        broken = transport is None
                    if broken:
                        self._drop_all("transport_error")
                    elif transport is not None:
                        if stopping and transport.subscribers == 0 and self._exit_waits_for_subscriber:
                            transport.wait_for_subscriber(self._linger_ms)
                        drained = self._flush_once(transport, time.monotonic(), final=stopping)
                except Exception as exc:  # noqa: BLE001 - never let the flusher die
                    self._internal_error("flush failed", exc)
                finally:
                    self._write_tally(wire.TallyEnd.RUNNING)
                    if drained:
                        with self._cycle:
                            self._cycles_done = self._cycles_started
                            self._cycle.notify_all()
            self._poll_capture(stopping)
            if stopping:
                if transport is not None:
                    transport.close(linger_ms=self._linger_ms)
                with self._cycle_lock:
                    self._write_tally(wire.TallyEnd.CLOSED)
                return

    def _poll_capture(self, stopping: bool) -> None:
        """A profiler capture's turn of this cycle (``trainer_shim.capture``): a request looked
        for, a result written; at close, the trace nobody took removed. Never raises."""
        try:
            if stopping:
                capture.remove_own_files(self._tally.directory)
            else:
                run = (self._wandb[0] if self._wandb else None) or self.wandb_run_id or self.run_label
                capture.poll(self._tally.directory, time.monotonic(), run)
        except Exception as exc:  # noqa: BLE001 - the flusher must never die
            self._internal_error("a capture request failed", exc)

    def _connect(self) -> Transport | None:
        try:
            transport = Transport(self.endpoint)
        except Exception as exc:  # noqa: BLE001 - e.g. a malformed endpoint
            self._internal_error(f"cannot connect to {self.endpoint!r}", exc)
            return None
        self._transport = transport
        self._transport_since = time.monotonic()
        return transport

    def _drop_all(self, reason: str) -> None:
        """Drain every channel and count its records as dropped for ``reason``."""
        for ch in self._channels.values():
            n = len(ch.drain())
            if n:
                ch._count_dropped(reason, n)

    def _flush_once(self, transport: Transport, now: float, final: bool = False) -> bool:
        """One flush cycle; returns False when the records were left queued (connect grace)."""
        if transport.poll_subscriptions():
            for ch in self._channels.values():
                ch.hello_due = True
                self._at_join[ch.sender] = ch.records_total
        if now >= self._next_hello_check:
            self._next_hello_check = now + HELLO_REFRESH_S
            self._refresh_wandb()
        channels = self._channels
        subscribed = transport.subscribers > 0
        if not subscribed and not final and now - self._transport_since < CONNECT_GRACE_S:
            return False  # just connected: let the records wait for the subscription
        if channels and self._allocator.due(now):
            try:
                self._allocator.sample(next(iter(channels.values())), now)
            except Exception as exc:  # noqa: BLE001
                self._internal_error("allocator sampling failed", exc)
        for ch in channels.values():
            self._flush_channel(transport, ch, now, subscribed)
            if final and subscribed:  # after its last batch: the daemon stops counting it live at once
                self._send_hello(transport, ch, now, closing=True)
        return True

    def _flush_channel(self, transport: Transport, ch: Channel, now: float, subscribed: bool) -> None:
        """Drain one channel and account for every record drained: sent (``records_total``) or
        dropped by reason, also when something unexpected fails."""
        if ch.relabel:
            ch.relabel = False
            ch.worker = f"{ch.worker}/{child_suffix()}"
        records = ch.drain()
        self._accounted = 0
        try:
            if not subscribed:
                if records:
                    ch._count_dropped("no_receiver", len(records))
                    self._accounted = len(records)
                    _say_unreachable_once(self.endpoint)
                return
            if ch.hello_due or now - ch.last_hello_monotonic >= HELLO_REFRESH_S:
                self._send_hello(transport, ch, now)
            if records or now - ch.last_sent_monotonic >= HEARTBEAT_S:
                step = wire.MAX_RECORDS_PER_BATCH
                for start in range(0, max(len(records), 1), step):
                    self._send_chunk(transport, ch, records[start:start + step], now)
        except Exception as exc:  # noqa: BLE001
            self._internal_error("sending failed", exc)
            lost = len(records) - self._accounted
            if lost > 0:
                ch._count_dropped("internal_error", lost)

    def _send_hello(self, transport: Transport, ch: Channel, now: float, closing: bool = False) -> None:
        """Send ``ch``'s hello; ``closing``: as its last message (``wire.Hello.closing``)."""
        run_id, project, entity, mode, primary = self._wandb or (None, None, None, None, None)
        hello = wire.Hello(
            pid=os.getpid(), host=self.host, role=ch.role, worker=ch.worker,
            shim_version=__version__, devices=ch.devices,
            thread=ch.thread, started_unix_s=self.started_unix_s,
            wandb_run_id=run_id or self.wandb_run_id, wandb_project=project,
            wandb_entity=entity, wandb_mode=mode, wandb_primary=primary,
            run_label=self.run_label, flops_per_token=self.flops_per_token, closing=closing,
        )
        try:
            frame = wire.encode_hello(self._encoder, ch.sender, ch.seq, hello)
        except Exception as exc:  # noqa: BLE001 - e.g. odd devices: say hello without them
            self._internal_error("cannot encode the hello", exc)
            return
        if transport.send(frame):
            ch.seq += 1
            ch.hello_due = False
            ch.last_hello_monotonic = now

    def _send_chunk(self, transport: Transport, ch: Channel, chunk: list[Any], now: float) -> None:
        """Encode and send ``chunk`` as one BATCH (or several when the frame would exceed
        ``wire.MAX_MESSAGE_BYTES``). Accounts every record; never raises."""
        frame = self._encode(ch, chunk)
        if frame is None:
            chunk = self._encodable(chunk, ch)
            frame = self._encode(ch, chunk)
            if frame is None:  # the header itself: cannot happen with a sanitized step
                ch._count_dropped("unencodable", len(chunk))
                self._accounted += len(chunk)
                return
        if len(frame) > wire.MAX_MESSAGE_BYTES:
            if len(chunk) == 1:
                ch._count_dropped("oversized")
                self._accounted += 1
                _warn_once("oversized", f"telemetry: dropped a record of {len(frame)} bytes "
                           f"(the daemon accepts messages up to {wire.MAX_MESSAGE_BYTES})")
                return
            half = len(chunk) // 2
            self._send_chunk(transport, ch, chunk[:half], now)
            self._send_chunk(transport, ch, chunk[half:], now)
            return
        if transport.send(frame):
            ch.seq += 1
            ch.records_total += len(chunk)
            ch.last_sent_monotonic = now
        else:
            ch._count_dropped("transport_error", len(chunk))
        self._accounted += len(chunk)

    def _encode(self, ch: Channel, chunk: list[Any]) -> bytes | None:
        try:
            return wire.encode_batch(self._encoder, ch.sender, ch.seq, ch.role, ch.worker,
                                     _header_step(ch.step), ch.records_total + len(chunk),
                                     ch.dropped, chunk)
        except Exception:  # noqa: BLE001 - TypeError, OverflowError, RecursionError...
            return None

    def _encodable(self, chunk: list[Any], ch: Channel) -> list[Any]:
        """Slow path after a failed encode: keep the records that encode on their own."""
        good = []
        for rec in chunk:
            try:
                self._encoder.encode(rec)
                good.append(rec)
            except Exception:  # noqa: BLE001
                ch._count_dropped("unencodable")
                self._accounted += 1
                _warn_once("unencodable", f"telemetry: dropped a record msgpack cannot carry: "
                           f"{_safe_repr(rec)}")
        return good

    def _write_tally(self, end: wire.TallyEnd) -> None:
        """Rewrite the tally if a total changed (the caller holds ``_cycle_lock``). Never raises."""
        try:
            self._write_tally_unguarded(end)
        except Exception as exc:  # noqa: BLE001 - the tally must never stop the flusher
            self._internal_error("tally write failed", exc)

    def _write_tally_unguarded(self, end: wire.TallyEnd) -> None:
        if self._tally_final:
            if self._tally_key is None or self._tally_key[2] == exit_hooks.seen():
                return
            end = self._tally_key[0]  # final stays final: only what ended the process is new
        transport = self._transport
        subscribed = transport is not None and transport.subscribers > 0
        at_join = self._at_join
        channels = list(self._channels.values())
        # What the tally would say, cheaply: most cycles of an idle or steady trainer change nothing.
        key = (end, subscribed, exit_hooks.seen(),
               [(ch.records_total, ch.pending(), ch._overflow, ch.worker, *ch.dropped.values()) for ch in channels])
        if key == self._tally_key:
            return
        if self._tally.path is None and not any(ch.records_total or ch.pending() or ch._overflow or ch.dropped
                                                 for ch in channels):
            return  # nothing made, nothing to account: no file (a forked child that never publishes)
        entries = []
        for ch in channels:
            dropped = dict(ch.dropped)
            overflow = ch._overflow  # records refused since the last drain, not yet in ``dropped``
            if overflow:
                dropped["buffer_full"] = dropped.get("buffer_full", 0) + overflow
            entries.append(wire.TallyChannel(ch.sender, ch.role, ch.worker, ch.records_total, ch.pending(),
                                              at_join.get(ch.sender, 0), subscribed, dropped))
        if self._tally.write(entries, end, time.monotonic()):
            self._tally_key = key
            self._tally_final = end != wire.TallyEnd.RUNNING

    def _tally_at_sigterm(self, final: bool) -> None:
        """The SIGTERM handler's snapshot: every record in exactly one column (sent, dropped,
        queued), waiting at most ``SIGTERM_WAIT_S`` for a flush cycle in progress. ``final``: the
        process is about to die of the signal (a handler of the trainer's own might not exit)."""
        got = self._cycle_lock.acquire(timeout=SIGTERM_WAIT_S)
        try:
            self._write_tally(wire.TallyEnd.SIGTERM if final else wire.TallyEnd.RUNNING)
        finally:
            if got:
                self._cycle_lock.release()

    def _tally_on_seen(self) -> None:
        """An exception that ends the process (or a thread) was seen: rewrite the tally now, final
        or not, so that a process that then dies without a final one still tells it. Waits at most
        ``SIGTERM_WAIT_S`` for a flush cycle in progress (whose own write then tells it)."""
        if self._pid != os.getpid() or not self._cycle_lock.acquire(timeout=SIGTERM_WAIT_S):
            return
        try:
            self._write_tally(wire.TallyEnd.RUNNING)
        finally:
            self._cycle_lock.release()

    def _refresh_wandb(self) -> None:
        info = wandb_run_info()
        if info != self._wandb:
            self._wandb = info
            for ch in self._channels.values():
                ch.hello_due = True

    def _resolve_scalars(self) -> None:
        """The GPU scalar resolver's turn of this cycle (``trainer_shim.cuda_scalar``)."""
        resolver = current_scalar_resolver()
        if resolver is not None:
            try:
                resolver.turn()
            except Exception as exc:  # noqa: BLE001 - the flusher must never die
                self._internal_error("resolving GPU scalars failed", exc)

    def _settle_scalars(self) -> None:
        """Publish the GPU scalars whose copies completed; count the others as dropped."""
        resolver = current_scalar_resolver()
        if resolver is None:
            return
        try:
            resolver.resolve_ready()
            resolver.abandon_pending(set(self._channels.values()))
        except Exception as exc:  # noqa: BLE001
            self._internal_error("settling GPU scalars failed", exc)

    def _internal_error(self, what: str, exc: BaseException) -> None:
        self.internal_errors += 1
        _warn_once("internal:" + what, f"trainer_shim: {what}: {exc!r} (counted; the trainer is unaffected)")

    # -- process lifecycle -----------------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        """The child must not reuse the parent's socket, thread or records. Its flusher starts
        again, but it connects only once the child publishes something."""
        had_thread = self._thread is not None
        closed = self._closed
        # "No daemon" only once the parent's socket has waited its connect grace in vain: a
        # subscription can still be on its way in the first milliseconds after connecting.
        daemon_seen = (self._transport is None or self._transport.subscribers > 0
                       or time.monotonic() - self._transport_since < CONNECT_GRACE_S)
        if self._transport is not None:
            self._transport.abandon()
        self._tally.abandon()
        self._init_threading()
        self._closed = closed
        self._exit_waits_for_subscriber = daemon_seen
        for ch in self._channels.values():
            ch.reset()
            ch.relabel = True
        if had_thread and not closed and self._channels:
            self._start_flusher()
        _register_multiprocessing_exit(self)

    def _close_at_process_exit(self) -> None:
        """multiprocessing's exit path (``util._exit_function``, run before ``os._exit`` in
        every multiprocessing child): send what is queued, bounded like ``close``."""
        if self._pid == os.getpid():
            exit_hooks.note_in_flight()  # the exception or SystemExit leaving the child's run()
            self.close()


SIGTERM_WAIT_S = 0.5
"""The SIGTERM handler waits at most this long for a flush cycle in progress (a cycle never
blocks: its sends are non-blocking)."""

SIGTERM_ENV = "DFLASH_TELEMETRY_SIGTERM"
"""Set to ``0`` to leave SIGTERM and SIGINT alone (then a SIGTERMed process is booked as
``ended_unclean``, its end as ``unclean``)."""

_signal_state: dict[str, Any] = {"pid": None, "previous": {}}
"""Per signal number, the handler the shim's replaced (and chains to)."""


def _install_signal_handlers() -> None:
    """Once per process, from the main thread only: handlers for SIGTERM and SIGINT that note the
    signal (``exit_hooks``), write every publisher's final tally and then let the signal do
    what it did before: with the default disposition the process still dies of it (the handler
    restores it and re-raises), a Python handler of the trainer's own is called next. Never over
    SIG_IGN or a handler installed from C, off the main thread (Python cannot), or with
    ``DFLASH_TELEMETRY_SIGTERM=0``; never over Python's own SIGINT handler (code such as
    ``asyncio.run`` checks for it: its ``KeyboardInterrupt`` is told by ``exit_hooks`` instead).
    Caveat (docs/RELIABILITY.md): a Python handler runs between bytecodes, so a signal that
    arrives while the main thread is inside one long C call takes effect when that call returns."""
    pid = os.getpid()
    if _signal_state["pid"] == pid or os.environ.get(SIGTERM_ENV, "1") == "0":
        return
    if threading.current_thread() is not threading.main_thread():
        return
    _signal_state["pid"] = pid
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            previous = signal.getsignal(signum)
            if previous is _on_signal:  # inherited across fork
                continue
            if previous is signal.default_int_handler or (previous is not signal.SIG_DFL and not callable(previous)):
                continue
            signal.signal(signum, _on_signal)
            _signal_state["previous"][int(signum)] = previous
        except Exception as exc:  # noqa: BLE001 - e.g. an embedded interpreter without signals
            log.debug("trainer_shim: no handler for signal %s: %r", int(signum), exc)


def _on_signal(signum: int, frame: Any) -> None:
    previous = _signal_state["previous"].get(signum, signal.SIG_DFL)
    chained = callable(previous) and previous not in (signal.SIG_DFL, signal.SIG_IGN)
    # Called from a handler installed over ours (Lightning's, or any that calls the previous
    # handler when it is callable): where we replaced SIG_DFL there was nothing to call, so the
    # process's fate is that handler's, never ours.
    kills = not chained and signal.getsignal(signum) is _on_signal
    try:
        exit_hooks.note_signal(signum)
        for publisher in list(_PUBLISHERS):
            if publisher._pid == os.getpid():
                publisher._tally_at_sigterm(final=kills)
    except Exception:  # noqa: BLE001 - the signal must still take effect
        pass
    if chained:
        previous(signum, frame)
        return
    if not kills:
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _safe_repr(obj: object) -> str:
    try:
        return f"{obj!r:.200}"
    except Exception:  # noqa: BLE001
        return f"<{type(obj).__name__}>"


def child_suffix() -> str:
    """What a child process adds to its parent's worker label: ``loader<id>`` in a DataLoader
    worker (read only if the trainer imported torch), else ``pid<pid>``."""
    data = sys.modules.get("torch.utils.data")
    try:
        info = data.get_worker_info() if data is not None else None
    except Exception:  # noqa: BLE001
        info = None
    if info is not None:
        return f"loader{info.id}"
    return f"pid{os.getpid()}"


def _in_multiprocessing_child() -> bool:
    process = sys.modules.get("multiprocessing.process")
    try:
        return process is not None and process.parent_process() is not None
    except Exception:  # noqa: BLE001
        return False


_said_unreachable: list[int] = []
"""The pid that said it reaches no daemon (a forked child says so again, for itself)."""


def _say_unreachable_once(endpoint: str) -> None:
    """In a multiprocessing child, say once on stderr that records are being dropped because
    nothing subscribed at ``endpoint`` (its parent may have configured an endpoint the child
    never learnt of; the drops are counted as ``no_receiver``)."""
    pid = os.getpid()
    if pid in _said_unreachable or not _in_multiprocessing_child():
        return
    _said_unreachable[:] = [pid]
    try:
        sys.stderr.write(f"trainer_shim: process {pid} reaches no daemon at {endpoint}: its "
                         "records are dropped and counted (no_receiver); set "
                         "DFLASH_SIDECAR_ENDPOINT or call telemetry.configure(endpoint=...) "
                         "before starting children\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - no stderr: the count still says it
        pass


def _register_multiprocessing_exit(publisher: Publisher) -> None:
    """Have multiprocessing's exit path close ``publisher``: its children end with ``os._exit``
    after ``util._exit_function`` has run the registered finalizers, skipping ``atexit``. A
    child's ``_bootstrap`` clears the finalizers it inherited and then runs the after-fork
    hooks, so the finalizer is registered now (for this process) and again from an after-fork
    hook (for its multiprocessing children). Only if the trainer imported multiprocessing."""
    util = sys.modules.get("multiprocessing.util")
    if util is None:
        return
    try:
        util.Finalize(publisher, _close_if_alive, args=(weakref.ref(publisher),),
                      exitpriority=100)
        util.register_after_fork(publisher, _register_multiprocessing_exit)
    except Exception as exc:  # noqa: BLE001
        publisher._internal_error("cannot register with multiprocessing", exc)


def _close_if_alive(ref: weakref.ref[Publisher]) -> None:
    publisher = ref()
    if publisher is not None:
        publisher._close_at_process_exit()


def _after_fork_in_child() -> None:
    for publisher in list(_PUBLISHERS):
        publisher._after_fork_in_child()


def owner_of(channel: Channel) -> Publisher | None:
    """The publisher of this process that made ``channel``, or None."""
    for publisher in list(_PUBLISHERS):
        if any(ch is channel for ch in publisher._channels.values()):
            return publisher
    return None


def _tally_all_on_seen() -> None:
    for publisher in list(_PUBLISHERS):
        publisher._tally_on_seen()


def _close_all_at_exit() -> None:
    for publisher in list(_PUBLISHERS):
        if publisher._pid == os.getpid():
            publisher.close()


def env_worker(environ: Mapping[str, str] = os.environ) -> str:
    """The worker label from ``RANK``/``LOCAL_RANK``, else the current thread's name."""
    return environ.get("RANK") or environ.get("LOCAL_RANK") or threading.current_thread().name


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_all_at_exit)
exit_hooks.on_seen(_tally_all_on_seen)
