"""The daemon's lifecycle: build the pipeline and its listeners, then serve until SIGTERM.

Create -> start -> run -> shutdown. ``start`` binds everything and fails fast with a clear error;
``run`` notifies systemd and dispatches signals from the main thread (the handlers only enqueue
them): SIGTERM/SIGINT -> final flush and exit, SIGHUP -> reload the config file. ``shutdown`` is
idempotent and bounded. What happens to a record and a window, in which order, is
``sidecar.core.pipeline``'s; this module only wires it (docs/ARCHITECTURE.md, "How a record travels").
"""

from __future__ import annotations

import logging
import queue
import signal
import socket
import threading
from collections.abc import Callable
from typing import Protocol

from sidecar.aggregation.gpu_groups import GpuAggregates, GpuGroups
from sidecar.core import config as config_mod
from sidecar.core import systemd
from sidecar.core.admin import Admin
from sidecar.core.capture_watch import CaptureWatch
from sidecar.core.config import Config, ConfigError
from sidecar.core.ingest import IngestLoop
from sidecar.core.ledger_state import FILE_NAME, LedgerStage, state_dir
from sidecar.core.pipeline import (
    GpuStage,
    InsightStage,
    Listener,
    Pipeline,
    TrainerAttribution,
    window_stages,
)
from sidecar.core.scrape_state import ScrapeState
from sidecar.core.selfstats import raise_nofile_limit
from sidecar.exporters.base import Exporter
from sidecar.exporters.console import ConsoleExporter
from sidecar.exporters.prometheus.exporter import PrometheusExporter
from sidecar.exporters.wandb.cluster_row import ClusterRow
from sidecar.exporters.wandb.exporter import WandbConfig, WandbExporter
from sidecar.processing.mapping import Mapper
from sidecar.sources.nvml import NvmlSource
from sidecar.sources.receiver import Receiver
from trainer_shim.endpoint import daemon_endpoint, shim_would_miss
from trainer_shim.integrations.tap_targets import exclude as exclude_from_taps

log = logging.getLogger("sidecar")


class Reloading(Protocol):
    """A component with reloadable settings: ``settings`` is the whole ``Config`` (every
    component's section); it reads its own."""

    def reload(self, settings: Config) -> None: ...

SHUTDOWN_TIMEOUT_S = 4.0
"""Budget for the final window flush and W&B's final upload on SIGTERM (W&B may take up to
1.5 s more to tear down a stalled service)."""


