"""The daemon's lifecycle: wire sources -> aggregation -> exporters, then serve until SIGTERM.

Create -> start -> run -> shutdown. ``start`` binds everything and fails fast with a clear error;
``run`` notifies systemd and dispatches signals from the main thread (the handlers only enqueue
them): SIGTERM/SIGINT -> final flush and exit, SIGHUP -> reload the config file. ``shutdown`` is
idempotent and bounded.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import signal
import socket
import threading

from sidecar import config as config_mod
from sidecar import systemd
from sidecar.aggregation.gpu_groups import GpuAggregates, GpuGroups
from sidecar.aggregation.insight import compute_insight
from sidecar.aggregation.ledger import RunLedger, window_facts
from sidecar.aggregation.senders import SenderState
from sidecar.aggregation.verdict import Hysteresis
from sidecar.config import Config, ConfigError
from sidecar.exporters.base import Exporter
from sidecar.exporters.console import ConsoleExporter
from sidecar.exporters.prometheus.exporter import PrometheusExporter
from sidecar.exporters.prometheus.server import raise_nofile_limit
from sidecar.exporters.wandb.exporter import WandbConfig, WandbExporter
from sidecar.ingest import IngestLoop
from sidecar.ledger_state import FILE_NAME, state_dir
from sidecar.ledger_state import load as load_ledger
from sidecar.ledger_state import save as save_ledger
from sidecar.model.insight import PipelineInsight
from sidecar.model.ledger import RunLedgerView
from sidecar.model.window import IngestHealth, IngestReport
from sidecar.processing.explain import explain_data
from sidecar.processing.mapping import Mapper
from sidecar.sources.nvml import NvmlSource
from sidecar.sources.receiver import Receiver
from trainer_shim.endpoint import daemon_endpoint, shim_would_miss

log = logging.getLogger("sidecar")

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
        self.nvml = NvmlSource(interval_s=config.nvml_interval) if config.gpu_metrics else None
        nvml = self.nvml
        self.gpus = GpuAggregates(GpuGroups.parse(config.gpu_group), nvml.latest if nvml else None,
                                  nvml.status if nvml else None, nvml.recent if nvml else None)
        self.insight_failures = 0
        self.hysteresis = Hysteresis()
        """Keeps the shown verdict from flapping (ingest thread only)."""
        self.mapper = Mapper.from_settings(config, config)
        self.wandb = WandbExporter(WandbConfig.from_settings(config, shutdown_timeout_s=SHUTDOWN_TIMEOUT_S / 2),
                                   host=self.host) if config.wandb_run else None
        self.prometheus = PrometheusExporter(
            self.host, config.prometheus_addr, config.prometheus_tls_cert, config.prometheus_tls_key,
            gpus=self.gpus.view, ingest=self._ingest_health, wandb=self.wandb.stats if self.wandb else None,
            explain=self._explain, dcgm_compat=config.dcgm_compat)
        self.exporters: list[Exporter] = [ConsoleExporter(), self.prometheus]
        """Every destination; each window goes to each, in this order."""
        if self.wandb is not None:
            self.exporters.append(self.wandb)
        self.ledger_path = state_dir(config.state_dir) / FILE_NAME
        self.ledger_errors: dict[str, int] = {}
        """Reason -> failed loads, saves or window updates of the run ledger (ingest thread)."""
        self.ledger = RunLedger(None, config.flops_per_token)
        self.ingest: IngestLoop | None = None
        self._signals: queue.SimpleQueue[int | str] = queue.SimpleQueue()
        self._stopped = False

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Bind the endpoints and the Prometheus port, start ingest, NVML and the exporters.
        Raises ``sources.receiver.EndpointError`` or ``OSError`` with a message saying what to fix.
        Call from the main thread: it installs the signal handlers."""
        cfg = self.config
        # Before anything is reachable: a SIGHUP sent as soon as /metrics answers (before ``run``)
        # would otherwise take its default action and kill the daemon. The handlers only enqueue.
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, lambda signum, _frame: self._signals.put(signum))
        self._load_ledger()
        raise_nofile_limit()  # before anything opens descriptors: the HTTP side's reserve is sized on it
        receiver = Receiver(list(cfg.endpoint))
        try:
            self.prometheus.start()
        except OSError:
            receiver.close()
            raise
        self.ingest = IngestLoop(receiver, cfg.interval, self._on_window, on_hello=self._on_hello,
                                 max_series=cfg.max_series, mapper=self.mapper)
        self.ingest.start()
        if self.nvml is not None:
            self.nvml.start()
        for exporter in self.exporters:
            if exporter is not self.prometheus:
                exporter.start()
        log.info("dflash-sidecar started: endpoints %s, Prometheus on %s%s, window %.1fs",
                 ", ".join(cfg.endpoint), cfg.prometheus_addr, " (TLS)" if cfg.prometheus_tls_cert else "",
                 cfg.interval)
        missed = shim_would_miss(cfg.endpoint[0]) if cfg.endpoint == (daemon_endpoint(),) else None
        if missed:
            log.warning("trainers of this user without DFLASH_SIDECAR_ENDPOINT connect to %s (a deployed daemon's "
                        "socket directory), not to this daemon: set DFLASH_SIDECAR_ENDPOINT=%s in their environment",
                        missed, cfg.endpoint[0])

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT (or ``stop``); returns the exit status. Signals that arrived
        since ``start`` are waiting in the queue."""
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
            self.shutdown()
            return 0

    def stop(self, reason: str = "stop requested") -> None:
        """Ask ``run`` to return (from any thread); ``reason`` goes into the exit log line."""
        self._signals.put(reason)

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
        live = config_mod.LIVE  # each setting's declaration says whether it applies live
        changed = config_mod.changed(self.config, new)
        if "interval" in changed and self.ingest is not None:
            self.ingest.set_interval(new.interval)
        if ({"mapping", "insight_target_role", "insight_drafter_role"} & changed) and self.ingest is not None:
            self.mapper = Mapper.from_settings(new, new)
            self.ingest.set_mapper(self.mapper)
        if "dcgm_compat" in changed:
            self.prometheus.state.dcgm_compat = new.dcgm_compat
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
        if self.ingest is not None and not self.ingest.shutdown(timeout_s=SHUTDOWN_TIMEOUT_S / 2):
            log.error("dflash-sidecar: ingest did not stop within %.1f s; its final window is lost",
                      SHUTDOWN_TIMEOUT_S / 2)
            self.ingest.receiver.remove_files()
        if self.nvml is not None:
            self.nvml.shutdown()
        for exporter in self.exporters:  # Prometheus after W&B: it serves until the end
            if exporter is not self.prometheus:
                exporter.shutdown(timeout_s=SHUTDOWN_TIMEOUT_S / 2)
        self.prometheus.shutdown()
        log.info("dflash-sidecar stopped")

    # -- window fan-out (ingest thread) ----------------------------------------------------------

    def _on_window(self, report: IngestReport) -> None:
        if self.nvml is not None:  # forget the pids of senders the registry has forgotten
            self.nvml.attribute_trainers({s.pid: (s.role, s.worker) for s in report.senders if s.pid is not None},
                                         complete=True)
        window = dataclasses.replace(report, insight=self._insight(report),
                                     gpu=self.gpus.view() if self.nvml is not None else None)
        window = dataclasses.replace(window, run_ledger=self._run_ledger(window))
        for exporter in self.exporters:
            try:
                exporter.consume(window)
            except Exception:  # noqa: BLE001 - one exporter must not stop the others
                log.exception("sidecar: exporter %s failed on a window", exporter.name)

    def _on_hello(self, sender: SenderState) -> None:
        if self.nvml is not None and sender.pid is not None:
            self.nvml.attribute_trainers({sender.pid: (sender.role, sender.worker)}, complete=False)
        for exporter in self.exporters:
            try:
                exporter.hello(sender.hello or {})
            except Exception:  # noqa: BLE001
                log.exception("sidecar: exporter %s failed on a hello", exporter.name)

    def _insight(self, report: IngestReport) -> PipelineInsight | None:
        """The window's pipeline insight, or None (counted, logged once) if computing it failed:
        the insight must never stop the raw exports."""
        try:
            insight = compute_insight(report.window, self.config,
                                      self.gpus.facts(report.window.duration_s), report.senders)
        except Exception:  # noqa: BLE001
            self.insight_failures += 1
            if self.insight_failures == 1:
                log.exception("sidecar: pipeline insight failed (counted, logged once)")
            return None
        shown = self.hysteresis.update(insight.verdict)
        if shown is not insight.verdict:
            insight = dataclasses.replace(insight, verdict=shown, raw_verdict=insight.verdict)
        return insight

    def _load_ledger(self) -> None:
        state, problem = load_ledger(self.ledger_path)
        if problem:
            self._ledger_error(f"load_{problem}")
        try:
            self.ledger = RunLedger(state, self.config.flops_per_token)
        except (TypeError, ValueError, KeyError, AttributeError):
            self._ledger_error("load_corrupt")
            self.ledger = RunLedger(None, self.config.flops_per_token)
        if state is not None:
            log.info("dflash-sidecar: run ledger continued from %s (%d runs)", self.ledger_path, len(self.ledger.runs))

    def _run_ledger(self, window: IngestReport) -> RunLedgerView | None:
        """Fold the window into the run ledger and save it (ingest thread); None if that failed
        (counted, logged once per reason): the ledger must never stop the other exports."""
        try:
            self.ledger.add(window_facts(window))
        except Exception:  # noqa: BLE001
            self._ledger_error("update_failed", exc_info=True)
            return None
        try:
            save_ledger(self.ledger_path, self.ledger.state())
        except OSError as exc:
            self._ledger_error("save_failed", detail=f"{self.ledger_path}: {exc}")
        return self.ledger.view(self.ledger_errors)

    def _ledger_error(self, reason: str, detail: str = "", exc_info: bool = False) -> None:
        self.ledger_errors[reason] = self.ledger_errors.get(reason, 0) + 1
        if self.ledger_errors[reason] == 1:
            log.error("sidecar: run ledger %s (counted, logged once)%s", reason.replace("_", " "),
                      f": {detail}" if detail else "", exc_info=exc_info)

    def _explain(self) -> dict[str, object]:
        """What ``dflash-sidecar explain`` prints (served as JSON on ``/explain``; scrape thread)."""
        facts = self.gpus.facts()
        if facts is not None and facts.busy:
            gpu_missing = None
        elif self.nvml is None:
            gpu_missing = "NVML disabled: --no-gpu-metrics"
        else:
            status = self.nvml.status()
            gpu_missing = f"NVML {status.state.value}{': ' + status.reason if status.reason else ''}"
        return explain_data(self.prometheus.state.report, self.mapper, self.config, gpu_missing)

    def _ingest_health(self) -> IngestHealth | None:
        ingest = self.ingest
        return ingest.health() if ingest is not None else None

