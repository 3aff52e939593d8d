"""The Prometheus exporter: serves ``/metrics`` from the latest window and the scrape state (and,
beside it, the admin side's ``/explain``)."""

from __future__ import annotations

import errno
import logging
import time
from typing import Any

from sidecar.exporters.base import Exporter, ScrapeView, Unscraped
from sidecar.exporters.prometheus.collector import ExportState
from sidecar.exporters.prometheus.server import serve
from sidecar.exporters.prometheus.settings import PrometheusSettings
from sidecar.model.window import IngestReport

log = logging.getLogger("sidecar")


class PrometheusExporter(Exporter):
    """``consume`` swaps the window the collector renders; a scrape never waits on it."""

    name = "prometheus"

    def __init__(self, host: str, addr: str, certfile: str | None = None, keyfile: str | None = None, *,
                 scrape_state: ScrapeView | None = None, dcgm_compat: bool = False) -> None:
        """``addr``: "host:port" (IPv6 in brackets). ``scrape_state``: what is read at scrape time (see
        ``ExportState``); a bare one leaves those families out. ``dcgm_compat``: also the
        dcgm-exporter names."""
        self.addr = addr
        self.certfile, self.keyfile = certfile, keyfile
        self.state = ExportState(host=host, started_unix_s=time.time(), scrape_state=scrape_state or Unscraped(),
                                 dcgm_compat=dcgm_compat)
        self._server: Any = None

    def start(self) -> None:
        """Bind and serve on a thread. Raises ``OSError`` naming the address and the flag to
        change, ``ssl.SSLError`` for a bad certificate."""
        try:
            self._server, _ = serve(self.state, self.addr, self.certfile, self.keyfile)
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                hint = "that host is not an address of this machine; use e.g. --prometheus-addr 127.0.0.1:9478"
            else:
                hint = "choose another with --prometheus-addr, e.g. 127.0.0.1:9479"
            raise OSError(f"cannot serve Prometheus on {self.addr}: {exc.strerror or exc}; {hint}") from None

    def reload(self, settings: PrometheusSettings) -> None:
        """``dcgm_compat`` from the next scrape on (a config reload)."""
        self.state.dcgm_compat = settings.dcgm_compat

    def consume(self, report: IngestReport) -> None:
        self.state.report = report

    def shutdown(self, timeout_s: float = 1.0) -> None:
        """Stop serving (in-flight scrapes finish on their own threads). Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