class Daemon:
    """One daemon instance. Not reusable after ``shutdown``."""

    def __init__(self, config: Config, host: str | None = None,
                 cli_overrides: dict[str, object] | None = None) -> None:
        """``cli_overrides``: the flags given on the command line, which keep precedence over the
        config file when it is reloaded."""
        self.config = config
        self._cli_overrides = dict(cli_overrides or {})
        self.host = host or socket.gethostname()
        self.nvml = NvmlSource(interval_s=config.nvml_interval, cpu_budget=config.nvml_cpu_budget,
                               cadence=config.nvml_cadence) if config.gpu_metrics else None
        nvml = self.nvml
        self.gpus = GpuAggregates(GpuGroups.parse(config.gpu_group), nvml.latest if nvml else None,
                                  nvml.status if nvml else None, nvml.recent if nvml else None)
        self.wandb = WandbExporter(WandbConfig.from_settings(config, shutdown_timeout_s=SHUTDOWN_TIMEOUT_S / 2),
                                   host=self.host, own_run=exclude_from_taps) if config.wandb_run else None
        self.scrape_state = ScrapeState(gpus=self.gpus if nvml is not None else None)
        """What every exporter reads between windows; the other providers are attached once made."""
        self.prometheus = PrometheusExporter(self.host, config.prometheus_addr, config.prometheus_tls_cert,
                                             config.prometheus_tls_key, scrape_state=self.scrape_state,
                                             dcgm_compat=config.dcgm_compat)
        self.exporters: list[Exporter] = [self.prometheus, ConsoleExporter()]
        """Every destination, started in this order and stopped in the reverse (Prometheus serves
        until the end); each window goes to each."""
        if self.wandb is not None:
            self.exporters.append(self.wandb)
            if config.wandb_cluster_prometheus:
                self.exporters.append(ClusterRow(config.wandb_cluster_prometheus, self.host, self.wandb.submit))
        self.ledger = LedgerStage(state_dir(config.state_dir) / FILE_NAME, config.flops_per_token, config.run_gap_s)
        self.insight = InsightStage(config)
        self.captures = CaptureWatch(state_dir(config.state_dir), tuple(config.endpoint), config, self.host, self.wandb)
        listeners: list[Listener] = [*self.exporters, self.scrape_state, self.captures]
        if nvml is not None:
            listeners.append(TrainerAttribution(nvml.attribute_trainers))
        stages = window_stages(self.insight, self.ledger, GpuStage(self.gpus) if nvml is not None else None)
        self.pipeline = Pipeline(mapper=Mapper.from_settings(config, config), max_series=config.max_series,
                                 stages=stages, listeners=listeners)
        admin = Admin(self._mapping_in_force, gpu_metrics=nvml is not None, state_dir=state_dir(config.state_dir))
        self.scrape_state.attach(ingest=self.pipeline, wandb=self.wandb, admin=admin)
        self.ingest: IngestLoop | None = None
        self._signals: queue.SimpleQueue[int | str] = queue.SimpleQueue()
        self._stopped = False

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Bind the endpoints and the Prometheus port, start the exporters, ingest and NVML.
        Raises ``sources.receiver.EndpointError`` or ``OSError`` with a message saying what to fix.
        Call from the main thread: it installs the signal handlers."""
        cfg = self.config
        # Before anything is reachable: a SIGHUP sent as soon as /metrics answers (before ``run``)
        # would otherwise take its default action and kill the daemon. The handlers only enqueue.
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, lambda signum, _frame: self._signals.put(signum))
        self.ledger.load()
        raise_nofile_limit()  # before anything opens descriptors: the HTTP side's reserve is sized on it
        receiver = Receiver(list(cfg.endpoint))
        started: list[Exporter] = []
        try:
            for exporter in self.exporters:
                exporter.start()
                started.append(exporter)
        except BaseException:
            for exporter in reversed(started):
                exporter.shutdown(timeout_s=SHUTDOWN_TIMEOUT_S / 2)
            receiver.close()
            raise
        self.ingest = IngestLoop(receiver, cfg.interval, self.pipeline, gone_after_s=cfg.sender_gone_after)
        self.ingest.start()
        if self.nvml is not None:
            self.nvml.start()
        log.info("dflash-sidecar started: endpoints %s, Prometheus on %s%s, window %.1fs",
                 ", ".join(cfg.endpoint), cfg.prometheus_addr, " (TLS)" if cfg.prometheus_tls_cert else "",
                 cfg.interval)
        missed = shim_would_miss(cfg.endpoint[0]) if cfg.endpoint == (daemon_endpoint(),) else None
        if missed:
            log.warning("trainers of this user without DFLASH_SIDECAR_ENDPOINT connect to %s (a deployed daemon's "
                        "socket directory), not to this daemon: set DFLASH_SIDECAR_ENDPOINT=%s in their environment",
                        missed, cfg.endpoint[0])

    def run(self, before_shutdown: Callable[[], None] | None = None) -> int:
        """Serve until SIGTERM/SIGINT (or ``stop``); returns the exit status. Signals that arrived
        since ``start`` are waiting in the queue. ``before_shutdown`` runs while the daemon still
        receives (the demo closes its in-process senders there, so their last records and final
        tallies reach this daemon rather than being reconciled as lost by the next one)."""
        systemd.notify("READY=1\nSTATUS=serving")
        while True:
            try:
                signum = self._signals.get(timeout=1.0)
            except queue.Empty:
                continue
            if signum == signal.SIGHUP:
                self.reload()
                continue
            why = signum if isinstance(signum, str) else f"{signal.Signals(signum).name} received"
            log.info("dflash-sidecar: %s, flushing and exiting", why)
            if before_shutdown is not None:
                try:
                    before_shutdown()
                except Exception:  # noqa: BLE001 - the daemon's own flush must still happen
                    log.exception("dflash-sidecar: before-shutdown step failed")
            self.shutdown()
            return 0

    def stop(self, reason: str = "stop requested") -> None:
        """Ask ``run`` to return (from any thread); ``reason`` goes into the exit log line."""
        self._signals.put(reason)

    def reload(self) -> None:
        """Re-read the config file. Reloadable settings change at once; the others are reported as
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
        reloadable = config_mod.RELOADABLE  # each setting's declaration says whether a reload applies it
        changed = config_mod.changed(self.config, new)
        for part in self._reloading():
            part.reload(new)
        if "log_level" in changed:
            logging.getLogger("sidecar").setLevel(new.log_level.upper())
        restart = sorted(changed - reloadable)
        self.config = new
        applied = ", ".join(sorted(changed & reloadable)) or "no reloadable change"
        log.info("dflash-sidecar: config reloaded (%s)%s", applied,
                 f"; needs a restart to apply: {', '.join(restart)}" if restart else "")

    def shutdown(self) -> None:
        """Final window flush, then stop everything. Idempotent, bounded by ``SHUTDOWN_TIMEOUT_S``."""
        if self._stopped:
            return
        self._stopped = True
        systemd.notify("STOPPING=1")
        if self.ingest is not None and not self.ingest.shutdown(timeout_s=SHUTDOWN_TIMEOUT_S / 2):
            log.error("dflash-sidecar: ingest did not stop within %.1f s; its final window is lost",
                      SHUTDOWN_TIMEOUT_S / 2)
            self.ingest.receiver.remove_files()
        if self.nvml is not None:
            self.nvml.shutdown()
        for exporter in reversed(self.exporters):  # Prometheus last: it serves until the end
            exporter.shutdown(timeout_s=SHUTDOWN_TIMEOUT_S / 2)
        log.info("dflash-sidecar stopped")

    def _reloading(self) -> list[Reloading]:
        """Every component with reloadable settings, each through its ``reload(settings)``."""
        ingest: list[Reloading] = [self.ingest] if self.ingest is not None else []
        return [*ingest, self.pipeline, self.insight, *self.exporters, self.captures]

    def _mapping_in_force(self) -> tuple[Mapper, Config]:
        """The mapping and the settings in force (what ``/explain`` reports; the pipeline takes a
        reloaded mapping with its next frame)."""
        return self.pipeline.mapping(), self.config

