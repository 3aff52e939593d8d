"""Two more trainers for ``dflash-sidecar demo``, publishing the way real ones already do.

- ``--style seed``: the DFlash pipeline of ``sidecar.cli.demo``, but instrumented like the reference
  trainer: workers only accumulate their phase times, and one monitor thread publishes a single
  profile dict of per-batch means every ``--profile-interval`` (``target.model_forward_ms``,
  ``target.pack_hidden_ms``, ``target.queue_put_ms``, ``target.data_wait_ms``,
  ``drafter.queue_get_ms``, ``drafter.forward_ms``, ``drafter.backward_ms``,
  ``drafter.optimizer_step_ms``) through ``telemetry.publish(step, profile)``.
- ``--style generic``: a plain training loop (one role, ``trainer``, one thread per rank) with a
  generic loop's names: ``data_time_ms``, ``forward_ms``, ``backward_ms``, ``optimizer_step_ms``,
  ``allreduce_ms``, ``step_ms``, counters ``batches`` and ``tokens``. The ranks meet at each
  step's all-reduce (a barrier, then the transfer), as data-parallel ranks do: a slow rank makes
  the others wait for it there. ``--form occurrence``
  sends every phase through ``timing()``; ``--form snapshot`` publishes per-batch means once per
  ``--profile-interval``.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Self


@dataclass(frozen=True)
class Timings:
    """Phase times of a simulated trainer (the fields of a subclass), and what makes each of its
    ``--bottleneck`` words the limiting part."""

    BOTTLENECKS: ClassVar[dict[str, dict[str, float]]] = {}
    """``--bottleneck`` word -> the fields that differ from the defaults, in the order ``--help``
    and the errors name the words."""

    @classmethod
    def for_bottleneck(cls, kind: str) -> Self:
        """The phase times that make ``kind`` (a key of ``BOTTLENECKS``) the limiting part."""
        return replace(cls(), **cls.BOTTLENECKS[kind])


@dataclass(frozen=True)
class LoopTimings(Timings):
    """Milliseconds per step of a plain loop; ``untimed_ms`` is host work no phase covers."""

    data_ms: float = 3.0
    forward_ms: float = 14.0
    backward_ms: float = 24.0
    optimizer_ms: float = 5.0
    comm_ms: float = 3.0
    untimed_ms: float = 1.0
    straggler_factor: float = 1.0

    BOTTLENECKS: ClassVar[dict[str, dict[str, float]]] = {
        "none": {},
        "input": {"data_ms": 60.0},
        "host": {"untimed_ms": 45.0},
        "comm": {"comm_ms": 50.0},
        "straggler": {"straggler_factor": 2.5},
    }


GENERIC_BOTTLENECKS = tuple(LoopTimings.BOTTLENECKS)
JOIN_S = 10.0
"""At the demo's end, how long each simulated thread may take to finish its step (seconds): a
thread mid-step when the stop comes (its sleeps end at once) takes milliseconds, more on a
loaded box; with the 1 s of earlier versions, a step published after the final flush was lost
(the demo's summary reported "8 dropped")."""
"""``none`` is a balanced loop (compute-bound when its GPU reads busy, throttled when it throttles)."""


class _Stopper:
    def __init__(self, seed: int) -> None:
        self.stop = threading.Event()
        self.rng = random.Random(seed)
        self.threads: list[threading.Thread] = []

    def sleep_ms(self, ms: float) -> float:
        start = time.perf_counter()
        self.stop.wait(ms * self.rng.uniform(0.9, 1.1) / 1000.0)
        return (time.perf_counter() - start) * 1000.0

    def start_threads(self) -> None:
        for th in self.threads:
            th.start()

    def join(self) -> None:
        """Stop the threads and wait for each to finish its step (at most ``JOIN_S`` each): a step
        published after the senders' final flush would be lost at their close."""
        self.stop.set()
        for th in self.threads:
            th.join(timeout=JOIN_S)


class GenericLoop(_Stopper):
    """``ranks`` threads, each a data-parallel rank of a plain loop (role ``trainer``)."""

    def __init__(self, timings: LoopTimings, ranks: int, endpoint: str, form: str, profile_interval_s: float,
                 seed: int = 0, run_label: str | None = None) -> None:
        """``run_label``: the run the loop's senders belong to (``telemetry.configure``)."""
        from trainer_shim import telemetry

        super().__init__(seed)
        self.t = timings
        self.form = form
        self.profile_interval_s = profile_interval_s
        self.default = telemetry.configure(endpoint=endpoint, role="trainer", worker="0", flush_interval_s=0.1,
                                           run_label=run_label)
        """Rank 0's channel (a second channel for the same worker would be a second sender)."""
        self.telemetry = telemetry
        self.threads = [threading.Thread(target=self._rank, args=(i,), name=f"rank-{i}", daemon=True)
                        for i in range(ranks)]
        self.allreduce = threading.Barrier(ranks)
        self.steps = 0
        """Steps so far (rank 0's: the ranks step together)."""

    def join(self) -> None:
        self.allreduce.abort()  # a rank waiting for its peers stops waiting
        super().join()

    def _all_reduce(self) -> float:
        """Wait for every rank, then the transfer (``comm_ms``); ms in all."""
        start = time.perf_counter()
        try:
            self.allreduce.wait()
        except threading.BrokenBarrierError:  # join() aborted it: the loop is stopping
            return (time.perf_counter() - start) * 1000.0
        self.sleep_ms(self.t.comm_ms)
        return (time.perf_counter() - start) * 1000.0

    def _rank(self, rank: int) -> None:
        ch = self.default if rank == 0 else self.telemetry.channel(role="trainer", worker=str(rank))
        t = self.t
        slow = t.straggler_factor if rank == ranks_slowest(len(self.threads)) else 1.0
        sums: dict[str, float] = defaultdict(float)
        n = step = 0
        last = time.monotonic()
        while not self.stop.is_set():
            start = time.perf_counter()
            phases = {"data_time_ms": self.sleep_ms(t.data_ms), "forward_ms": self.sleep_ms(t.forward_ms * slow),
                      "backward_ms": self.sleep_ms(t.backward_ms * slow), "allreduce_ms": self._all_reduce(),
                      "optimizer_step_ms": self.sleep_ms(t.optimizer_ms * slow)}
            self.sleep_ms(t.untimed_ms)
            phases["step_ms"] = (time.perf_counter() - start) * 1000.0
            step += 1
            if rank == 0:
                self.steps = step
            if self.form == "occurrence":
                for name, ms in phases.items():
                    ch.timing(name, ms)
                ch.count("batches")
                ch.count("tokens", 4096)
                continue
            for name, ms in phases.items():
                sums[name] += ms
            n += 1
            if time.monotonic() - last >= self.profile_interval_s:
                ch.publish(step, {name: total / n for name, total in sums.items()})
                sums.clear()
                n = 0
                last = time.monotonic()


def ranks_slowest(ranks: int) -> int:
    """The rank a ``straggler`` loop slows down (the last one)."""
    return ranks - 1


class SeedStyleMonitor:
    """Wraps a ``sidecar.cli.demo.SimulatedPipeline`` whose workers publish nothing themselves: they
    add to ``record`` and the monitor thread publishes the per-batch means as one dict."""

    def __init__(self, telemetry: Any, profile_interval_s: float) -> None:
        self.telemetry = telemetry
        self.profile_interval_s = profile_interval_s
        self._lock = threading.Lock()
        self._sums: dict[str, float] = defaultdict(float)
        self._counts: dict[str, int] = defaultdict(int)
        self.steps = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="profile-monitor", daemon=True)

    def record(self, key: str, ms: float) -> None:
        with self._lock:
            self._sums[key] += ms
            self._counts[key] += 1
            if key == "drafter.optimizer_step_ms":
                self.steps += 1

    def _run(self) -> None:
        while not self.stop.wait(self.profile_interval_s):
            with self._lock:
                profile = {k: self._sums[k] / self._counts[k] for k in self._sums if self._counts[k]}
                self._sums.clear()
                self._counts.clear()
                step = self.steps
            if profile:
                self.telemetry.publish(step, profile)

    def start(self) -> None:
        self.thread.start()

    def shutdown(self) -> None:
        self.stop.set()
        self.thread.join(timeout=2.0)
