"""The ``/metrics`` HTTP(S) server: a WSGI app over ``MetricsPage`` on a thread per request."""

from __future__ import annotations

import gzip
import socket
import ssl
import threading
from collections.abc import Callable
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import gzip_accepted

from sidecar.exporters.prometheus import exposition as ex
from sidecar.exporters.prometheus.collector import ExportState, SidecarCollector, explain_json
from sidecar.exporters.prometheus.page import MetricsPage
from sidecar.model.address import parse_host_port

GZIP_LEVEL = 1
"""Fast: 2 MB of exposition (10,000 series) in about 9 ms to 280 kB; level 9 takes 80 ms."""


def metrics_app(page: MetricsPage, registry: CollectorRegistry) -> Callable[..., list[bytes]]:
    """A WSGI app serving ``page`` on every path, as prometheus_client's does; a scrape filtered
    with ``name[]`` is rare and is answered by prometheus_client from ``registry``."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        method = environ["REQUEST_METHOD"]
        if method == "OPTIONS":
            start_response("200 OK", [("Allow", "OPTIONS,GET")])
            return [b""]
        if method != "GET":
            start_response("405 Method Not Allowed", [("Allow", "OPTIONS,GET")])
            return [f"# HTTP 405 Method Not Allowed: {method}; use OPTIONS or GET\n".encode()]
        if environ.get("PATH_INFO") == "/favicon.ico":
            start_response("200 OK", [])
            return [b""]
        if environ.get("PATH_INFO") == "/explain" and page.collector.state.explain is not None:
            start_response("200 OK", [("Content-Type", "application/json")])
            return [explain_json(page.collector)]
        names = parse_qs(environ.get("QUERY_STRING", "")).get("name[]")
        output = generate_latest(registry.restricted_registry(names)) if names else page.render()
        headers = [("Content-Type", ex.CONTENT_TYPE)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            output = gzip.compress(output, compresslevel=GZIP_LEVEL)
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [output]

    return app


class _Server(ThreadingMixIn, WSGIServer):
    """Thread per request; between requests (at least every 0.5 s, ``serve_forever``'s poll),
    ``service_actions`` prepares the page of a new window."""

    daemon_threads = True
    page: MetricsPage | None = None

    def service_actions(self) -> None:
        if self.page is not None:
            self.page.prepare()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        """No per-request logging."""


def serve(state: ExportState, addr: str, certfile: str | None = None,
          keyfile: str | None = None) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``/metrics`` on ``addr`` ("host:port", IPv6 in brackets) on a thread per request.
    Raises ``OSError`` if the port cannot be bound and ``ssl.SSLError`` for a bad certificate."""
    host, port = parse_host_port(addr)
    collector = SidecarCollector(state)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    family, _, _, _, sockaddr = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM,
                                                   flags=socket.AI_PASSIVE)[0]
    server_class = type("SidecarHTTPServer", (_Server,), {"address_family": family})
    page = MetricsPage(collector)
    server: _Server = make_server(str(sockaddr[0]), port, metrics_app(page, registry), server_class,
                                  handler_class=_QuietHandler)
    server.page = page
    if certfile and keyfile:
        try:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(certfile=certfile, keyfile=keyfile)
        except BaseException:
            server.server_close()
            raise
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name="sidecar-prometheus", daemon=True)
    thread.start()
    return server, thread
