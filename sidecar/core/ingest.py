"""The ingest thread: it takes frames from the receiver and drives ``sidecar.core.pipeline.Pipeline``.

One thread owns the socket and the pipeline (its registry and aggregator), so none of them needs
a lock. This module decides *when* (polling, coalescing, window boundaries, the final drain, the
exit tallies); the pipeline decides what happens to a frame, a window and a gone sender's tally.
Nothing a client sends can raise out of this loop: bad frames and records are counted by reason.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sidecar.aggregation.settings import WindowSettings
from sidecar.core.pipeline import Pipeline
from sidecar.model.liveness import GONE_AFTER_S
from sidecar.model.window import IngestHealth
from sidecar.sources.receiver import Receiver
from sidecar.sources.tallies import TallyDirectory

log = logging.getLogger("sidecar")

COALESCE_S = 0.2
"""After a poll that emptied the queue, wait this long (never past the window's end) before the
next: shims flush about ten times a second, and taking their frames a few at a time instead of
one wake-up each cut the daemon's CPU at 5,000 records/s by about a fifth. It never fires when a
poll stopped at its frame or byte cap (a backlog: with the wait, a backlog of large frames drained
at 13 frames/s instead of 98)."""


DRAIN_QUIET_MS = 100
"""At shutdown, once the queue is first found empty, the drain waits this long (ms, once, within
the drain's share) for one more frame: a sender that closed just before (the demo's, a job
script's) may have its last frames in the kernel or in ZeroMQ's I/O thread, not yet readable;
reconciled at once, they were lost at its exit."""
DRAIN_SHARE = 0.5
"""Of the shutdown budget, the share spent handling frames that already arrived; the rest is
for the final window roll and closing the socket (a frame's work is bounded by its size)."""


class IngestLoop:
    """Runs the receive/aggregate loop on its own thread."""

    def __init__(self, receiver: Receiver, interval_s: float, pipeline: Pipeline,
                 clock: Callable[[], float] = time.monotonic, gone_after_s: float = GONE_AFTER_S) -> None:
        """``gone_after_s``: how long a gone (or closed) sender's tally waits, its senders silent,
        before it is reconciled and its end told (``model.liveness.GONE_AFTER_S``)."""
        self.receiver = receiver
        self.gone_after_s = gone_after_s
        self.interval_s = interval_s
        self.pipeline = pipeline
        self.tallies = TallyDirectory(list(receiver.endpoints))
        self.started_unix_s = time.time()
        """A tally last written before this is of a process that ended before this daemon ran."""
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._window_start = 0.0
        self._drain_deadline = float("inf")

    def start(self) -> None:
        self.tallies.prepare()
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
        return self.pipeline.health()

    def reload(self, settings: WindowSettings) -> None:
        """The window length (``interval``) from the next window on (a config reload)."""
        self.interval_s = settings.interval

    def _run(self) -> None:
        self._window_start = self.clock()
        try:
            while not self._stop.is_set():
                timeout_ms = max(0, int((self._window_start + self.interval_s - self.clock()) * 1000))
                frames = self.receiver.poll(min(timeout_ms, 200))
                for frame, peer in frames:
                    if self._past_drain_deadline():
                        break  # a backlog must not delay the final window past the shutdown join
                    self._handle_charged(frame, peer)
                    self._roll_if_due()  # per frame: a backlog of big frames must not stretch a window
                self._roll_if_due()
                self._reconcile_tallies_if_due()
                if frames and not self.receiver.backlog:
                    self._stop.wait(min(COALESCE_S, max(0.0, self._window_start + self.interval_s - self.clock())))
            # What already arrived belongs to the last window, as far as the drain budget goes; what
            # still waits after it is left: its senders' next daemon counts it (before_join).
            waited = False
            while not self._past_drain_deadline():
                frames = self.receiver.poll(0)
                if not frames and not waited:  # once: frames of a sender that closed just before
                    waited, frames = True, self.receiver.poll(DRAIN_QUIET_MS)
                for frame, peer in frames:
                    if self._past_drain_deadline():
                        break
                    self._handle_charged(frame, peer)
                if not frames:
                    break
            if not self.receiver.backlog:
                # Everything that arrived is counted: the senders that ended can be reconciled now, not
                # after a grace that would outlast this daemon (their next daemon would read the
                # records as sent to it and lost).
                self._reconcile_tallies(grace_s=0.0)
            now = self.clock()
            self._roll(now, max(now - self._window_start, 1e-9))
            left = " (a backlog was left unread: its senders' next daemon counts it)" if self.receiver.backlog else ""
            log.info("sidecar: final window written%s", left)
        finally:
            self.receiver.close()
            self.tallies.close()

    def _reconcile_tallies_if_due(self) -> None:
        """Reconcile the tallies of senders that are gone (``sources.tallies``), once the receiver is not
        behind and each of their senders has been silent for ``gone_after_s``: its last frames,
        if any are still on the way, are counted as received first."""
        if self.receiver.backlog or not self.tallies.due(self.clock()):
            return
        self._reconcile_tallies(self.gone_after_s)

    def _reconcile_tallies(self, grace_s: float) -> None:
        now = self.clock()
        try:
            ready_tallies, malformed = self.tallies.scan(now, grace_s)
            if malformed:
                self.pipeline.refuse_tallies(malformed)
            for ready in ready_tallies:
                witnessed = ready.written_unix_s >= self.started_unix_s
                if self.pipeline.reconcile_gone(ready, now, grace_s, witnessed):
                    self.tallies.remove(ready.path)
                # else one of its senders spoke lately: look again at the next scan
        except Exception as exc:  # noqa: BLE001 - a bug must not stop ingest; count and go on
            self.pipeline.internal_error("reconciling tallies", exc)

    def _roll_if_due(self) -> None:
        now = self.clock()
        if now >= self._window_start + self.interval_s:
            self._roll(now, now - self._window_start)
            self._window_start = now

    def _handle_charged(self, frame: bytes, peer: int | None) -> None:
        """``handle_frame``, its CPU time charged to the peer's share (``Receiver.charge``)."""
        started = time.thread_time()
        self.tallies.note_process(peer)
        self.pipeline.frame(frame, self.clock(), peer)
        self.receiver.charge(peer, time.thread_time() - started, len(frame))

    def handle_frame(self, frame: bytes, peer_pid: int | None = None) -> None:
        """The pipeline's ``frame`` at the loop's clock. Never raises."""
        self.pipeline.frame(frame, self.clock(), peer_pid)

    def _roll(self, now: float, duration_s: float) -> None:
        # The window's end on the unix clock at ``now`` itself (not some time later), so a silent
        # sender's last message, placed at the end less its age, is placed alike in every window.
        end_unix_s = time.time() - (self.clock() - now)
        self.pipeline.close_window(now, end_unix_s, duration_s, self.receiver.received())
