"""The page for W&B's open-metrics scraper: ``/metrics/wandb``.

W&B's SDK (wandb-core's system monitor, ``x_stats_open_metrics_endpoints``) scrapes a Prometheus
page into the trainer's own run as system metrics, keyed ``openmetrics.<endpoint>.<family>.<index>``
where ``<index>`` numbers the label sets of a family in the order it first saw them: on ``/metrics``
``dflash_pipeline_batches_per_second{role="drafter"}`` becomes an opaque ``...batches_per_second.1``.
It reads gauges and counters only (summaries and untyped samples are skipped).

This page carries the figures a person reads in a run with what the labels carried moved into
the family name, one sample each whose only label is ``host`` (constant for the daemon, and what
W&B's label filters can match), so every key ends in ``.0`` and reads
``openmetrics.sidecar.dflash_role_drafter_batches_per_second.0``. Every family is a projection of
a ``/metrics`` family, declared once in ``PROJECTIONS``: its source sample name, the labels folded
into the name, and how the source's samples reduce to one value (by default their sum: the
senders' accounting totals over senders). The values are therefore those of ``/metrics`` for the
same window and GPU snapshot.

Bounded and stable: each projection admits at most ``MAX_NAMES_PER_PROJECTION`` names, first come
first served, and keeps them for the daemon's life, so a new role or reason never pushes out one
the run's panels already show; a name refused by the bound (or whose folded values collide after
sanitizing) is counted in ``dflash_sidecar_wandb_page_refused`` (names left off by this scrape).
A value the daemon does not have (no GPU telemetry, a role that stopped) is absent, never zero.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sidecar.exporters.prometheus import exposition as ex
from sidecar.exporters.prometheus.collector import SidecarCollector, accounting_families
from sidecar.exporters.prometheus.gpu import gpu_metric_families
from sidecar.exporters.prometheus.insight import insight_families
from sidecar.model.insight import INSIGHT_VALUES, VERDICT_CODES

Samples = list[tuple[dict[str, str], float]]
"""The samples of one ``/metrics`` sample name: (labels, value)."""

MAX_NAMES_PER_PROJECTION = 32
"""Names one projection may add (e.g. 32 roles for ``dflash_role_{role}_batches_per_second``)."""


def _sum(samples: Samples) -> float | None:
    return sum(v for _, v in samples) if samples else None


def _verdict_code(samples: Samples) -> float | None:
    """The code of the verdict whose state is 1 in ``dflash_pipeline_bottleneck``."""
    current = [labels["verdict"] for labels, v in samples if v == 1.0 and labels.get("verdict") in VERDICT_CODES]
    return float(VERDICT_CODES[current[0]]) if current else None


@dataclass(frozen=True, slots=True)
class Projection:
    """One family of the page, projected from a ``/metrics`` sample name."""

    name: str
    """Page family name; ``{label}`` placeholders take the (sanitized) values of ``fold``."""
    source: str
    """``/metrics`` sample name (counters with their ``_total``)."""
    help: str
    """HELP text; with ``fold``, it may use the same placeholders (raw label values)."""
    fold: tuple[str, ...] = ()
    """Labels of ``source`` moved into the name; the others are reduced over."""
    reduce: Callable[[Samples], float | None] = _sum
    counter: bool = False
    """A counter (``_total`` is appended to ``name``), else a gauge."""


def _group(metric: str, help_text: str, name: str | None = None) -> Projection:
    return Projection(f"dflash_group_{{group}}_{name or metric}", f"dflash_group_{metric}", help_text, ("group",))


PROJECTIONS: tuple[Projection, ...] = (
    Projection("dflash_verdict_code", "dflash_pipeline_bottleneck",
               "Bottleneck verdict of the last window as its code (the run's config "
               "'dflash_verdict_code' names each code).", reduce=_verdict_code),
    Projection("dflash_bottleneck_{verdict}", "dflash_pipeline_bottleneck",
               "1 while the last window's verdict is {verdict}, else 0.", ("verdict",)),
    Projection("dflash_verdict_confidence_ratio", "dflash_pipeline_verdict_confidence_ratio",
               "Confidence of the bottleneck verdict (0-1)."),
    *(Projection(f"dflash_pipeline_{item.name}", f"dflash_pipeline_{item.name}", item.help) for item in INSIGHT_VALUES),
    Projection("dflash_role_{role}_tokens_per_second", "dflash_pipeline_tokens_per_second",
               "Tokens processed per second by the {role} workers (last window).", ("role",)),
    Projection("dflash_role_{role}_batches_per_second", "dflash_pipeline_batches_per_second",
               "Batches processed per second by the {role} workers (last window).", ("role",)),
    Projection("dflash_role_{role}_rate_cv_ratio", "dflash_pipeline_rate_cv_ratio",
               "Coefficient of variation of the {role} workers' batch rates.", ("role",)),
    Projection("dflash_role_{role}_time_share_{phase}_ratio", "dflash_pipeline_time_share_ratio",
               "Share of the {role} role's wall time in phase {phase} (0-1).", ("role", "phase")),
    Projection("dflash_pipeline_stragglers", "dflash_pipeline_straggler",
               "Workers flagged as stragglers in the last window."),
    Projection("dflash_group_{group}_gpu_idle_ratio", "dflash_pipeline_gpu_idle_ratio",
               "Idle share of the {group} GPUs, latest poll (0-1).", ("group",)),
    Projection("dflash_group_{group}_gpu_idle_{reason}_ratio", "dflash_pipeline_gpu_idle_reason_ratio",
               "Part of the {group} GPUs' idle share explained by {reason} (0-1).", ("group", "reason")),
    _group("gpu_utilization_ratio", "Mean GPU utilization of the {group} GPUs (0-1)."),
    _group("power_watts", "Total power draw of the {group} GPUs, in watts."),
    _group("memory_free_min_bytes", "Least free device memory among the {group} GPUs, in bytes."),
    _group("temperature_max_celsius", "Hottest GPU die of the {group} GPUs, in degrees Celsius."),
    Projection("dflash_group_{group}_gpus_up", "dflash_group_gpus_up", "GPUs of the {group} group that are up.",
               ("group",)),
    Projection("dflash_sidecar_senders", "dflash_sidecar_senders", "Live senders (shims heard from in the last 10 s)."),
    Projection("dflash_sidecar_records_accepted", "dflash_sidecar_records_accepted_total",
               "Records aggregated, all senders.", counter=True),
    Projection("dflash_sidecar_records_dropped_{reason}", "dflash_sidecar_records_dropped_total",
               "Records lost or rejected for reason {reason}, all senders.", ("reason",), counter=True),
    Projection("dflash_sidecar_messages_dropped_{reason}", "dflash_sidecar_messages_dropped_total",
               "Whole messages dropped for reason {reason}.", ("reason",), counter=True),
)
"""Every family of the page, in page order (docs/METRICS.md, "The W&B open-metrics page")."""

REFUSED = "dflash_sidecar_wandb_page_refused"

_NOT_NAME = re.compile(r"[^A-Za-z0-9_]")


def name_part(value: str) -> str:
    """A label value as a part of a metric name: every character but ``[A-Za-z0-9_]`` becomes
    ``_`` (``input-bound`` -> ``input_bound``)."""
    return _NOT_NAME.sub("_", value) or "_"


class WandbPage:
    """Renders ``/metrics/wandb`` from the collector's state (the window's insight and
    accounting, the GPUs' latest snapshot). Safe to call from concurrent scrape threads."""

    def __init__(self, collector: SidecarCollector, clock: Callable[[], float] = time.monotonic) -> None:
        self.collector = collector
        self.clock = clock
        self._admitted: list[dict[tuple[str, ...], str]] = [{} for _ in PROJECTIONS]
        """Per projection: folded label values -> the name they were given."""
        self._taken: set[str] = set()
        self._lock = threading.Lock()

    def families(self) -> list[Metric]:
        """The page's families for the current state."""
        index = self._source_samples()
        host = self.collector.state.host
        out: list[Metric] = []
        refused = 0
        for i, projection in enumerate(PROJECTIONS):
            groups: dict[tuple[str, ...], Samples] = {}
            for labels, sample_value in index.get(projection.source, ()):
                key = tuple(labels.get(label, "") for label in projection.fold)
                groups.setdefault(key, []).append((labels, sample_value))
            for key, samples in groups.items():
                name = self._admit(i, projection, key)
                if name is None:
                    refused += 1
                    continue
                value = projection.reduce(samples)
                if value is None:
                    continue
                help_text = projection.help.format(**dict(zip(projection.fold, key))) if key else projection.help
                if projection.counter:
                    counter = CounterMetricFamily(name, help_text, labels=["host"])
                    counter.add_metric([host], value)
                    out.append(counter)
                else:
                    gauge = GaugeMetricFamily(name, help_text, labels=["host"])
                    gauge.add_metric([host], value)
                    out.append(gauge)
        left_off = GaugeMetricFamily(REFUSED, "Names this scrape of the page left off (over the bound of names per "
                                     "family, or a folded label value that collides with another after sanitizing).",
                                     labels=["host"])
        left_off.add_metric([host], float(refused))
        out.append(left_off)
        return out

    def render(self) -> bytes:
        """The page as text exposition 0.0.4."""
        return ex.render_metrics(self.collector.guarded("wandb_page", self.families)).encode()

    def legend(self) -> bytes:
        """``/metrics/wandb/legend``: JSON with the verdict codes (code -> name) and the page's
        samples now (name -> help), for the trainer's run config."""
        families = {s.name: f.documentation for f in self.collector.guarded("wandb_page", self.families)
                    for s in f.samples}
        return json.dumps({"verdict_codes": {str(code): name for name, code in VERDICT_CODES.items()},
                           "families": families}).encode()

    def _source_samples(self) -> dict[str, Samples]:
        state = self.collector.state
        report = state.report  # one read: the whole page sees one window
        families: list[Metric] = []
        if report is not None:
            families += self.collector.guarded("accounting", lambda: accounting_families(report, state.host))
            if report.insight is not None:
                insight = report.insight
                families += self.collector.guarded("insight", lambda: insight_families(insight, state.host))
        scraped = state.scrape_state
        if scraped.has_gpus:
            families += self.collector.guarded(
                "gpu", lambda: gpu_metric_families(scraped.gpu_view(), state.host, self.clock()))  # type: ignore[arg-type]
        index: dict[str, Samples] = {}
        for family in families:
            for sample in family.samples:
                index.setdefault(sample.name, []).append((sample.labels, sample.value))
        return index

    def _admit(self, i: int, projection: Projection, key: tuple[str, ...]) -> str | None:
        """The name of ``key``'s family, admitting it if there is room; None if refused."""
        with self._lock:
            admitted = self._admitted[i]
            name = admitted.get(key)
            if name is not None:
                return name
            name = projection.name.format(**{label: name_part(v) for label, v in zip(projection.fold, key)})
            if len(admitted) >= MAX_NAMES_PER_PROJECTION or name in self._taken:
                return None
            admitted[key] = name
            self._taken.add(name)
            return name


def family_templates() -> Sequence[str]:
    """The page's family names as declared (placeholders kept; counters with ``_total``)."""
    return [p.name + ("_total" if p.counter else "") for p in PROJECTIONS]
