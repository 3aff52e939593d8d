"""The served page: the same text as ``SidecarCollector`` gives, faster.

The report's part, which holds every trainer series, is rendered by
``exposition.render_trainer_blocks`` once per window and kept as the bytes served (while
something scrapes, the server thread renders it ahead, between requests); only the small
families that change between windows (self-telemetry, GPUs, W&B) are rendered per scrape. It is
always the text format 0.0.4 (Prometheus accepts it whatever it asks for first; OpenMetrics would
add nothing here and costs half as much again to render), gzipped at level 1 when asked.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from sidecar.exporters.prometheus import exposition as ex
from sidecar.exporters.prometheus.collector import SidecarCollector, report_sources, start_family
from sidecar.exporters.prometheus.dcgm import DcgmSource
from sidecar.model.window import IngestReport


class MetricsPage:
    """The served page: what ``generate_latest`` gives for ``SidecarCollector``, rendered fast.
    Safe to call from concurrent scrape threads."""

    def __init__(self, collector: SidecarCollector, clock: Callable[[], float] = time.monotonic) -> None:
        self.collector = collector
        self.clock = clock
        self._cached: tuple[IngestReport | None, tuple[bytes, ...]] = (None, ())
        """The report last rendered, and its text as the UTF-8 pieces served (the trainer part's
        blocks, then one per source; never joined into one more copy: ``render_parts``)."""
        self._last_scrape: float | None = None
        self._rendering = threading.Lock()
        """Held while a window's text is made: two render threads (a scrape and ``prepare``, or
        two scrapes) that find the same new window make it once, not twice at once (each is
        several MB with 10,000 series: the RSS peak of tests/test_abuse_memory.py)."""

    def render(self) -> bytes:
        """The whole page (a scrape)."""
        return b"".join(self.render_parts())

    def render_parts(self) -> list[bytes]:
        """The whole page (a scrape) as the pieces that ``render`` joins, in order: the report's
        part (several MB with 10,000 series) is the cached bytes themselves, not a copy, so the
        server copies the page once, into its response (``server.MetricsServer``)."""
        self._last_scrape = self.clock()
        collector = self.collector
        state = collector.state
        report = state.report  # one read: the whole scrape sees one window
        parts = [ex.render_metrics_bytes([start_family(state)])]
        if report is not None:
            parts += self._text_of(report)
        dynamic = collector.dynamic_sources()
        parts.append(ex.render_metrics_bytes([m for name, source in dynamic if not isinstance(source, DcgmSource)
                                              for m in collector.guarded(name, source)]))
        parts += [collector.guarded(name, source.text, "").encode() for name, source in dynamic  # last, rendered fast
                  if isinstance(source, DcgmSource)]
        return parts

    def prepare(self) -> None:
        """Render a new window's report now, if someone scraped within ``PREPARE_AFTER_SCRAPE_S``,
        so that the next scrape finds it ready. The server calls this between requests."""
        report = self.collector.state.report
        last = self._last_scrape
        if report is not None and last is not None and self.clock() - last <= PREPARE_AFTER_SCRAPE_S:
            self._text_of(report)

    def _text_of(self, report: IngestReport) -> tuple[bytes, ...]:
        cached_report, text = self._cached
        if cached_report is report:
            return text
        del text
        with self._rendering:  # a scrape that comes while the window is rendered waits for it
            cached_report, text = self._cached
            if cached_report is not None and cached_report is self.collector.state.report:
                return text  # made while this waited: the window after the one asked for, served instead
            if cached_report is not report:
                # The previous window's text goes first (a scrape that took it keeps its own
                # reference): it and the new one are never both held here, one page less.
                self._cached = (None, ())
                del text
                text = self._report_text(report, self.collector.state.host)
                self._cached = (report, text)
            return text

    def _report_text(self, report: IngestReport, host: str) -> tuple[bytes, ...]:
        """The text of ``report_sources``, one UTF-8 piece per source: trainer series by the fast
        renderer, the rest by prometheus_client."""
        guarded = self.collector.guarded
        parts: list[bytes] = []
        for name, source in report_sources(report, host):
            if name == "trainer":
                parts += guarded(name, lambda: ex.render_trainer_blocks(report, host), [])
            else:
                parts.append(ex.render_metrics_bytes(guarded(name, source)))
        return tuple(parts)


PREPARE_AFTER_SCRAPE_S = 600.0
"""While something scrapes (at least once in this many seconds), each window's report is rendered
ahead of the next scrape; with no scraper, nothing is rendered."""
