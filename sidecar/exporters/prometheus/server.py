"""The ``/metrics`` HTTP(S) server: a WSGI app over ``MetricsPage``, bounded in connections,
threads, time and file descriptors.

The endpoint is on loopback without authentication, so any local user is a client. What one
client may cost is bounded here:

- one thread runs an asyncio loop that accepts, does TLS handshakes and reads requests, each
  under a deadline (``HANDSHAKE_TIMEOUT_S``, ``REQUEST_TIMEOUT_S``, ``CONNECTION_TIMEOUT_S``), so a
  silent or slow client never blocks another client or the shutdown;
- pages are rendered on a fixed pool of ``RENDER_THREADS`` threads (never a thread per
  connection: the systemd unit allows 512 tasks);
- at most ``MAX_CONNECTIONS`` connections are open; when full, the oldest connection that has
  waited ``EVICT_IDLE_AFTER_S`` without sending its request is closed to make room (a scraper
  sends its request at once, an idle client does not), or else new ones wait in the backlog;
- an accepted connection that would leave fewer than ``FD_RESERVE`` descriptors free is closed at
  once: libzmq aborts the whole process when it cannot accept a trainer's connection for want of
  a descriptor, so the HTTP side must never take the last ones;
- the listen backlog is ``LISTEN_BACKLOG`` (Python's default of 5 made a burst of scrapes time out).

Why not prometheus_client's own server (``start_http_server``, ``ThreadingWSGIServer``): it starts
a thread per connection, does the TLS handshake inside ``accept()`` on its single serving thread
without a timeout, keeps the default backlog and has no bound on connections or descriptors, which
are exactly the failures above. The page itself is a WSGI app (``metrics_app``, with prometheus_client's exposition
helpers and its restricted registry for ``?name[]=``); ``MetricsServer`` only carries requests to it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import gzip
import logging
import resource
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import gzip_accepted

from sidecar.exporters.prometheus import exposition as ex
from sidecar.exporters.prometheus.collector import ExportState, SidecarCollector, explain_json
from sidecar.exporters.prometheus.page import MetricsPage
from sidecar.exporters.prometheus.wandb_page import WandbPage
from sidecar.model.address import parse_host_port

log = logging.getLogger("sidecar")

LISTEN_BACKLOG = 128
MAX_CONNECTIONS = 256
"""Open connections at most (fewer where the open-file limit is low: see ``MetricsServer``)."""
WRITE_CHUNK_BYTES = 256 * 1024
"""A response goes to the transport in pieces of at most this, each once the one before has
drained: the transport keeps a copy of what the socket did not take at once, so a page written
whole (several MB with 10,000 series) was held twice while it was sent."""
EVICT_IDLE_AFTER_S = 1.0
"""When every connection slot is taken, one that has waited this long without sending its
request is closed for the next (a scraper sends its request at once)."""
HANDSHAKE_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 5.0
"""From accept (after the handshake) to the end of the request's headers."""
CONNECTION_TIMEOUT_S = 15.0
"""Whole life of one connection, response included (Prometheus's default scrape timeout is 10 s)."""
MAX_REQUEST_BYTES = 16 * 1024
"""Request line and headers; a longer request is closed without an answer."""
FD_RESERVE = 128
"""Descriptors the HTTP side leaves free for ZeroMQ (trainer connections) and everything else."""
RENDER_THREADS = 2
ACCEPT_RETRY_S = 0.1
"""After ``accept`` failed for want of a resource (EMFILE, ENFILE, ENOBUFS), wait this long
before the next try instead of spinning on a listening socket that stays readable."""
PREPARE_EVERY_S = 0.5

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


@dataclass
class _Connection:
    since: float
    """Loop time it was accepted."""
    task: asyncio.Task[None] | None = None
    reading: bool = True
    """Not yet past its request's headers (may be evicted to make room)."""


@dataclass
class ServerStats:
    """Counts since start: connections refused or closed early, by reason."""

    accepted: int = 0
    closed: dict[str, int] = field(default_factory=dict)

    def count(self, reason: str) -> None:
        self.closed[reason] = self.closed.get(reason, 0) + 1


