"""The flush loop: one thread per publisher drains its channels, encodes, sends and keeps the tally.

The thread starts with the publisher's first channel and is the only user of the ZeroMQ socket
(``trainer_shim.transport``), created once there is something to send. Each cycle (every
``flush_interval_s``, or at once when woken) resolves the GPU scalars whose copies completed,
drains every channel and accounts for every record drained: sent, or dropped by reason. Then it
rewrites the publisher's tally (``trainer_shim.tally``) if a total changed, and gives a profiler
capture its turn. Nothing here raises: a failure is counted by the publisher
(``internal_errors``) and the loop goes on.
"""

from __future__ import annotations

import operator
import os
import threading
import time
import weakref
from typing import Protocol, SupportsIndex, cast

import msgspec

from trainer_shim import __version__, capture, exit_hooks, wire
from trainer_shim.allocator import AllocatorSampler
from trainer_shim.channel import Channel, Record, current_scalar_resolver
from trainer_shim.coerce import coerce as _coerce
from trainer_shim.coerce import warn_once as _warn_once
from trainer_shim.process_life import SIGTERM_WAIT_S, child_suffix, say_unreachable_once
from trainer_shim.tally import TallyWriter
from trainer_shim.transport import EXIT_LINGER_MS, Transport
from trainer_shim.wandb_info import WandbRunInfo, wandb_run_info

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

_TallyKey = tuple[wire.TallyEnd, bool, exit_hooks.Seen, list[tuple[object, ...]]]
"""What the tally last written said, cheaply compared: its end, whether a subscriber was there,
what ``exit_hooks`` had seen, and per channel its totals and worker label."""


class Owner(Protocol):
    """What the flush loop reads of its publisher (``trainer_shim.publisher.Publisher``): its
    settings, what its hello says (``wandb_run_id`` may change), its channels (a new dict,
    never the same one changed, when a channel is added) and where a failure is counted."""

    endpoint: str
    flush_interval_s: float
    max_pending: int
    host: str
    started_unix_s: float
    run_label: str | None
    flops_per_token: float | None
    wandb_run_id: str | None
    _channels: dict[tuple[str, str], Channel]

    def _internal_error(self, what: str, exc: BaseException) -> None: ...


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


def _safe_repr(obj: object) -> str:
    try:
        return f"{obj!r:.200}"
    except Exception:  # noqa: BLE001
        return f"<{type(obj).__name__}>"


