"""The ingest thread: receiver -> decode -> sender accounting -> aggregation -> window reports.

One thread owns the socket, the registry and the aggregator, so none of them needs a lock. At
each window boundary it rolls the aggregator and hands an immutable ``IngestReport`` to
``on_window``, which must not block (exporters queue or swap references). Nothing a client sends
can raise out of this loop: bad frames and records are counted by reason.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sidecar.aggregation.aggregator import Aggregator
from sidecar.aggregation.senders import SenderRegistry, SenderState
from sidecar.model.messages import BatchMessage
from sidecar.model.window import IngestHealth, IngestReport, LabelTotals, SenderView
from sidecar.processing.mapping import Mapper
from sidecar.sources.decode import DecodeError, decode
from sidecar.sources.ledgers import EXIT_GRACE_S, LedgerDirectory
from sidecar.sources.receiver import Receiver

log = logging.getLogger("sidecar")

COALESCE_S = 0.2
"""After a poll that emptied the queue, wait this long (never past the window's end) before the
next: shims flush about ten times a second, and taking their frames a few at a time instead of
one wake-up each cut the daemon's CPU at 5,000 records/s by about a fifth. It never fires when a
poll stopped at its frame or byte cap (a backlog: with the wait, a backlog of large frames drained
at 13 frames/s instead of 98)."""


DRAIN_SHARE = 0.5
"""Of the shutdown budget, the share spent handling frames that already arrived; the rest is
for the final window roll and closing the socket (a frame's work is bounded by its size)."""


class IngestLoop:
    """Runs the receive/aggregate loop on its own thread."""

    def __init__(
        self,
        receiver: Receiver,
        interval_s: float,
        on_window: Callable[[IngestReport], None],
        on_hello: Callable[[SenderState], None] | None = None,
        max_series: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
        mapper: Mapper | None = None,
    ) -> None:
        self.receiver = receiver
        self.interval_s = interval_s
        self.on_window = on_window
        self.on_hello = on_hello
        self.aggregator = Aggregator(max_series=max_series, mapper=mapper)
        self._next_mapper: Mapper | None = None
        self.registry = SenderRegistry()
        self.ledgers = LedgerDirectory(list(getattr(receiver, "endpoints", [])))
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._generation = 0
        self._window_start = 0.0
        self._accepted_in_window = 0
        self.last_data_monotonic: float | None = None
        self.internal_errors = 0
        self._drain_deadline = float("inf")

    def start(self) -> None:
        self.ledgers.prepare()
        self._thread = threading.Thread(target=self._run, name="sidecar-ingest", daemon=True)
        self._thread.start()

    def shutdown(self, timeout_s: float = 3.0) -> bool:
        """Stop after a final window roll (so the last partial window is exported): the frame being
        handled is finished, a backlog is left. Idempotent. False if the thread is still running
        after ``timeout_s``."""
        self._drain_deadline = self.clock() + timeout_s * DRAIN_SHARE
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
            return not self._thread.is_alive()
        return True

    def _past_drain_deadline(self) -> bool:
        return self._stop.is_set() and self.clock() > self._drain_deadline

    def health(self) -> IngestHealth:
        """Internal errors survived and the age of the newest trainer data (any thread)."""
        last = self.last_data_monotonic
        return IngestHealth(self.internal_errors, None if last is None else self.clock() - last)

    def set_interval(self, interval_s: float) -> None:
        """Takes effect from the next window (config reload)."""
        self.interval_s = interval_s

    def set_mapper(self, mapper: Mapper) -> None:
        """Use ``mapper`` from the next frame on (config reload; any thread): the ingest thread
        swaps it in, so the aggregator stays single-threaded."""
        self._next_mapper = mapper

    def _run(self) -> None:
        self._window_start = self.clock()
        try:
            while not self._stop.is_set():
                timeout_ms = max(0, int((self._window_start + self.interval_s - self.clock()) * 1000))
                frames = self.receiver.poll(min(timeout_ms, 200))
                for frame, peer in zip(frames, self._peers(frames)):
                    if self._past_drain_deadline():
                        break  # a backlog must not delay the final window past the shutdown join
                    self._handle_charged(frame, peer)
                    self._roll_if_due()  # per frame: a backlog of big frames must not stretch a window
                self._roll_if_due()
                self._book_ledgers_if_due()
                if frames and not self.receiver.backlog:
                    self._stop.wait(min(COALESCE_S, max(0.0, self._window_start + self.interval_s - self.clock())))
            # What already arrived belongs to the last window, as far as the drain budget goes; what
            # still waits after it is left: its senders' next daemon counts it (before_join).
            while not self._past_drain_deadline():
                frames = self.receiver.poll(0)
                for frame, peer in zip(frames, self._peers(frames)):
                    if self._past_drain_deadline():
                        break
                    self._handle_charged(frame, peer)
                if not frames:
                    break
            now = self.clock()
            self._roll(now, max(now - self._window_start, 1e-9))
            left = " (a backlog was left unread: its senders' next daemon counts it)" if self.receiver.backlog else ""
            log.info("sidecar: final window written%s", left)
        finally:
            self.receiver.close()
            self.ledgers.close()

    def _book_ledgers_if_due(self) -> None:
        """Book the ledgers of senders that are gone (``sources.ledgers``), once the receiver is not
        behind and each of their senders has been silent for ``EXIT_GRACE_S``: its last frames,
        if any are still on the way, are counted as received first."""
        now = self.clock()
        if getattr(self.receiver, "backlog", False) or not self.ledgers.due(now):
            return
        registry = self.registry
        try:
            ready_ledgers = self.ledgers.scan(now)
            if self.ledgers.malformed:
                registry.messages_dropped["ledger_refused"] = (registry.messages_dropped.get("ledger_refused", 0)
                                                               + self.ledgers.malformed)
                self.ledgers.malformed = 0
            for ready in ready_ledgers:
                states = [registry.senders.get(c.sender) for c in ready.ledger.channels]
                if any(st is not None and now - st.last_seen < EXIT_GRACE_S for st in states):
                    continue  # it spoke lately: look again at the next scan
                registry.book_exit(ready.ledger, ready.uid, ready.final, now, time.time())
                self.ledgers.remove(ready.path)
        except Exception as exc:  # noqa: BLE001 - a bug must not stop ingest; count and go on
            self.internal_errors += 1
            registry.drop_message("internal_error")
            if self.internal_errors == 1:
                log.exception("sidecar: internal error while booking ledgers (counted, continuing): %r", exc)

    def _roll_if_due(self) -> None:
        now = self.clock()
        if now >= self._window_start + self.interval_s:
            self._roll(now, now - self._window_start)
            self._window_start = now

    def _peers(self, frames: list[bytes]) -> list[int | None]:
        peers = getattr(self.receiver, "peers", None)
        return peers if peers is not None and len(peers) == len(frames) else [None] * len(frames)

    def _handle_charged(self, frame: bytes, peer: int | None) -> None:
        """``handle_frame``, its CPU time charged to the peer's share (``receiver.FairQueue``)."""
        started = time.thread_time()
        self.handle_frame(frame, peer)
        shares = getattr(self.receiver, "shares", None)
        if shares is not None:
            shares.charge(peer, time.thread_time() - started, len(frame))

    def handle_frame(self, frame: bytes, peer_pid: int | None = None) -> None:
        """Decode, account and aggregate one frame. ``peer_pid``: the process at the other end of
        its connection, where the kernel says (ipc). Never raises."""
        registry = self.registry
        if self._next_mapper is not None:
            self.aggregator.set_mapper(self._next_mapper)
            self._next_mapper = None
        try:
            msg = decode(frame)
        except DecodeError as exc:
            registry.drop_message(exc.reason)
            return
        now = self.clock()
        try:
            if isinstance(msg, BatchMessage):
                state = registry.on_batch(msg, now, time.time(), peer_pid)
                if state is None:
                    return
                if self.aggregator.generation != self._generation:
                    self._generation = self.aggregator.generation
                    for s in registry:
                        s.cache.clear()
                rejected: dict[str, int] = {}
                owner = state.peer_pid if state.peer_pid is not None else state.sender  # the kernel's pid (ipc)
                accepted = self.aggregator.ingest(state.role, state.worker, state.cache, msg.records, rejected,
                                                  state.sender, owner)
                registry.account_ingest(state, accepted, rejected)
                self._accepted_in_window += accepted
                self.last_data_monotonic = now
            else:
                state = registry.on_hello(msg, now, peer_pid)
                if state is not None and self.on_hello is not None:
                    self.on_hello(state)
        except Exception as exc:  # noqa: BLE001 - a bug must not stop ingest; count and go on
            self.internal_errors += 1
            registry.drop_message("internal_error")
            if self.internal_errors == 1:
                log.exception("sidecar: internal error while ingesting (counted, continuing): %r", exc)

    def _roll(self, now: float, duration_s: float) -> None:
        registry = self.registry
        registry.expire(now)
        # The window's end on the unix clock at ``now`` itself (not some time later), so a silent
        # sender's last message, placed at the end less its age, is placed alike in every window.
        end_unix_s = time.time() - (self.clock() - now)
        window = self.aggregator.roll(now, end_unix_s, duration_s, [s.sender for s in registry.live(now)],
                                      registry.senders.keys())
        senders = tuple(
            SenderView(s.sender, s.role, s.worker, s.pid, s.hello, now - s.last_seen, s.records_total,
                       s.received, s.accepted, s.before_join, s.lost_in_transit, s.messages_lost,
                       dict(s.rejected), dict(s.sender_dropped), first_seen_age_s=now - s.first_seen)
            for s in registry
        )
        totals = {k: LabelTotals(v.accepted, dict(v.dropped), v.last_seen_unix_s) for k, v in registry.totals.items()}
        stats = self.receiver.stats
        dropped = dict(registry.messages_dropped)
        for reason, n in getattr(stats, "refused", {}).items():  # dropped unread by the receiver (CPU share)
            dropped[reason] = dropped.get(reason, 0) + n
        report = IngestReport(
            window, senders, totals, dropped,
            dict(self.aggregator.profile_entries_rejected), stats.frames, stats.bytes,
            stats.disconnects, self.aggregator.series_count(), self._accepted_in_window,
        )
        self._accepted_in_window = 0
        try:
            self.on_window(report)
        except Exception:  # noqa: BLE001
            self.internal_errors += 1
            log.exception("sidecar: window consumer failed (continuing)")
