"""Prometheus exporter: a scrape-time collector over the latest immutable window report.

A scrape never calls NVML and never waits on ingest: it reads references that other threads
swap atomically. Families are built fresh on every scrape, so a series that disappears (an
expired worker, a lost GPU) is simply absent from the next scrape. Names follow Prometheus
conventions: ``dflash_`` prefix, base units (seconds, bytes), ``_total`` on counters, HELP on
every family, labels from the fixed set (host, gpu, group, role, worker) plus ``reason``/``key``
where a family needs one.

``SidecarCollector`` is the reference: registries (and tests) read it as any collector; the
served page (``page.MetricsPage``) is the same text, faster.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from sidecar.exporters.base import ScrapeView, Unscraped
from sidecar.exporters.prometheus.captures import capture_families
from sidecar.exporters.prometheus.dcgm import DcgmSource
from sidecar.exporters.prometheus.ends import ends_families
from sidecar.exporters.prometheus.gpu import gpu_metric_families
from sidecar.exporters.prometheus.insight import insight_families
from sidecar.exporters.prometheus.ledger import ledger_families
from sidecar.exporters.prometheus.process import self_families, wandb_families
from sidecar.model.gpu import GpuView
from sidecar.model.names import TRAINER_FAMILIES
from sidecar.model.window import (
    ALLOCATOR,
    CATEGORY,
    COUNT,
    GAUGE,
    PROFILE,
    SCALAR,
    TIMING,
    IngestReport,
)

log = logging.getLogger("sidecar")

FamilySource = Callable[[], Iterable[Metric]]


@dataclass(slots=True)
class ExportState:
    """What a scrape reads: ``report`` (the window, with its insight), replaced, never mutated,
    once per window, and ``scrape_state``, the daemon's one read-only scrape state, for what changes
    between windows: the GPUs (their latest snapshot, not the window's), the daemon's own
    telemetry, the W&B exporter's stats, ``/explain``. What the scrape state lacks has no
    families (``Unscraped`` in tests: the window's families only)."""

    host: str
    started_unix_s: float
    report: IngestReport | None = None
    scrape_state: ScrapeView = field(default_factory=Unscraped)
    http: Callable[[], list[Metric]] | None = None
    """The metrics server's own counters (connections accepted, closed early by reason)."""
    dcgm_compat: bool = False
    """Also render the GPUs under dcgm-exporter's names (``--dcgm-compat``)."""


class SidecarCollector(Collector):
    """Renders ``ExportState`` on each scrape. Errors in one source drop that source's families
    (logged once), never the scrape."""

    def __init__(self, state: ExportState) -> None:
        self.state = state
        self._failed: set[str] = set()

    def collect(self) -> Iterable[Metric]:
        state = self.state
        report = state.report  # one read: the whole scrape sees one window
        yield start_family(state)
        for name, source in report_sources(report, state.host) + self.dynamic_sources():
            yield from self.guarded(name, source)

    def dynamic_sources(self) -> list[tuple[str, FamilySource]]:
        """Sources whose families change between windows (self-telemetry, W&B, GPUs)."""
        state = self.state
        host = state.host
        scraped = state.scrape_state
        report = state.report
        roles = {role for role, _ in report.totals} if report is not None else set()
        ends = report.ends if report is not None else None  # the window's own: one source
        sources: list[tuple[str, FamilySource]] = [
            ("self", lambda: self_families(host, scraped.telemetry())),
            ("wandb", lambda: wandb_families(host, scraped.wandb_stats())),
            ("captures", lambda: capture_families(scraped.last_capture(), host)),
        ]
        if ends is not None:  # an end shows from the window after it is told
            sources.append(("ends", lambda: ends_families(ends, roles, host)))
        view = _Once(scraped.gpu_view) if scraped.has_gpus else None  # one GpuView per scrape for both GPU sources
        if view is not None:
            sources.append(("gpu", lambda: gpu_metric_families(view(), host, time.monotonic())))
        if state.http is not None:
            sources.append(("http", state.http))
        if view is not None and state.dcgm_compat:  # last: the page renders it with its own fast path
            sources.append(("dcgm", DcgmSource(view, host)))
        return sources

    def guarded(self, name: str, source: Callable[[], Any], empty: Any = ()) -> Any:
        """``source()`` materialized (a list of families, or text: ``str`` or ``bytes``), or
        ``empty`` if it failed."""
        try:
            result = source()
            return result if isinstance(result, (str, bytes)) else _finite_only(list(result))
        except Exception:  # noqa: BLE001 - degrade the scrape, never fail it
            if name not in self._failed:
                self._failed.add(name)
                log.exception("sidecar: metric source %s failed; its series are omitted", name)
            return empty


class _Once:
    """``read()`` called once, on first use: the GPU sources of one scrape share one view."""

    def __init__(self, read: Callable[[], GpuView | None]) -> None:
        self._read = read
        self._view: GpuView | None = None

    def __call__(self) -> GpuView:
        if self._view is None:
            view = self._read()
            if view is None:
                raise LookupError("the scrape state has no GPU view")
            self._view = view
        return self._view


def explain_json(collector: SidecarCollector) -> bytes | None:
    """The body of ``/explain``: the scrape state's ``explain()`` as JSON (``{}`` if it failed,
    logged once); None where the scrape state has no admin side (no such page)."""
    scraped = collector.state.scrape_state
    if not scraped.has_admin:
        return None
    data = collector.guarded("explain", lambda: [scraped.explain()], [{}])[0]
    return json.dumps(data).encode()


def _finite_only(families: list[Any]) -> list[Any]:
    """``families`` without NaN or infinite samples: a derived figure (a ratio over an empty
    window, say) is absent rather than NaN. Trainer gauges never hold one (aggregation refuses
    them), so no sample a trainer sent is lost here. Items that are not families pass as they are."""
    for family in families:
        if isinstance(family, Metric) and not all(math.isfinite(sample.value) for sample in family.samples):
            family.samples = [sample for sample in family.samples if math.isfinite(sample.value)]
    return families


def start_family(state: ExportState) -> Metric:
    start = GaugeMetricFamily("dflash_sidecar_start_time_seconds",
                              "Unix time the daemon started (a change means a restart).", labels=["host"])
    start.add_metric([state.host], state.started_unix_s)
    return start


def report_sources(report: IngestReport | None, host: str) -> list[tuple[str, FamilySource]]:
    """Sources that depend on the window report alone (and so change once per window)."""
    if report is None:
        return []
    sources: list[tuple[str, FamilySource]] = [("trainer", lambda: trainer_families(report, host)),
                                               ("accounting", lambda: accounting_families(report, host))]
    insight = report.insight
    if insight is not None:
        sources.append(("insight", lambda: insight_families(insight, host)))
    ledger = report.run_ledger
    if ledger is not None:
        sources.append(("run_ledger", lambda: ledger_families(ledger, host)))
    return sources


_FACTORIES: dict[str, Callable[..., Metric]] = {"summary": SummaryMetricFamily, "counter": CounterMetricFamily,
                                                "gauge": GaugeMetricFamily}


def trainer_families(report: IngestReport, host: str) -> list[Metric]:
    """Families for the trainer's own series (timings, counters, gauges, scalars, categories),
    steps and CUDA allocator samples, as ``TRAINER_FAMILIES`` declares them."""
    families: dict[str, Metric] = {}

    def family(kind: int, token: str = "", which: int = 0) -> Any:
        declared = TRAINER_FAMILIES[kind][which]
        name = declared.name.format(token)
        fam = families.get(name)
        if fam is None:
            fam = families[name] = _FACTORIES[declared.type](name, declared.help.format(token),
                                                             labels=list(declared.labels))
        return fam

    labels = ["host", "role", "worker"]
    for view in report.window.series:
        base = [host, view.role, view.worker]
        if view.kind == TIMING:
            fam = family(TIMING, view.name)
            window = view.window
            quantiles = ([("0.5", window["p50"] / 1000.0), ("0.95", window["p95"] / 1000.0),
                          ("1", window["max"] / 1000.0)] if window else [])
            fam.add_metric(base, count_value=view.cumulative["count"], sum_value=view.cumulative["sum_s"])
            for q, v in quantiles:
                fam.samples.append(Sample(fam.name, dict(zip(labels, base)) | {"quantile": q}, v))
        elif view.kind == COUNT:
            family(COUNT, view.name).add_metric(base, view.cumulative["total"])
        elif view.kind in (GAUGE, SCALAR):
            last = view.cumulative["last"]
            if isinstance(last, float) and math.isnan(last):
                continue
            family(view.kind, view.name).add_metric(base, last)
        elif view.kind == CATEGORY:
            fam = family(CATEGORY, view.name)
            for key, count in view.cumulative["totals"].items():
                fam.add_metric(base + [key], count)
            if view.window:
                family(CATEGORY, view.name, 1).add_metric(base, view.window["entropy_bits"])
    steps = family(PROFILE)
    for (role, worker), step in report.window.steps.items():
        steps.add_metric([host, role, worker], step)
    alloc = [family(ALLOCATOR, which=i) for i in range(len(TRAINER_FAMILIES[ALLOCATOR]))]
    for (role, worker, device), values in report.window.allocator.items():
        for fam, value in zip(alloc, values):
            fam.add_metric([host, str(device), role, worker], value)
    return list(families.values())


def accounting_families(report: IngestReport, host: str) -> list[Metric]:
    """Ingest accounting: accepted and dropped records by reason, senders, messages dropped."""
    accepted = CounterMetricFamily("dflash_sidecar_records_accepted",
                                   "Records aggregated, per sender role and worker.", labels=["host", "role", "worker"])
    dropped = CounterMetricFamily("dflash_sidecar_records_dropped",
                                  "Records lost or rejected, by reason (sender_* reasons are the shim's own drops).",
                                  labels=["host", "role", "worker", "reason"])
    last_seen = GaugeMetricFamily("dflash_trainer_last_seen_timestamp_seconds",
                                  "Unix time of the last message from this role/worker.",
                                  labels=["host", "role", "worker"])
    for (role, worker), totals in report.totals.items():
        accepted.add_metric([host, role, worker], totals.accepted)
        for reason, n in totals.dropped.items():
            dropped.add_metric([host, role, worker, reason], n)
        last_seen.add_metric([host, role, worker], totals.last_seen_unix_s)
    messages = CounterMetricFamily("dflash_sidecar_messages_dropped",
                                   "Whole messages dropped before their records could be counted, by reason.",
                                   labels=["host", "reason"])
    for reason, n in report.messages_dropped.items():
        messages.add_metric([host, reason], n)
    entries = CounterMetricFamily("dflash_sidecar_profile_entries_rejected",
                                  "Entries of profile dicts skipped, by sender and reason.",
                                  labels=["host", "role", "worker", "reason"])
    for (role, worker, reason), n in report.profile_entries_rejected.items():
        entries.add_metric([host, role, worker, reason], n)
    senders = GaugeMetricFamily("dflash_sidecar_senders", "Live senders: heard from in the last 10 s "
                                "(a shim heartbeats every 2 s), one that closed only in the window it "
                                "closed in.", labels=["host"])
    senders.add_metric([host], len(report.live_senders))
    series = GaugeMetricFamily("dflash_sidecar_series", "Distinct trainer series held (cardinality budget use).",
                               labels=["host"])
    series.add_metric([host], report.series)
    frames = CounterMetricFamily("dflash_sidecar_frames_received", "ZeroMQ frames received.", labels=["host"])
    frames.add_metric([host], report.frames)
    nbytes = CounterMetricFamily("dflash_sidecar_received_bytes", "Bytes received from shims.", labels=["host"])
    nbytes.add_metric([host], report.bytes)
    disc = CounterMetricFamily("dflash_sidecar_disconnects",
                               "Shim connections closed (including ZeroMQ closing one for an oversized frame).",
                               labels=["host"])
    disc.add_metric([host], report.disconnects)
    return [accepted, dropped, last_seen, messages, entries, senders, series, frames, nbytes, disc]
