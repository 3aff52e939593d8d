"""Prometheus families of the senders' ends (``dflash_sidecar_sender_*exit*``), built at scrape
time from the window's ``EndsView``. docs/METRICS.md ("How senders ended") lists them."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sidecar.model.ends import HOWS, EndsView


def ends_families(view: EndsView, roles: Iterable[str], host: str) -> list[Metric]:
    """The counter of ends per role and how, and each role's last end (the families are always
    present). The counter has every how at 0 for each of ``roles`` (those with senders) before
    their first end: ``increase()`` then sees the first end (a series born at 1 shows none)."""
    exits = CounterMetricFamily("dflash_sidecar_sender_exits", "Sender processes that ended, per role and how: "
                                "clean, terminated, failed, unclean, oom, crashed (docs/RELIABILITY.md).",
                                labels=["host", "role", "how"])
    counts = {(role, how): 0 for role in roles for how in HOWS} | dict(view.counts)
    for (role, how), n in sorted(counts.items()):
        exits.add_metric([host, role, how], n)
    last = GaugeMetricFamily("dflash_sidecar_sender_last_exit_timestamp_seconds",
                             "Each role's last sender end: Unix time of its tally's last write, with how it "
                             "ended, the signal, its pid and last step, what ended it (cause: exception, "
                             "exit_code, cuda_oom, host_oom, nccl, signal; empty: nothing known) and the GPU "
                             "of a cuda_oom as labels.",
                             labels=["host", "role", "worker", "how", "signal", "pid", "step", "cause", "gpu"])
    unknown = GaugeMetricFamily("dflash_sidecar_sender_last_exit_unknown_records",
                                "Of each role's last sender end, the records it made after its last flush whose "
                                "fate is unknown, at most (its queues' size; 0 after a final tally).",
                                labels=["host", "role", "worker"])
    for role, end in sorted(view.last.items()):
        step = "" if end.step is None else str(end.step)
        gpu = str(end.gpu) if end.gpu >= 0 else ""
        last.add_metric([host, role, end.worker, end.how, end.signal, str(end.pid), step, end.cause, gpu], end.unix_s)
        unknown.add_metric([host, role, end.worker], end.unknown_max)
    return [exits, last, unknown]
