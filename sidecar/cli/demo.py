"""``dflash-sidecar demo``: the daemon plus a simulated DFlash pipeline, no GPU needed.

Target workers (threads) load a batch, run a "forward pass" and pack hidden states into a bounded
queue; drafter workers take batches from it and run forward/backward/optimizer. Every worker
publishes through the real shim over the real socket, with the metric names the pipeline insight
reads (docs/METRICS.md). ``--bottleneck`` makes one part slow so the effect can be seen:

- ``none``: balanced; ``target``: slow target forward; ``drafter``: slow drafter step;
- ``queue``: slow hidden-state packing/transfer with a tiny queue; ``input``: slow data loading
  (``input-bound``; until 0.3 this was ``host``, still accepted as an alias for one release);
- ``straggler``: one drafter worker 2.5 times as slow as the others.

Each word names the verdict it makes, the same word in both pipelines: ``input`` is always the
data loader, ``host`` (the plain loop only) host overhead between the timed phases.

``--style seed`` publishes the same pipeline as the reference trainer does (one profile dict from
a monitor thread); ``--style generic`` runs a plain single-role training loop instead
(``sidecar.cli.demo_loops``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import queue
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from sidecar.cli.demo_loops import GENERIC_BOTTLENECKS, JOIN_S, GenericLoop, LoopTimings, SeedStyleMonitor, Timings
from sidecar.cli.exit_status import FAILURE, USAGE
from sidecar.core.config import Config
from sidecar.model.ledger import RunLedgerView

log = logging.getLogger("sidecar")

PREFETCH = 2
"""Batches a drafter would prefetch (the demo reports the queue's head as its prefetch buffer)."""
RENAMED_BOTTLENECKS = {"host": "input"}
"""The DFlash pipeline's old ``--bottleneck`` words, kept as aliases for one release (until 0.4):
``host`` meant slow data loading, the verdict ``input-bound``."""


@dataclass(frozen=True)
class PipelineTimings(Timings):
    """Milliseconds per batch for each phase (scaled-down DFlash step times; long enough that
    thread wake-up latency on a loaded host stays small against them)."""

    data_ms: float = 8.0
    target_forward_ms: float = 60.0
    pack_ms: float = 6.0
    drafter_forward_ms: float = 16.0
    drafter_backward_ms: float = 26.0
    optimizer_ms: float = 8.0
    queue_capacity: int = 8
    straggler_factor: float = 1.0

    BOTTLENECKS: ClassVar[dict[str, dict[str, float]]] = {
        "none": {},
        "target": {"target_forward_ms": 160.0},
        "drafter": {"drafter_forward_ms": 40.0, "drafter_backward_ms": 80.0, "optimizer_ms": 16.0},
        "queue": {"pack_ms": 90.0, "queue_capacity": 1},
        "input": {"data_ms": 120.0},
        "straggler": {"straggler_factor": 2.5},
    }
    """``none``: the targets (3 workers x 74 ms per batch) are about 1 % ahead of the drafters
    (2 x 50 ms), a tuned run: the queue stays full and neither side waits for long."""


BOTTLENECKS = tuple(PipelineTimings.BOTTLENECKS)
"""The DFlash pipeline's ``--bottleneck`` words."""


def dflash_bottleneck(word: str) -> str | None:
    """The DFlash pipeline's bottleneck for ``--bottleneck word``: the word itself, the new
    word for an old alias (logging a warning that names it), or None for a word it does not take."""
    if word in RENAMED_BOTTLENECKS:
        new = RENAMED_BOTTLENECKS[word]
        log.warning("demo: --bottleneck %s is now --bottleneck %s for the DFlash pipeline (slow data loading, "
                    "verdict %s-bound); the old word goes in 0.4", word, new, new)
        return new
    return word if word in BOTTLENECKS else None


def positive_seconds(raw: str) -> float:
    """``--duration``: a finite number of seconds > 0. Raises ``argparse.ArgumentTypeError``."""
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, e.g. 30, not {raw!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, not {raw}")
    return value


def _workers(raw: str) -> int:
    """``--targets``/``--drafters``: 1 to 64 workers. Raises ``argparse.ArgumentTypeError``."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of workers, e.g. 2, not {raw!r}") from None
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"must be between 1 and 64, not {value}")
    return value


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bottleneck", choices=sorted(set(BOTTLENECKS) | set(GENERIC_BOTTLENECKS)), default="none",
                        help="make one part of the simulated pipeline the bottleneck, named as the verdict it "
                             "makes (DFlash: none, target, drafter, queue, input, straggler; generic loop: none, "
                             "input, host, comm, straggler). input is the data loader in both; the DFlash "
                             "pipeline takes host as an old alias of input until 0.4")
    parser.add_argument("--style", choices=("channels", "seed", "generic"), default="channels",
                        help="channels: per-worker channels (default); seed: one profile dict per interval from a "
                             "monitor thread, as the reference DFlash trainer; generic: a plain training loop")
    parser.add_argument("--form", choices=("occurrence", "snapshot"), default="occurrence",
                        help="generic loop: every timing() occurrence, or per-batch means once per interval")
    parser.add_argument("--profile-interval", type=positive_seconds, default=1.0,
                        help="seconds between profile snapshots (--style seed, --form snapshot)")
    parser.add_argument("--ranks", type=_workers, default=2, help="generic loop: ranks, one thread each (1-64)")
    parser.add_argument("--duration", type=positive_seconds, default=None,
                        help="seconds to run, > 0 (default: until Ctrl-C or SIGTERM; either way it ends with a "
                             "summary)")
    parser.add_argument("--targets", type=_workers, default=3, help="simulated target workers (1-64)")
    parser.add_argument("--drafters", type=_workers, default=2, help="simulated drafter workers (1-64)")


class SimulatedPipeline:
    """Target and drafter worker threads joined by a bounded hidden-state queue."""

    def __init__(self, timings: PipelineTimings, targets: int, drafters: int, endpoint: str, seed: int = 0,
                 monitor_interval_s: float | None = None, run_label: str | None = None) -> None:
        """``monitor_interval_s``: publish seed-style (workers only record, a monitor thread
        publishes per-batch means every that many seconds) instead of per-worker channels;
        ``run_label``: the run its senders belong to (``telemetry.configure``)."""
        from trainer_shim import telemetry

        self.t = timings
        self.targets = targets
        self.drafters = drafters
        self.queue: queue.Queue[tuple[int, int, int]] = queue.Queue(maxsize=timings.queue_capacity)
        self.stop = threading.Event()
        self.rng = random.Random(seed)
        # per-worker channels: the default channel is target 0's, so no sender stays silent (its
        # role would show in the run ledger with nothing in it); seed style publishes through it
        self.default = telemetry.configure(endpoint=endpoint, role="target" if monitor_interval_s is None else "demo",
                                           worker="0" if monitor_interval_s is None else "main", flush_interval_s=0.1,
                                           run_label=run_label)
        self.telemetry = telemetry
        self.threads: list[threading.Thread] = []
        self.step = 0
        self._step_lock = threading.Lock()
        self.monitor = SeedStyleMonitor(telemetry, monitor_interval_s) if monitor_interval_s else None

    def _sleep_ms(self, ms: float) -> float:
        """Sleep about ``ms`` (±10 % jitter); returns the time actually slept (ms)."""
        start = time.perf_counter()
        self.stop.wait(ms * self.rng.uniform(0.9, 1.1) / 1000.0)
        return (time.perf_counter() - start) * 1000.0

    def _target(self, index: int) -> None:
        ch: Any = None if self.monitor is not None else (
            self.default if index == 0 else self.telemetry.channel(role="target", worker=str(index)))
        t = self.t
        monitor = self.monitor
        while not self.stop.is_set():
            if monitor is not None:
                monitor.record("target.data_wait_ms", self._sleep_ms(t.data_ms))
                monitor.record("target.model_forward_ms", self._sleep_ms(t.target_forward_ms))
                monitor.record("target.pack_hidden_ms", self._sleep_ms(t.pack_ms))
            else:
                ch.timing("data_wait_ms", self._sleep_ms(t.data_ms))
                ch.timing("forward_ms", self._sleep_ms(t.target_forward_ms))
                ch.timing("pack_ms", self._sleep_ms(t.pack_ms))
            tokens = self.rng.choice((2048, 4096, 8192))
            start = time.perf_counter()
            while not self.stop.is_set():
                try:
                    item = (tokens, int(tokens * self.rng.uniform(0.3, 0.6)), self.rng.randrange(4))
                    self.queue.put(item, timeout=0.05)
                    break
                except queue.Full:
                    continue
            if monitor is not None:
                monitor.record("target.queue_put_ms", (time.perf_counter() - start) * 1000.0)
                continue
            ch.timing("queue_put_wait_ms", (time.perf_counter() - start) * 1000.0)
            ch.count("batches")
            ch.count("tokens", tokens)
            ch.gauge("queue_depth", self.queue.qsize())
            ch.gauge("queue_capacity", t.queue_capacity)

    def _drafter(self, index: int) -> None:
        ch: Any = self.telemetry.channel(role="drafter", worker=str(index)) if self.monitor is None else None
        t = self.t
        slow = t.straggler_factor if index == 0 else 1.0
        while not self.stop.is_set():
            start = time.perf_counter()
            item = None
            while item is None and not self.stop.is_set():
                try:
                    item = self.queue.get(timeout=0.05)
                except queue.Empty:
                    continue
            if item is None:
                break
            tokens, loss_tokens, bucket = item
            wait = (time.perf_counter() - start) * 1000.0
            fwd = self._sleep_ms(t.drafter_forward_ms * slow)
            bwd = self._sleep_ms(t.drafter_backward_ms * slow)
            opt = self._sleep_ms(t.optimizer_ms * slow)
            if self.monitor is not None:
                for key, ms in (("drafter.queue_get_ms", wait), ("drafter.forward_ms", fwd),
                                ("drafter.backward_ms", bwd), ("drafter.optimizer_step_ms", opt)):
                    self.monitor.record(key, ms)
                continue
            with self._step_lock:
                self.step += 1
                step = self.step
            ch.publish(step, {"queue_wait_ms": wait, "forward_ms": fwd, "backward_ms": bwd,
                              "optimizer_ms": opt, "batch_tokens": tokens,
                              "loss_token_fraction": loss_tokens / tokens})
            ch.count("batches")
            ch.count("tokens", tokens)
            ch.count("loss_tokens", loss_tokens)
            ch.category("bucket", bucket)
            ch.gauge("prefetch_depth", min(self.queue.qsize(), PREFETCH))
            ch.gauge("prefetch_capacity", PREFETCH)
            ch.scalar("loss", 2.0 / (1.0 + step / 500.0))

    @property
    def steps(self) -> int:
        """Drafter steps so far (every worker's)."""
        return self.monitor.steps if self.monitor is not None else self.step

    def start(self) -> None:
        for i in range(self.targets):
            self.threads.append(threading.Thread(target=self._target, args=(i,), name=f"target-{i}", daemon=True))
        for i in range(self.drafters):
            self.threads.append(threading.Thread(target=self._drafter, args=(i,), name=f"drafter-{i}", daemon=True))
        for th in self.threads:
            th.start()
        if self.monitor is not None:
            self.monitor.start()

    def shutdown(self) -> None:
        self.stop.set()
        if self.monitor is not None:
            self.monitor.shutdown()
        for th in self.threads:
            th.join(timeout=JOIN_S)
        self.telemetry.flush()


def demo_state_dir(configured: str | None) -> Path:
    """Where the demo keeps its run ledger: the state folder given (``--state-dir`` or the config
    file), else ``<the default state folder>/demo``, apart from real runs'."""
    from sidecar.core.ledger_state import state_dir

    return state_dir(configured) if configured else state_dir(None) / "demo"


def run_demo(cfg: Config, ns: argparse.Namespace) -> int:
    """Run the daemon and the simulated pipeline until ``--duration`` passes or SIGTERM/Ctrl-C,
    with a progress line meanwhile and a summary at the end (``sidecar.cli.demo_report``)."""
    from sidecar.cli.demo_report import Progress, summary
    from sidecar.core.daemon import Daemon
    from sidecar.sources.receiver import EndpointError

    folder = demo_state_dir(cfg.state_dir)
    daemon = Daemon(dataclasses.replace(cfg, state_dir=str(folder)))
    try:
        daemon.start()
    except (EndpointError, OSError) as exc:
        log.error("dflash-sidecar demo: %s", exc)
        return FAILURE
    began_unix_s = time.time()  # this demo's runs start after it: the folder may hold earlier demos'
    pipeline = _start_pipeline(cfg, ns)
    if pipeline is None:
        daemon.shutdown()
        return USAGE
    if ns.duration is not None:
        timer = threading.Timer(ns.duration, daemon.stop, [f"demo ran its --duration of {ns.duration:g} s"])
        timer.daemon = True  # SIGTERM before the duration ends must not wait for it
        timer.start()
    log.info("demo: runs %s; try, from another terminal: curl -s http://%s/metrics, dflash-sidecar top "
             "--prometheus-addr %s; the run ledger: dflash-sidecar report --state-dir %s",
             f"for {ns.duration:g} s" if ns.duration else "until Ctrl-C", cfg.prometheus_addr, cfg.prometheus_addr,
             folder)
    progress = Progress(daemon.scrape_state.report, lambda: pipeline.steps, cfg.interval, ns.duration)
    progress.start()

    def stop_senders() -> None:  # while the daemon still receives: their last records and final tallies reach it
        progress.stop()
        if isinstance(pipeline, GenericLoop):
            pipeline.join()
        else:
            pipeline.shutdown()
        pipeline.telemetry.close()

    try:
        status = daemon.run(before_shutdown=stop_senders)
    finally:
        progress.stop()
        daemon.shutdown()
    view = daemon.ledger.ledger.view()
    print(summary(view, folder, cfg.prometheus_addr, began_unix_s, daemon.scrape_state.report(),
                  _picture(view, folder, began_unix_s)), flush=True)
    return status


def demo_run_label(now_unix_s: float | None = None, pid: int | None = None) -> str:
    """The run a demo names for itself: ``demo-20261206T054616Z-4242`` (its start, UTC, and the
    demo's pid). Each demo is a run of its own, whatever the run gap: two demos a few seconds
    apart were one run of the host before (the second's summary told the first's time too)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now_unix_s is None else now_unix_s))
    return f"demo-{stamp}-{os.getpid() if pid is None else pid}"


def _picture(view: RunLedgerView, folder: Path, since_unix_s: float) -> Path | None:
    """Write the page of the demo's run (its most recent, heard since ``since_unix_s``) to
    ``<folder>/demo.html``; its path, None (logged) when there is no run or it cannot be written."""
    from sidecar.cli.report_html import write_page

    runs = [r.run for r in view.roles if r.last_unix_s >= since_unix_s]
    if not runs:
        return None
    path = folder / "demo.html"
    try:
        write_page(view, folder, runs[-1], path)
    except OSError as exc:
        log.error("demo: cannot write the run's picture %s: %s", path, exc)
        return None
    return path


def _start_pipeline(cfg: Config, ns: argparse.Namespace) -> SimulatedPipeline | GenericLoop | None:
    """The simulated trainer ``ns`` asks for, started, in a run of its own (``demo_run_label``);
    None (logged) for a bottleneck its style lacks."""
    label = demo_run_label()
    if ns.style == "generic":
        if ns.bottleneck not in GENERIC_BOTTLENECKS:
            log.error("demo: --style generic takes --bottleneck %s", ", ".join(GENERIC_BOTTLENECKS))
            return None
        loop = GenericLoop(LoopTimings.for_bottleneck(ns.bottleneck), ns.ranks, cfg.endpoint[0], ns.form,
                           ns.profile_interval, run_label=label)
        loop.start_threads()
        log.info("demo: plain training loop with %d ranks (%s form), bottleneck=%s; metrics on http://%s/metrics",
                 ns.ranks, ns.form, ns.bottleneck, cfg.prometheus_addr)
        return loop
    kind = dflash_bottleneck(ns.bottleneck)
    if kind is None:
        log.error("demo: the DFlash pipeline takes --bottleneck %s", ", ".join(BOTTLENECKS))
        return None
    pipeline = SimulatedPipeline(PipelineTimings.for_bottleneck(kind), ns.targets, ns.drafters, cfg.endpoint[0],
                                 monitor_interval_s=ns.profile_interval if ns.style == "seed" else None,
                                 run_label=label)
    pipeline.start()
    log.info("demo: simulated pipeline with %d target and %d drafter workers, bottleneck=%s, style=%s; "
             "metrics on http://%s/metrics", ns.targets, ns.drafters, kind, ns.style, cfg.prometheus_addr)
    return pipeline