class MetricsServer:
    """Serves ``app`` on ``host:port`` from its own thread; ``prepare`` is called on the render pool
    every ``PREPARE_EVERY_S`` (to render a new window ahead of the next scrape). Raises
    ``OSError`` if the port cannot be bound."""

    def __init__(self, app: WsgiApp, host: str, port: int, ssl_context: ssl.SSLContext | None = None,
                 prepare: Callable[[], None] | None = None) -> None:
        self.app = app
        self.ssl_context = ssl_context
        self.prepare = prepare
        self.stats = ServerStats()
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                       flags=socket.AI_PASSIVE)[0]
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind(sockaddr)
            self._sock.listen(LISTEN_BACKLOG)
            self._sock.setblocking(False)
        except BaseException:
            self._sock.close()
            raise
        self.server_address = self._sock.getsockname()
        self._fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        # Connections reach their bound before the descriptor reserve does (half what is left).
        self._max_conns = max(8, min(MAX_CONNECTIONS, (self._fd_limit - FD_RESERVE - self._sock.fileno()) // 2))
        self._paused = False
        self._conns: dict[int, _Connection] = {}  # insertion order: oldest first
        self._next_id = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(RENDER_THREADS, thread_name_prefix="sidecar-render")
        self._preparing = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="sidecar-prometheus", daemon=True)
        self._closed = False

    def start(self) -> None:
        # Both render threads now, not at the first scrapes: the daemon's thread count is then
        # the same before and after any number of clients.
        ready = threading.Barrier(RENDER_THREADS + 1)
        for _ in range(RENDER_THREADS):
            self._pool.submit(ready.wait)
        ready.wait(5.0)
        self._thread.start()

    # -- loop thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        loop.add_reader(self._sock.fileno(), self._accept)
        loop.call_later(PREPARE_EVERY_S, self._tick)
        try:
            loop.run_forever()
        finally:
            for task in asyncio.all_tasks(loop):
                task.cancel()
            loop.run_until_complete(asyncio.sleep(0))  # let cancelled connections close
            loop.close()

    def _accept(self) -> None:
        for _ in range(LISTEN_BACKLOG):
            if len(self._conns) >= self._max_conns and not self._evict_idle(EVICT_IDLE_AFTER_S):
                self._pause_accept()  # the rest wait in the kernel's backlog
                return
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.debug("sidecar: accept failed: %s", exc)
                    return
                self.stats.count("no_descriptor")
                self._evict_idle(0.0)
                self._pause_accept()
                return
            # Descriptors are allocated lowest first: this number means that many are in use.
            if conn.fileno() >= self._fd_limit - FD_RESERVE:
                self.stats.count("descriptor_reserve")
                conn.close()
                self._evict_idle(0.0)
                continue
            self.stats.accepted += 1
            conn.setblocking(False)
            cid, self._next_id = self._next_id, self._next_id + 1
            state = self._conns[cid] = _Connection(since=self._loop.time())
            state.task = self._loop.create_task(self._serve(cid, conn))

    def _pause_accept(self) -> None:
        if not self._paused:
            self._paused = True
            self._loop.remove_reader(self._sock.fileno())
            self._loop.call_later(ACCEPT_RETRY_S, self._resume_accept)

    def _resume_accept(self) -> None:
        if self._paused and not self._closed:
            self._paused = False
            self._loop.add_reader(self._sock.fileno(), self._accept)

    def _evict_idle(self, min_age_s: float) -> bool:
        """Close the oldest connection still waiting for its request, if it has waited at least
        ``min_age_s``; False if there is none."""
        for cid, state in self._conns.items():
            if not state.reading or state.task is None:
                continue
            if self._loop.time() - state.since < min_age_s:
                return False  # oldest first: none older
            self.stats.count("evicted_idle")
            state.task.cancel()
            del self._conns[cid]
            return True
        return False

    async def _serve(self, cid: int, conn: socket.socket) -> None:
        loop = self._loop
        transport: asyncio.Transport | None = None
        try:
            async with asyncio.timeout(CONNECTION_TIMEOUT_S):
                reader = asyncio.StreamReader(limit=MAX_REQUEST_BYTES, loop=loop)
                protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
                if self.ssl_context is not None:
                    transport, _ = await loop.connect_accepted_socket(
                        lambda: protocol, conn, ssl=self.ssl_context, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S,
                        ssl_shutdown_timeout=HANDSHAKE_TIMEOUT_S)
                else:
                    transport, _ = await loop.connect_accepted_socket(lambda: protocol, conn)  # type: ignore[assignment]
                writer = asyncio.StreamWriter(transport, protocol, reader, loop)  # type: ignore[arg-type]
                async with asyncio.timeout(REQUEST_TIMEOUT_S):
                    head = await reader.readuntil(b"\r\n\r\n")
                state = self._conns.get(cid)
                if state is not None:
                    state.reading = False
                environ = _environ(head)
                if environ is None:
                    writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                else:
                    for piece in await loop.run_in_executor(self._pool, self._respond, environ):
                        view = memoryview(piece)
                        for start in range(0, len(view), WRITE_CHUNK_BYTES):
                            writer.write(view[start:start + WRITE_CHUNK_BYTES])
                            await writer.drain()
                await writer.drain()
                writer.close()
                await writer.wait_closed()
                transport = None  # closed gracefully: aborting it now raises inside asyncio (3.11)
        except TimeoutError:
            self.stats.count("timeout")
        except asyncio.CancelledError:
            pass  # evicted or shutting down
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ssl.SSLError, OSError):
            self.stats.count("client_error")
        finally:
            self._conns.pop(cid, None)
            self._resume_accept()
            if transport is not None:
                transport.abort()
            else:
                conn.close()

    def _respond(self, environ: dict[str, Any]) -> list[bytes]:
        """The whole HTTP response to one request (render pool): the head, then the body's
        pieces as the app gave them, not joined. The page's cached part is one of them, and is
        written from where it is: a copy of the page per scrape (several MB with 10,000 series,
        one more in the render thread's heap each time) was a part of the RSS peak of the
        10,000-timing flood (tests/test_abuse_memory.py)."""
        status_headers: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]]) -> None:
            status_headers[:] = [status, headers]

        try:
            body = list(self.app(environ, start_response))
            status, headers = status_headers
        except Exception:
            log.exception("sidecar: /metrics failed")
            body, status, headers = [], "500 Internal Server Error", []
        head = [f"HTTP/1.1 {status}", f"Content-Length: {sum(map(len, body))}", "Connection: close"]
        head += [f"{k}: {v}" for k, v in headers]
        if environ["REQUEST_METHOD"] == "HEAD":
            body = []  # HEAD: the headers a GET would have (its Content-Length included), no body
        return [("\r\n".join(head) + "\r\n\r\n").encode("latin-1"), *body]

    def _tick(self) -> None:
        if self._closed:
            return
        if self.prepare is not None and not self._preparing:
            self._preparing = True
            future = self._pool.submit(self.prepare)
            future.add_done_callback(lambda _f: setattr(self, "_preparing", False))
        self._loop.call_later(PREPARE_EVERY_S, self._tick)

    def _stop(self) -> None:
        self._closed = True
        try:
            self._loop.remove_reader(self._sock.fileno())
        except (ValueError, OSError):
            pass
        self._loop.stop()

    # -- any thread ---------------------------------------------------------------------------------

    def shutdown(self, timeout_s: float = 2.0) -> None:
        """Stop serving (open connections are closed). Bounded by ``timeout_s``. Idempotent."""
        if self._thread.is_alive():
            try:
                self._loop.call_soon_threadsafe(self._stop)
            except RuntimeError:
                pass  # loop already closed
            self._thread.join(timeout_s)
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)

    def server_close(self) -> None:
        self._sock.close()

    def families(self, host: str) -> list[Metric]:
        """The server's own counters (connections accepted, closed early by reason, open now)."""
        accepted = CounterMetricFamily("dflash_sidecar_http_connections_accepted",
                                       "Connections to the metrics endpoint accepted.", labels=["host"])
        accepted.add_metric([host], self.stats.accepted)
        closed = CounterMetricFamily("dflash_sidecar_http_connections_closed_early",
                                     "Connections to the metrics endpoint refused or closed without an answer, "
                                     "by reason.", labels=["host", "reason"])
        for reason, n in sorted(self.stats.closed.items()):
            closed.add_metric([host, reason], n)
        open_now = GaugeMetricFamily("dflash_sidecar_http_connections_open", "Connections to the metrics "
                                     "endpoint open now.", labels=["host"])
        open_now.add_metric([host], len(self._conns))
        return [accepted, closed, open_now]


