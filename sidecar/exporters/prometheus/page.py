"""The served page: the same text as ``SidecarCollector`` gives, faster.

The report's part, which holds every trainer series, is rendered by ``exposition.render_trainer``
once per window and kept (while something scrapes, the server thread renders it ahead, between
requests); only the small families that change between windows (self-telemetry, GPUs, W&B) are
rendered per scrape. It is always the text format 0.0.4 (Prometheus accepts it whatever it asks
for first; OpenMetrics would add nothing here and costs half as much again to render), gzipped at
level 1 when asked.
"""

from __future__ import annotations

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
        self._cached: tuple[IngestReport | None, str] = (None, "")
        self._last_scrape: float | None = None

    def render(self) -> bytes:
        """The whole page (a scrape)."""
        self._last_scrape = self.clock()
        collector = self.collector
        state = collector.state
        report = state.report  # one read: the whole scrape sees one window
        parts = [ex.render_metrics([start_family(state)])]
        if report is not None:
            parts.append(self._text_of(report))
        dynamic = collector.dynamic_sources()
        parts.append(ex.render_metrics([m for name, source in dynamic if not isinstance(source, DcgmSource)
                                        for m in collector.guarded(name, source)]))
        parts += [collector.guarded(name, source.text, "") for name, source in dynamic  # last, rendered fast
                  if isinstance(source, DcgmSource)]
        return "".join(parts).encode()

    def prepare(self) -> None:
        """Render a new window's report now, if someone scraped within ``PREPARE_AFTER_SCRAPE_S``,
        so that the next scrape finds it ready. The server calls this between requests."""
        report = self.collector.state.report
        last = self._last_scrape
        if report is not None and last is not None and self.clock() - last <= PREPARE_AFTER_SCRAPE_S:
            self._text_of(report)

    def _text_of(self, report: IngestReport) -> str:
        cached_report, text = self._cached
        if cached_report is not report:
            text = self._report_text(report, self.collector.state.host)
            self._cached = (report, text)
        return text

    def _report_text(self, report: IngestReport, host: str) -> str:
        """The text of ``report_sources``: trainer series by the fast renderer, the rest by
        prometheus_client."""
        guarded = self.collector.guarded
        parts = []
        for name, source in report_sources(report, host):
            if name == "trainer":
                parts.append(guarded(name, lambda: ex.render_trainer(report, host), ""))
            else:
                parts.append(ex.render_metrics(guarded(name, source)))
        return "".join(parts)


PREPARE_AFTER_SCRAPE_S = 600.0
"""While something scrapes (at least once in this many seconds), each window's report is rendered
ahead of the next scrape; with no scraper, nothing is rendered."""
