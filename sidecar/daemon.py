"""The daemon's lifecycle: wire sources -> aggregation -> exporters, then serve until SIGTERM.

Create -> start -> run -> shutdown. ``start`` binds everything and fails fast with a clear error;
``run`` notifies systemd and dispatches signals from the main thread (the handlers only enqueue
them): SIGTERM/SIGINT -> final flush and exit, SIGHUP -> reload the config file. ``shutdown`` is
idempotent and bounded.
"""

from __future__ import annotations

import logging
import queue
import signal
import socket
import time
from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sidecar import config as config_mod
from sidecar import systemd
from sidecar.aggregation.insight import EXTRAS_KEY, GpuFacts, compute_insight
from sidecar.aggregation.verdict import InsightSettings
from sidecar.config import Config, ConfigError
from sidecar.exporters.console import ConsoleExporter
from sidecar.aggregation.gpu_groups import GpuGroups
from sidecar.aggregation.senders import SenderState
from sidecar.exporters.console_insight import insight_part
from sidecar.exporters.wandb.insight_row import insight_row
from sidecar.exporters.prometheus.collector import ExportState
from sidecar.exporters.prometheus.server import serve
from sidecar.exporters.wandb.rows import accounting_row, trainer_row
from sidecar.exporters.wandb.exporter import WandbConfig, WandbExporter
from sidecar.gpus import GpuTelemetry
from sidecar.exporters.prometheus.insight import InsightSource
from sidecar.ingest import IngestLoop
from sidecar.model.window import IngestReport
from sidecar.selfstats import read_self
from sidecar.sources.receiver import Receiver

log = logging.getLogger("sidecar")

SHUTDOWN_TIMEOUT_S = 4.0
"""Budget for the final window flush and W&B's final upload on SIGTERM (W&B may take up to
1.5 s more to tear down a stalled service)."""

WindowConsumer = Callable[[IngestReport], None]