def _environ(head: bytes) -> dict[str, Any] | None:
    """A WSGI environ from a request's line and headers, or None if it is not HTTP."""
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
    except ValueError:
        return None
    if not version.startswith("HTTP/"):
        return None
    path, _, query = target.partition("?")
    environ: dict[str, Any] = {"REQUEST_METHOD": method, "PATH_INFO": unquote(path), "QUERY_STRING": query,
                               "SERVER_PROTOCOL": version}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            environ["HTTP_" + name.strip().upper().replace("-", "_")] = value.strip()
    return environ


WANDB_PATH = "/metrics/wandb"
"""The page made for W&B's open-metrics scraper (``wandb_page``)."""
GZIP_LEVEL = 1
"""Fast: 2 MB of exposition (10,000 series) in about 9 ms to 280 kB; level 9 takes 80 ms."""


def metrics_app(page: MetricsPage, registry: CollectorRegistry,
                wandb_page: WandbPage | None = None) -> Callable[..., list[bytes]]:
    """A WSGI app serving ``page`` on every path, as prometheus_client's does; a scrape filtered
    with ``name[]`` is rare and is answered by prometheus_client from ``registry``.
    ``wandb_page`` answers ``/metrics/wandb`` (and its ``/legend``)."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        method = environ["REQUEST_METHOD"]
        if method == "OPTIONS":
            start_response("200 OK", [("Allow", "OPTIONS,GET,HEAD")])
            return [b""]
        if method not in ("GET", "HEAD"):  # HEAD is answered as GET; the server sends no body
            start_response("405 Method Not Allowed", [("Allow", "OPTIONS,GET,HEAD")])
            return [f"# HTTP 405 Method Not Allowed: {method}; use OPTIONS, GET or HEAD\n".encode()]
        if environ.get("PATH_INFO") == "/favicon.ico":
            start_response("200 OK", [])
            return [b""]
        if environ.get("PATH_INFO") == "/explain" and (explained := explain_json(page.collector)) is not None:
            start_response("200 OK", [("Content-Type", "application/json")])  # the admin side (sidecar.core.admin)
            return [explained]
        if wandb_page is not None and environ.get("PATH_INFO", "").startswith(WANDB_PATH):
            wandb_route = environ["PATH_INFO"][len(WANDB_PATH):].rstrip("/")
            if wandb_route == "/legend":
                start_response("200 OK", [("Content-Type", "application/json")])
                return [wandb_page.legend()]
            if wandb_route == "":
                start_response("200 OK", [("Content-Type", ex.CONTENT_TYPE)])
                return [wandb_page.render()]
        names = parse_qs(environ.get("QUERY_STRING", "")).get("name[]")
        output = [generate_latest(registry.restricted_registry(names))] if names else page.render_parts()
        headers = [("Content-Type", ex.CONTENT_TYPE)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            output = [gzip.compress(b"".join(output), compresslevel=GZIP_LEVEL)]
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return output  # the page's pieces, written one after the other (``MetricsServer._respond``)

    return app


def serve(state: ExportState, addr: str, certfile: str | None = None,
          keyfile: str | None = None) -> tuple[MetricsServer, threading.Thread]:
    """Serve ``/metrics`` on ``addr`` ("host:port", IPv6 in brackets) from ``MetricsServer``.
    Raises ``OSError`` if the port cannot be bound and ``ssl.SSLError`` for a bad certificate."""
    host, port = parse_host_port(addr)
    collector = SidecarCollector(state)
    registry = CollectorRegistry(auto_describe=False, support_collectors_without_names=True)
    registry.register(collector)  # names change every window: no describe(), filtered at collect
    context = None
    if certfile and keyfile:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certfile=certfile, keyfile=keyfile)
    page = MetricsPage(collector)
    server = MetricsServer(metrics_app(page, registry, WandbPage(collector)), host, port, context,
                           prepare=page.prepare)
    state.http = lambda: server.families(state.host)
    server.start()
    return server, server._thread
