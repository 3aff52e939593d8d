"""Self-telemetry families: the daemon's own CPU, memory, threads and descriptors, ingest health
(as ``sidecar.core.admin`` reads them into the scrape state), and the W&B exporter's queue, built at
scrape time.

Not prometheus_client's ``ProcessCollector``: its families are ``process_*`` without the ``host``
label, it reports no thread count, and its CPU time comes in clock ticks from /proc/self/stat,
while these names (``dflash_sidecar_cpu_seconds_total``, ``..._resident_memory_bytes``,
``..._threads``, ``..._open_fds``, each with ``host``) are what deploy/'s alert rules, dashboard
and metric list use, and the CPU figure is getrusage's (microseconds).
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sidecar.exporters.base import WandbStatsLike
from sidecar.model.window import DaemonTelemetry


def self_families(host: str, stats: DaemonTelemetry | None) -> list[Metric]:
    """The process's own figures, plus ingest health once ingest runs; none without ``stats``."""
    if stats is None:
        return []
    ingest = stats.ingest
    labels = [host]
    cpu = CounterMetricFamily("dflash_sidecar_cpu_seconds", "CPU time used by the daemon (seconds).", labels=["host"])
    cpu.add_metric(labels, stats.cpu_seconds)
    rss = GaugeMetricFamily("dflash_sidecar_resident_memory_bytes", "Daemon resident memory (bytes).", labels=["host"])
    rss.add_metric(labels, stats.rss_bytes)
    threads = GaugeMetricFamily("dflash_sidecar_threads", "Daemon threads.", labels=["host"])
    threads.add_metric(labels, stats.threads)
    fds = GaugeMetricFamily("dflash_sidecar_open_fds", "Daemon open file descriptors.", labels=["host"])
    fds.add_metric(labels, stats.open_fds)
    families: list[Metric] = [cpu, rss, threads, fds]
    if ingest is not None:
        errors = CounterMetricFamily("dflash_sidecar_internal_errors", "Internal errors survived by ingest.",
                                     labels=["host"])
        errors.add_metric(labels, ingest.internal_errors)
        families.append(errors)
        age = GaugeMetricFamily("dflash_sidecar_data_age_seconds",
                                "Age of the newest data from each source (seconds).", labels=["host", "source"])
        if ingest.data_age_s is not None:
            age.add_metric(labels + ["trainer"], ingest.data_age_s)
        families.append(age)
    return families


def wandb_families(host: str, stats: WandbStatsLike | None) -> list[Metric]:
    """The W&B exporter's queue depth, rows logged and dropped, and state (a state set); none
    without W&B (``stats`` None)."""
    if stats is None:
        return []
    labels = [host]
    depth = GaugeMetricFamily("dflash_sidecar_wandb_queue_depth", "Rows waiting for W&B.", labels=["host"])
    depth.add_metric(labels, stats.queue_depth)
    logged = CounterMetricFamily("dflash_sidecar_wandb_rows_logged", "Rows logged to W&B.", labels=["host"])
    logged.add_metric(labels, stats.rows_logged)
    dropped = CounterMetricFamily("dflash_sidecar_wandb_dropped", "Rows not logged to W&B, by reason.",
                                  labels=["host", "reason"])
    for reason, n in stats.rows_dropped.items():
        dropped.add_metric(labels + [reason], n)
    state = GaugeMetricFamily("dflash_sidecar_wandb_state", "W&B exporter state (1 for the current one).",
                              labels=["host", "state"])
    for member in type(stats.state):
        state.add_metric(labels + [member.value], 1.0 if member == stats.state else 0.0)
    return [depth, logged, dropped, state]