class Daemon:
    """One daemon instance. Not reusable after ``shutdown``."""

    def __init__(self, config: Config, host: str | None = None,
                 cli_overrides: dict[str, object] | None = None) -> None:
        """``cli_overrides``: the flags given on the command line, which keep precedence over the
        config file when it is reloaded."""
        self.config = config
        self._cli_overrides = dict(cli_overrides or {})
        self.host = host or socket.gethostname()
        self.state = ExportState(host=self.host, started_unix_s=time.time())
        self.state.self_families = self._self_families
        self.console = ConsoleExporter()
        self.console.hooks.append(insight_part)
        self.insight = InsightSource(self.host)
        self.state.extra_sources.append(self.insight)
        self.gpu_facts: Callable[[], GpuFacts | None] | None = None
        """Per-GPU facts for the insight (throttle reasons, GPU roles); wired to the NVML source."""
        self.insight_failures = 0
        self.window_consumers: list[WindowConsumer] = [self.console.export]
        self.hello_consumers: list[Callable[[SenderState], None]] = []
        self.row_builders: list[Callable[[IngestReport], dict[str, float]]] = [
            trainer_row, accounting_row, _insight_row]
        self.wandb: WandbExporter | None = None
        if config.wandb_run:
            self.wandb = WandbExporter(wandb_config(config), host=self.host)
            self.window_consumers.append(self._submit_wandb)
            self.hello_consumers.append(self._hello_to_wandb)
            self.state.extra_sources.append(self._wandb_families)
        self.gpus = GpuTelemetry(config.gpu_metrics, config.nvml_interval, GpuGroups.parse(config.gpu_group), self.host)
        self.state.extra_sources.append(self.gpus.families)
        self.gpu_facts = self.gpus.facts
        self.hello_consumers.append(self.gpus.on_hello)
        self.window_consumers.append(self.gpus.on_window)
        self.row_builders.append(self.gpus.wandb_row)
        self.ingest: IngestLoop | None = None
        self._server = None
        self._signals: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._stopped = False

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Bind the endpoints and the Prometheus port, start ingest. Raises
        ``sources.receiver.EndpointError`` or ``OSError`` with a message saying what to fix."""
        cfg = self.config
        receiver = Receiver(list(cfg.endpoint))
        try:
            self._server, _ = serve(self.state, cfg.prometheus_addr, cfg.prometheus_tls_cert, cfg.prometheus_tls_key)
        except OSError as exc:
            receiver.close()
            raise OSError(f"cannot serve Prometheus on {cfg.prometheus_addr}: {exc.strerror or exc}; "
                          "choose another with --prometheus-addr") from None
        self.ingest = IngestLoop(receiver, cfg.interval, self._on_window, on_hello=self._on_hello,
                                 max_series=cfg.max_series)
        self.ingest.start()
        self.gpus.start()
        if self.wandb is not None:
            self.wandb.start()
        log.info("dflash-sidecar started: endpoints %s, Prometheus on %s%s, window %.1fs",
                 ", ".join(cfg.endpoint), cfg.prometheus_addr, " (TLS)" if cfg.prometheus_tls_cert else "",
                 cfg.interval)

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT; returns the exit status. Must run on the main thread."""
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda signum, _frame: self._signals.put(signum))
        systemd.notify("READY=1\nSTATUS=serving")
        while True:
            try:
                signum = self._signals.get(timeout=1.0)
            except queue.Empty:
                continue
            if signum == signal.SIGHUP:
                self.reload()
                continue
            log.info("dflash-sidecar: %s received, flushing and exiting", signal.Signals(signum).name)
            self.shutdown()
            return 0

    def stop(self) -> None:
        """Ask ``run`` to return (from any thread)."""
        self._signals.put(signal.SIGTERM)

    def reload(self) -> None:
        """Re-read the config file. Settings that can change live do; the others are reported as
        needing a restart. An invalid file is rejected and the running config kept."""
        systemd.notify("RELOADING=1")
        try:
            if self.config.config_file is None:
                log.info("dflash-sidecar: SIGHUP without --config: nothing to reload")
                return
            new = config_mod.load({"config_file": self.config.config_file, **self._cli_overrides})
        except ConfigError as exc:
            log.error("dflash-sidecar: reload rejected, keeping the running config: %s", exc)
            return
        finally:
            systemd.notify("READY=1")
        live = {"interval", "log_level"} | {f for f in Config.__dataclass_fields__ if f.startswith("insight_")}
        changed = {f for f in Config.__dataclass_fields__ if getattr(new, f) != getattr(self.config, f)}
        if "interval" in changed and self.ingest is not None:
            self.ingest.set_interval(new.interval)
        if "log_level" in changed:
            logging.getLogger("sidecar").setLevel(new.log_level.upper())
        restart = sorted(changed - live)
        self.config = new
        log.info("dflash-sidecar: config reloaded (%s)%s", ", ".join(sorted(changed & live)) or "no live change",
                 f"; needs a restart to apply: {', '.join(restart)}" if restart else "")

    def shutdown(self) -> None:
        """Final window flush, then stop everything. Idempotent, bounded by ``SHUTDOWN_TIMEOUT_S``."""
        if self._stopped:
            return
        self._stopped = True
        systemd.notify("STOPPING=1")
        if self.ingest is not None:
            self.ingest.shutdown(timeout_s=SHUTDOWN_TIMEOUT_S / 2)
        self.gpus.shutdown()
        if self.wandb is not None:
            self.wandb.shutdown(timeout_s=SHUTDOWN_TIMEOUT_S / 2)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        log.info("dflash-sidecar stopped")

    # -- window fan-out (ingest thread) ----------------------------------------------------------

    def _on_window(self, report: IngestReport) -> None:
        self._attach_insight(report)
        self.state.report = report
        for consumer in self.window_consumers:
            try:
                consumer(report)
            except Exception:  # noqa: BLE001 - one exporter must not stop the others
                log.exception("sidecar: window consumer %r failed", consumer)

    def _on_hello(self, sender: SenderState) -> None:
        for consumer in self.hello_consumers:
            try:
                consumer(sender)
            except Exception:  # noqa: BLE001
                log.exception("sidecar: hello consumer %r failed", consumer)

    def _hello_to_wandb(self, sender: SenderState) -> None:
        assert self.wandb is not None
        h = sender.hello or {}
        self.wandb.on_trainer_hello(h.get("wandb_run_id"), h.get("wandb_project"), h.get("wandb_entity"),
                                    h.get("wandb_mode"), h.get("wandb_primary"))

    def _submit_wandb(self, report: IngestReport) -> None:
        assert self.wandb is not None
        # Keys carry the host: in a run shared by several nodes each node's sidecar writes its own.
        row: dict[str, float] = {}
        for build in self.row_builders:
            row.update((f"{self.host}/{key}", value) for key, value in build(report).items())
        self.wandb.submit(row, report.window.trainer_step)

    def _wandb_families(self) -> Iterable[Metric]:
        assert self.wandb is not None
        stats = self.wandb.stats()
        host = [self.host]
        depth = GaugeMetricFamily("dflash_sidecar_wandb_queue_depth", "Rows waiting for W&B.", labels=["host"])
        depth.add_metric(host, stats.queue_depth)
        logged = CounterMetricFamily("dflash_sidecar_wandb_rows_logged", "Rows logged to W&B.", labels=["host"])
        logged.add_metric(host, stats.rows_logged)
        dropped = CounterMetricFamily("dflash_sidecar_wandb_dropped", "Rows not logged to W&B, by reason.",
                                      labels=["host", "reason"])
        for reason, n in stats.rows_dropped.items():
            dropped.add_metric(host + [reason], n)
        state = GaugeMetricFamily("dflash_sidecar_wandb_state", "W&B exporter state (1 for the current one).",
                                  labels=["host", "state"])
        for member in type(stats.state):
            state.add_metric(host + [member.value], 1.0 if member == stats.state else 0.0)
        return [depth, logged, dropped, state]
    def _attach_insight(self, report: IngestReport) -> None:
        """Compute the window's pipeline insight once, before any exporter sees the report: it goes
        into ``report.extras`` (console, W&B) and to the Prometheus source."""
        try:
            facts = self.gpu_facts() if self.gpu_facts is not None else None
            insight = compute_insight(report, InsightSettings.from_config(self.config), facts)
        except Exception:  # noqa: BLE001 - the insight must never stop the raw exports
            self.insight_failures += 1
            if self.insight_failures == 1:
                log.exception("sidecar: pipeline insight failed (counted, logged once)")
            return
        report.extras[EXTRAS_KEY] = insight
        self.insight.insight = insight

    def _self_families(self) -> Iterable[Metric]:
        stats = read_self()
        host = [self.host]
        cpu = CounterMetricFamily("dflash_sidecar_cpu_seconds", "CPU time used by the daemon (seconds).", labels=["host"])
        cpu.add_metric(host, stats.cpu_seconds)
        rss = GaugeMetricFamily("dflash_sidecar_resident_memory_bytes", "Daemon resident memory (bytes).", labels=["host"])
        rss.add_metric(host, stats.rss_bytes)
        threads = GaugeMetricFamily("dflash_sidecar_threads", "Daemon threads.", labels=["host"])
        threads.add_metric(host, stats.threads)
        fds = GaugeMetricFamily("dflash_sidecar_open_fds", "Daemon open file descriptors.", labels=["host"])
        fds.add_metric(host, stats.open_fds)
        families: list[Metric] = [cpu, rss, threads, fds]
        ingest = self.ingest
        if ingest is not None:
            errors = CounterMetricFamily("dflash_sidecar_internal_errors", "Internal errors survived by ingest.",
                                         labels=["host"])
            errors.add_metric(host, ingest.internal_errors)
            families.append(errors)
            age = GaugeMetricFamily("dflash_sidecar_data_age_seconds",
                                    "Age of the newest data from each source (seconds).", labels=["host", "source"])
            if ingest.last_data_monotonic is not None:
                age.add_metric(host + ["trainer"], time.monotonic() - ingest.last_data_monotonic)
            families.append(age)
        return families


def wandb_config(config: Config) -> WandbConfig:
    """The W&B exporter's settings from the daemon's."""
    return WandbConfig(run=config.wandb_run, project=config.wandb_project, entity=config.wandb_entity,
                       queue_size=config.wandb_queue, shutdown_timeout_s=SHUTDOWN_TIMEOUT_S / 2)


def _insight_row(report: IngestReport) -> dict[str, float]:
    insight = report.extras.get(EXTRAS_KEY)
    return insight_row(insight) if insight is not None else {}
