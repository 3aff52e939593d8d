"""``dflash-sidecar demo``: the daemon plus a simulated DFlash pipeline, no GPU needed.

Target workers (threads) load a batch, run a "forward pass" and pack hidden states into a bounded
queue; drafter workers take batches from it and run forward/backward/optimizer. Every worker
publishes through the real shim over the real socket, with the metric names the pipeline insight
reads (docs/METRICS.md). ``--bottleneck`` makes one part slow so the effect can be seen:

- ``none``: balanced; ``target``: slow target forward; ``drafter``: slow drafter step;
- ``queue``: slow hidden-state packing/transfer with a tiny queue; ``host``: slow data loading;
- ``straggler``: one drafter worker twice as slow as the others.
"""

from __future__ import annotations

import argparse
import logging
import queue
import random
import threading
import time
from dataclasses import dataclass

from sidecar.config import Config

log = logging.getLogger("sidecar")

PREFETCH = 2
"""Batches a drafter would prefetch (the demo reports the queue's head as its prefetch buffer)."""
BOTTLENECKS = ("none", "target", "drafter", "queue", "host", "straggler")


@dataclass(frozen=True)
class PipelineTimings:
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

    @classmethod
    def for_bottleneck(cls, kind: str) -> PipelineTimings:
        """Phase times that make ``kind`` the limiting part. ``none``: the targets (3 workers x
        74 ms per batch) are about 1 % ahead of the drafters (2 x 50 ms), a tuned run: the queue
        stays full and neither side waits for long."""
        return {
            "none": cls(),
            "target": cls(target_forward_ms=160.0),
            "drafter": cls(drafter_forward_ms=40.0, drafter_backward_ms=80.0, optimizer_ms=16.0),
            "queue": cls(pack_ms=90.0, queue_capacity=1),
            "host": cls(data_ms=120.0),
            "straggler": cls(straggler_factor=2.5),
        }[kind]


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
    parser.add_argument("--bottleneck", choices=BOTTLENECKS, default="none",
                        help="make one part of the simulated pipeline the bottleneck")
    parser.add_argument("--duration", type=positive_seconds, default=None,
                        help="seconds to run, > 0 (default: until Ctrl-C or SIGTERM)")
    parser.add_argument("--targets", type=_workers, default=3, help="simulated target workers (1-64)")
    parser.add_argument("--drafters", type=_workers, default=2, help="simulated drafter workers (1-64)")


class SimulatedPipeline:
    """Target and drafter worker threads joined by a bounded hidden-state queue."""

    def __init__(self, timings: PipelineTimings, targets: int, drafters: int, endpoint: str, seed: int = 0) -> None:
        from trainer_shim import telemetry

        self.t = timings
        self.targets = targets
        self.drafters = drafters
        self.queue: queue.Queue[tuple[int, int, int]] = queue.Queue(maxsize=timings.queue_capacity)
        self.stop = threading.Event()
        self.rng = random.Random(seed)
        telemetry.configure(endpoint=endpoint, role="demo", worker="main", flush_interval_s=0.1)
        self.telemetry = telemetry
        self.threads: list[threading.Thread] = []
        self.step = 0
        self._step_lock = threading.Lock()

    def _sleep_ms(self, ms: float) -> float:
        """Sleep about ``ms`` (±10 % jitter); returns the time actually slept (ms)."""
        start = time.perf_counter()
        self.stop.wait(ms * self.rng.uniform(0.9, 1.1) / 1000.0)
        return (time.perf_counter() - start) * 1000.0

    def _target(self, index: int) -> None:
        ch = self.telemetry.channel(role="target", worker=str(index))
        t = self.t
        while not self.stop.is_set():
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
            ch.timing("queue_put_wait_ms", (time.perf_counter() - start) * 1000.0)
            ch.count("batches")
            ch.count("tokens", tokens)
            ch.gauge("queue_depth", self.queue.qsize())
            ch.gauge("queue_capacity", t.queue_capacity)

    def _drafter(self, index: int) -> None:
        ch = self.telemetry.channel(role="drafter", worker=str(index))
        t = self.t
        slow = t.straggler_factor if index == 0 else 1.0
        while not self.stop.is_set():
            start = time.perf_counter()
            try:
                tokens, loss_tokens, bucket = self.queue.get(timeout=0.05)
            except queue.Empty:
                ch.timing("queue_wait_ms", (time.perf_counter() - start) * 1000.0)
                continue
            wait = (time.perf_counter() - start) * 1000.0
            fwd = self._sleep_ms(t.drafter_forward_ms * slow)
            bwd = self._sleep_ms(t.drafter_backward_ms * slow)
            opt = self._sleep_ms(t.optimizer_ms * slow)
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

    def start(self) -> None:
        for i in range(self.targets):
            self.threads.append(threading.Thread(target=self._target, args=(i,), name=f"target-{i}", daemon=True))
        for i in range(self.drafters):
            self.threads.append(threading.Thread(target=self._drafter, args=(i,), name=f"drafter-{i}", daemon=True))
        for th in self.threads:
            th.start()

    def shutdown(self) -> None:
        self.stop.set()
        for th in self.threads:
            th.join(timeout=1.0)
        self.telemetry.flush()


def run_demo(cfg: Config, ns: argparse.Namespace) -> int:
    """Run the daemon and the simulated pipeline until ``--duration`` passes or SIGTERM/Ctrl-C."""
    from sidecar.daemon import Daemon
    from sidecar.sources.receiver import EndpointError

    daemon = Daemon(cfg)
    try:
        daemon.start()
    except (EndpointError, OSError) as exc:
        log.error("dflash-sidecar demo: %s", exc)
        return 1
    pipeline = SimulatedPipeline(PipelineTimings.for_bottleneck(ns.bottleneck), ns.targets, ns.drafters,
                                 cfg.endpoint[0])
    pipeline.start()
    log.info("demo: simulated pipeline with %d target and %d drafter workers, bottleneck=%s; "
             "metrics on http://%s/metrics", ns.targets, ns.drafters, ns.bottleneck, cfg.prometheus_addr)
    if ns.duration is not None:
        timer = threading.Timer(ns.duration, daemon.stop, [f"demo ran its --duration of {ns.duration:g} s"])
        timer.daemon = True  # SIGTERM before the duration ends must not wait for it
        timer.start()
    try:
        return daemon.run()
    finally:
        pipeline.shutdown()
        daemon.shutdown()
