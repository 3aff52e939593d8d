"""The publisher: what the trainer holds of one process's telemetry, and the channels it made.

Lifecycle: created idle; the flusher thread (``trainer_shim.flusher``: the flush loop, and with it
the ZeroMQ context and socket) starts with the first channel, so constructing a publisher costs
nothing and the socket is only ever touched by that one thread. ``close()`` is idempotent and
bounded. What the process's life does to it (``trainer_shim.process_life``): a forked child gets a
clean publisher (new sender ids, no inherited records, a new socket); at interpreter exit the last
batch goes out with a short linger, each channel's closing hello after it (the daemon counts the
sender gone at once). After every flush cycle the publisher's totals go to its tally
(``trainer_shim.tally``), and a SIGTERM handler writes the final one, so the daemon can reconcile what
never arrived once the process is gone.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Mapping

from trainer_shim import exit_hooks, process_life, wire
from trainer_shim.allocator import AllocatorSampler
from trainer_shim.channel import Channel, ChannelStats, StrictChannel, current_scalar_resolver
from trainer_shim.coerce import coerce as _coerce
from trainer_shim.coerce import warn_once as _warn_once
from trainer_shim.flusher import CONNECT_GRACE_S, HEARTBEAT_S, HELLO_REFRESH_S, Flusher, _header_step
from trainer_shim.process_life import SIGTERM_ENV, SIGTERM_WAIT_S, child_suffix
from trainer_shim.run_label import MAX_LABEL_CHARS, check_flops, flops_from_env
from trainer_shim.run_label import run_label as env_run_label
from trainer_shim.transport import EXIT_LINGER_MS

__all__ = [
    "CONNECT_GRACE_S", "HEARTBEAT_S", "HELLO_REFRESH_S", "SIGTERM_ENV", "SIGTERM_WAIT_S",
    "Publisher", "child_suffix", "env_worker", "owner_of", "_coerce", "_header_step",
]
"""Names importers know from here. The flush loop's constants and ``_header_step`` live in
``trainer_shim.flusher``, the signal settings and ``child_suffix`` in ``trainer_shim.process_life``,
``_coerce`` in ``trainer_shim.coerce``: re-exported here, read there (set them there to change them)."""


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
        self._channels: dict[tuple[str, str], Channel] = {}
        self._init_threading()
        process_life.enrol(self)

    def _init_threading(self) -> None:
        """What a process makes anew: the lock, the closed state, the close callbacks and the
        flush loop (``trainer_shim.flusher``)."""
        self._lock = threading.Lock()
        self._closed = False
        self._close_hooks: list[Callable[[], None]] = []
        self._pid = os.getpid()
        self._flusher = Flusher(self, self._allocator)

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
                ch.relabel = default_worker and process_life.in_multiprocessing_child()
                self._channels = {**self._channels, key: ch}
            if self._flusher.thread is None and not self._closed:
                self._start_flusher()
        return ch

    def flush(self, wait_s: float = 0.0) -> bool:
        """Ask the flusher to send what is queued now. Returns at once unless ``wait_s`` > 0:
        then waits at most ``wait_s`` seconds for a flush that started after this call to drain
        every channel (sent, or dropped and counted), and returns whether it did. "Sent" means
        handed to ZeroMQ, whose I/O thread writes it shortly after: True does not say the daemon
        read it (PUB/SUB has no acknowledgement; ``stats()`` has the drops). What never arrives
        is counted by the daemon from the batches' counters, or from this process's tally once it
        is gone (docs/RELIABILITY.md). Before ``os._exit`` use ``close()``, which lingers until
        the data is written. Right after the socket is created a flush may wait up to
        ``CONNECT_GRACE_S`` for the daemon's subscription."""
        return self._flusher.request(wait_s)

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
            flusher = self._flusher
            flusher.linger_ms = linger_ms
            hooks, self._close_hooks = self._close_hooks, []
        for hook in hooks:
            try:
                hook()
            except Exception as exc:  # noqa: BLE001 - closing goes on
                self._internal_error("a close callback", exc)
        self._settle_scalars()
        flusher.stop()

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
        self._flusher.refresh_hello_soon()

    def stats(self) -> dict[tuple[str, str], ChannelStats]:
        """Per channel: sender id, messages and records sent, drops by reason, records queued."""
        return {
            key: {"sender": ch.sender, "seq": ch.seq, "records_total": ch.records_total,
                  "dropped": dict(ch.dropped), "pending": ch.pending()}
            for key, ch in self._channels.items()
        }

    # -- the flusher's start and the scalars it cannot wait for --------------------------------

    def _start_flusher(self) -> None:
        process_life.install_signal_handlers()
        exit_hooks.install_excepthook()
        self._flusher.start(self)

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

    # -- what the process's life asks of it (``trainer_shim.process_life``) ---------------------

    def _tally_at_sigterm(self, final: bool) -> None:
        """The SIGTERM handler's snapshot: every record in exactly one column (sent, dropped,
        queued), waiting at most ``SIGTERM_WAIT_S`` for a flush cycle in progress. ``final``: the
        process is about to die of the signal (a handler of the trainer's own might not exit)."""
        self._flusher.tally_now(wire.TallyEnd.SIGTERM if final else wire.TallyEnd.RUNNING)

    def _tally_on_seen(self) -> None:
        """An exception that ends the process (or a thread) was seen: rewrite the tally now, final
        or not, so that a process that then dies without a final one still tells it. Waits at most
        ``SIGTERM_WAIT_S`` for a flush cycle in progress (whose own write then tells it)."""
        if self._pid == os.getpid():
            self._flusher.tally_if_free(wire.TallyEnd.RUNNING)

    def _after_fork_in_child(self) -> None:
        """The child must not reuse the parent's socket, thread or records. Its flusher starts
        again, but it connects only once the child publishes something."""
        had_thread = self._flusher.thread is not None
        closed = self._closed
        # "No daemon" only once the parent's socket has waited its connect grace in vain.
        daemon_seen = self._flusher.daemon_seen()
        self._flusher.abandon()
        self._init_threading()
        self._closed = closed
        self._flusher.exit_waits_for_subscriber = daemon_seen
        for ch in self._channels.values():
            ch.reset()
            ch.relabel = True
        if had_thread and not closed and self._channels:
            self._start_flusher()
        process_life.register_multiprocessing_exit(self)


def owner_of(channel: Channel) -> Publisher | None:
    """The publisher of this process that made ``channel``, or None."""
    for publisher in list(process_life.PUBLISHERS):
        if isinstance(publisher, Publisher) and any(ch is channel for ch in publisher._channels.values()):
            return publisher
    return None


def env_worker(environ: Mapping[str, str] = os.environ) -> str:
    """The worker label from ``RANK``/``LOCAL_RANK``, else the current thread's name."""
    return environ.get("RANK") or environ.get("LOCAL_RANK") or threading.current_thread().name


process_life.install()
