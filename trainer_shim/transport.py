"""The shim's only contact with ZeroMQ: one XPUB socket, used from one thread (the flusher).

XPUB rather than PUB so the shim hears the daemon subscribe: it then says hello at once, and while
nobody listens it skips encoding and counts the records as dropped (``no_receiver``) instead of
letting PUB discard them silently. Everything here is non-blocking and swallows transport errors:
a send reports success or failure, it never raises.

Two options make the subscriber count exact. ``XPUB_VERBOSER`` passes every subscribe and
unsubscribe to the application, and ``IMMEDIATE`` makes the connecting side drop its pipe when the
connection breaks, which is what produces the unsubscribe: without it libzmq keeps the pipe of a
dead daemon across reconnects, never reports it gone, and the shim would keep sending into the
void (and count a restarted daemon twice).
"""

from __future__ import annotations

import logging
import time

import zmq

log = logging.getLogger("trainer_shim")

SEND_HWM = 1000
"""Messages queued per connection before ZeroMQ drops (each message is one flush of records)."""

EXIT_LINGER_MS = 200
"""How long the final flush may wait at interpreter exit before unsent data is discarded."""

_ABANDONED: list[object] = []
"""Parent sockets and contexts inherited by a forked child: kept referenced so that garbage
collection never closes them from the child."""


class Transport:
    """A connected XPUB socket. Not thread-safe: only the publisher's flusher thread uses it
    (and the exit hook once the flusher has stopped)."""

    def __init__(self, endpoint: str) -> None:
        """Connect to ``endpoint``. Raises ``zmq.ZMQError`` for an endpoint ZeroMQ cannot parse
        (the publisher counts that as ``transport_error``)."""
        self.endpoint = endpoint
        self.subscribers = 0
        self._ctx = zmq.Context(io_threads=1)
        self._sock = self._ctx.socket(zmq.XPUB)
        # Options before connect: the PUB side must never block or wait at close.
        self._sock.setsockopt(zmq.SNDHWM, SEND_HWM)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.XPUB_VERBOSER, 1)
        self._sock.setsockopt(zmq.IMMEDIATE, 1)
        self._sock.setsockopt(zmq.RECONNECT_IVL, 100)
        self._sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        try:
            self._sock.connect(endpoint)
        except Exception:
            self.close()
            raise

    def poll_subscriptions(self) -> bool:
        """Read pending (un)subscription notices. Returns True if a subscriber (re)joined, so the
        caller should say hello. Never blocks."""
        joined = False
        while True:
            try:
                msg = self._sock.recv(zmq.NOBLOCK)
            except zmq.ZMQError:
                return joined
            if msg[:1] == b"\x01":
                self.subscribers += 1
                joined = True
            elif msg[:1] == b"\x00":
                self.subscribers = max(0, self.subscribers - 1)

    def wait_for_subscriber(self, timeout_ms: int) -> bool:
        """Wait at most ``timeout_ms`` for a subscriber (used once, for the last flush of a short
        run that exits before its subscription arrived). Returns whether one is connected."""
        deadline = time.monotonic() + timeout_ms / 1000
        while self.subscribers == 0:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                break
            try:
                self._sock.poll(remaining_ms, zmq.POLLIN)
            except zmq.ZMQError:
                break
            self.poll_subscriptions()
        return self.subscribers > 0

    def send(self, frame: bytes) -> bool:
        """Queue one frame without blocking. False if ZeroMQ refused it (the caller counts it).
        Always copied: pyzmq's zero-copy path (frames over 64 KiB) starts a garbage-collector
        thread that wakes for every such frame, more than one memcpy of the frame costs."""
        try:
            self._sock.send(frame, zmq.NOBLOCK, copy=True)
            return True
        except zmq.ZMQError:
            return False

    def close(self, linger_ms: int = 0) -> None:
        """Close the socket and context, waiting at most ``linger_ms`` for unsent frames."""
        try:
            self._sock.close(linger=linger_ms)
            self._ctx.term()
        except Exception as exc:  # noqa: BLE001 - close is best effort
            log.debug("trainer_shim: transport close failed: %s", exc)

    def abandon(self) -> None:
        """Forget the socket without touching it: used in a forked child, where the parent's
        context and socket must never be used (or closed) again."""
        _ABANDONED.append((self._sock, self._ctx))
        self._sock = None  # type: ignore[assignment]
        self._ctx = None  # type: ignore[assignment]