class Flusher:
    """The flush loop of one publisher in one process (a forked child makes a new one)."""

    def __init__(self, owner: Owner, allocator: AllocatorSampler) -> None:
        """``allocator``: the publisher's CUDA allocator sampler, sampled on this thread. The
        flusher holds ``owner`` weakly (no reference cycle: a closed publisher is freed as soon
        as nothing else holds it); while it runs, its thread holds it (``start``)."""
        self._owner: Owner = weakref.proxy(owner)
        self._allocator = allocator
        self._encoder = msgspec.msgpack.Encoder(enc_hook=_coerce)
        self._accounted = 0
        self.wake = threading.Event()
        self._cycle = threading.Condition(threading.Lock())
        self._cycles_started = 0
        self._cycles_done = 0
        self.stopping = False
        self.linger_ms = EXIT_LINGER_MS
        self.exit_waits_for_subscriber = True
        """Whether the last flush may wait for a subscriber. Not in a fork child whose parent's
        socket had none after its connect grace: no daemon is there, and a DataLoader's main
        thread joins its workers at every epoch end, so their exit must not wait ``linger_ms``
        for nobody."""
        self.thread: threading.Thread | None = None
        self.wandb: WandbRunInfo = ()
        self.next_hello_check = 0.0
        self._transport: Transport | None = None
        self._transport_since = 0.0
        self._cycle_lock = threading.Lock()
        """Held by the flusher for a whole cycle (drain, send, tally): whoever else writes the
        tally (the SIGTERM handler) takes it to see every record in exactly one column."""
        self._tally = TallyWriter(owner.endpoint, owner.started_unix_s, owner.flush_interval_s, owner.max_pending)
        self._at_join: dict[int, int] = {}
        """Per sender id: its ``records_total`` when the transport last saw a subscriber join."""
        self._tally_final = False
        self._tally_key: _TallyKey | None = None

    # -- what the publisher asks of it -----------------------------------------------------------

    def start(self, owner: Owner) -> None:
        """Start the thread (the caller holds the publisher's lock and checked it is not running).
        ``owner``: this flusher's publisher, held by the thread until it ends, so that a publisher
        is never collected while its flusher runs."""
        self.thread = threading.Thread(target=self._run, args=(owner,), name="trainer-shim-flusher", daemon=True)
        self.thread.start()

    def request(self, wait_s: float) -> bool:
        """Wake the thread; with ``wait_s`` > 0 wait at most that long (seconds) for a cycle
        started after this call to drain every channel, and return whether one did."""
        with self._cycle:
            target = self._cycles_started + 1
        self.wake.set()
        if wait_s <= 0 or self.thread is None:
            return False
        deadline = time.monotonic() + wait_s
        with self._cycle:
            while self._cycles_done < target:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.thread is None or not self.thread.is_alive():
                    return False
                self._cycle.wait(remaining)
        return True

    def stop(self) -> None:
        """Let the thread run its last cycle and close the socket; wait at most about twice
        ``linger_ms`` plus a second for it (never from the thread itself)."""
        thread = self.thread
        self.stopping = True
        self.wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2 * self.linger_ms / 1000 + 1.0)

    def refresh_hello_soon(self) -> None:
        """Look at the hello (the trainer's W&B run) at the next cycle, and wake the thread."""
        self.next_hello_check = 0.0
        self.wake.set()

    def daemon_seen(self) -> bool:
        """Whether a daemon may be listening: no socket yet, a subscriber, or still within the
        connect grace (a subscription can be on its way in the first milliseconds)."""
        return (self._transport is None or self._transport.subscribers > 0
                or time.monotonic() - self._transport_since < CONNECT_GRACE_S)

    def abandon(self) -> None:
        """In a forked child: let go of the parent's socket and tally file without touching them."""
        if self._transport is not None:
            self._transport.abandon()
        self._tally.abandon()

    # -- the loop --------------------------------------------------------------------------------

    def _run(self, owner: Owner) -> None:
        transport: Transport | None = None
        broken = False  # the transport cannot be created: drain and count, never retry
        drained = True
        while True:
            # While records wait for the first subscription, look again soon.
            self.wake.wait(owner.flush_interval_s if drained else min(owner.flush_interval_s, 0.02))
            self.wake.clear()
            stopping = self.stopping
            with self._cycle:
                self._cycles_started += 1
            drained = True
            with self._cycle_lock:
                self._resolve_scalars()
                try:
                    if transport is None and not broken and any(
                        ch.pending() for ch in owner._channels.values()
                    ):
                        transport = self._connect()
                        broken = transport is None
                    if broken:
                        self._drop_all("transport_error")
                    elif transport is not None:
                        if stopping and transport.subscribers == 0 and self.exit_waits_for_subscriber:
                            transport.wait_for_subscriber(self.linger_ms)
                        drained = self._flush_once(transport, time.monotonic(), final=stopping)
                except Exception as exc:  # noqa: BLE001 - never let the flusher die
                    owner._internal_error("flush failed", exc)
                finally:
                    self._write_tally(wire.TallyEnd.RUNNING)
                    if drained:
                        with self._cycle:
                            self._cycles_done = self._cycles_started
                            self._cycle.notify_all()
            self._poll_capture(stopping)
            if stopping:
                if transport is not None:
                    transport.close(linger_ms=self.linger_ms)
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
                owner = self._owner
                run = (self.wandb[0] if self.wandb else None) or owner.wandb_run_id or owner.run_label
                capture.poll(self._tally.directory, time.monotonic(), run)
        except Exception as exc:  # noqa: BLE001 - the flusher must never die
            self._owner._internal_error("a capture request failed", exc)

    def _connect(self) -> Transport | None:
        try:
            transport = Transport(self._owner.endpoint)
        except Exception as exc:  # noqa: BLE001 - e.g. a malformed endpoint
            self._owner._internal_error(f"cannot connect to {self._owner.endpoint!r}", exc)
            return None
        self._transport = transport
        self._transport_since = time.monotonic()
        return transport

    def _drop_all(self, reason: str) -> None:
        """Drain every channel and count its records as dropped for ``reason``."""
        for ch in self._owner._channels.values():
            n = len(ch.drain())
            if n:
                ch._count_dropped(reason, n)

    def _flush_once(self, transport: Transport, now: float, final: bool = False) -> bool:
        """One flush cycle; returns False when the records were left queued (connect grace)."""
        if transport.poll_subscriptions():
            for ch in self._owner._channels.values():
                ch.hello_due = True
                self._at_join[ch.sender] = ch.records_total
        if now >= self.next_hello_check:
            self.next_hello_check = now + HELLO_REFRESH_S
            self._refresh_wandb()
        channels = self._owner._channels
        subscribed = transport.subscribers > 0
        if not subscribed and not final and now - self._transport_since < CONNECT_GRACE_S:
            return False  # just connected: let the records wait for the subscription
        if channels and self._allocator.due(now):
            try:
                self._allocator.sample(next(iter(channels.values())), now)
            except Exception as exc:  # noqa: BLE001
                self._owner._internal_error("allocator sampling failed", exc)
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
                    say_unreachable_once(self._owner.endpoint)
                return
            if ch.hello_due or now - ch.last_hello_monotonic >= HELLO_REFRESH_S:
                self._send_hello(transport, ch, now)
            if records or now - ch.last_sent_monotonic >= HEARTBEAT_S:
                step = wire.MAX_RECORDS_PER_BATCH
                for start in range(0, max(len(records), 1), step):
                    self._send_chunk(transport, ch, records[start:start + step], now)
        except Exception as exc:  # noqa: BLE001
            self._owner._internal_error("sending failed", exc)
            lost = len(records) - self._accounted
            if lost > 0:
                ch._count_dropped("internal_error", lost)

    def _send_hello(self, transport: Transport, ch: Channel, now: float, closing: bool = False) -> None:
        """Send ``ch``'s hello; ``closing``: as its last message (``wire.Hello.closing``)."""
        owner = self._owner
        run_id, project, entity, mode, primary = self.wandb or (None, None, None, None, None)
        hello = wire.Hello(
            pid=os.getpid(), host=owner.host, role=ch.role, worker=ch.worker,
            shim_version=__version__, devices=ch.devices,
            thread=ch.thread, started_unix_s=owner.started_unix_s,
            wandb_run_id=run_id or owner.wandb_run_id, wandb_project=project,
            wandb_entity=entity, wandb_mode=mode, wandb_primary=primary,
            run_label=owner.run_label, flops_per_token=owner.flops_per_token, closing=closing,
        )
        try:
            frame = wire.encode_hello(self._encoder, ch.sender, ch.seq, hello)
        except Exception as exc:  # noqa: BLE001 - e.g. odd devices: say hello without them
            owner._internal_error("cannot encode the hello", exc)
            return
        if transport.send(frame):
            ch.seq += 1
            ch.hello_due = False
            ch.last_hello_monotonic = now

    def _send_chunk(self, transport: Transport, ch: Channel, chunk: list[Record], now: float) -> None:
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

    def _encode(self, ch: Channel, chunk: list[Record]) -> bytes | None:
        try:
            return wire.encode_batch(self._encoder, ch.sender, ch.seq, ch.role, ch.worker,
                                     _header_step(ch.step), ch.records_total + len(chunk),
                                     ch.dropped, chunk)
        except Exception:  # noqa: BLE001 - TypeError, OverflowError, RecursionError...
            return None

    def _encodable(self, chunk: list[Record], ch: Channel) -> list[Record]:
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

    def _refresh_wandb(self) -> None:
        info = wandb_run_info()
        if info != self.wandb:
            self.wandb = info
            for ch in self._owner._channels.values():
                ch.hello_due = True

    def _resolve_scalars(self) -> None:
        """The GPU scalar resolver's turn of this cycle (``trainer_shim.cuda_scalar``)."""
        resolver = current_scalar_resolver()
        if resolver is not None:
            try:
                resolver.turn()
            except Exception as exc:  # noqa: BLE001 - the flusher must never die
                self._owner._internal_error("resolving GPU scalars failed", exc)

    # -- the tally -------------------------------------------------------------------------------

    def _write_tally(self, end: wire.TallyEnd) -> None:
        """Rewrite the tally if a total changed (the caller holds ``_cycle_lock``). Never raises."""
        try:
            self._write_tally_unguarded(end)
        except Exception as exc:  # noqa: BLE001 - the tally must never stop the flusher
            self._owner._internal_error("tally write failed", exc)

    def _write_tally_unguarded(self, end: wire.TallyEnd) -> None:
        if self._tally_final:
            if self._tally_key is None or self._tally_key[2] == exit_hooks.seen():
                return
            end = self._tally_key[0]  # final stays final: only what ended the process is new
        transport = self._transport
        subscribed = transport is not None and transport.subscribers > 0
        at_join = self._at_join
        channels = list(self._owner._channels.values())
        # What the tally would say, cheaply: most cycles of an idle or steady trainer change nothing.
        key: _TallyKey = (end, subscribed, exit_hooks.seen(),
                          [(ch.records_total, ch.pending(), ch._overflow, ch.worker, *ch.dropped.values())
                           for ch in channels])
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

    def tally_now(self, end: wire.TallyEnd) -> None:
        """Rewrite the tally outside the loop (a signal, an exception that ends the process),
        waiting at most ``SIGTERM_WAIT_S`` for a flush cycle in progress; written even if that
        wait runs out (the cycle never blocks, and its own write then follows)."""
        got = self._cycle_lock.acquire(timeout=SIGTERM_WAIT_S)
        try:
            self._write_tally(end)
        finally:
            if got:
                self._cycle_lock.release()

    def tally_if_free(self, end: wire.TallyEnd) -> None:
        """Rewrite the tally if no flush cycle holds it after ``SIGTERM_WAIT_S`` (whose own
        write then tells it)."""
        if not self._cycle_lock.acquire(timeout=SIGTERM_WAIT_S):
            return
        try:
            self._write_tally(end)
        finally:
            self._cycle_lock.release()
