"""The step clock shared by the framework callbacks: hook timestamps in, one profile per step out."""

from __future__ import annotations

import sys
from time import perf_counter_ns
from typing import Any

from trainer_shim import telemetry
from trainer_shim.integrations import names, wandb_metrics


class StepClock:
    """Turns a framework's hook calls into one ``publish(step, profile)`` per step. Hooks that a
    framework does not call leave their timing out of the profile. All times: host monotonic
    clock, published in milliseconds."""

    def __init__(self, channel: Any = None) -> None:
        """``channel``: a ``telemetry.channel(...)``; default: the process's default channel."""
        self._tm = channel if channel is not None else telemetry
        self._last_end: int | None = None
        self._wait_from: int | None = None
        """Where the next data wait starts: the step's end, or a later ``after_step`` hook."""
        self._begin: int | None = None
        self._fetch_ns: int | None = None
        """Time inside the framework's batch fetch since the last step's end (``fetch_begin`` /
        ``fetch_end``); None when no fetch was seen, and the data wait is the gap."""
        self._fetch_start: int | None = None
        self._marks: dict[str, int] = {}
        self._profile: dict[str, float] = {}

    def step_begin(self) -> None:
        now = perf_counter_ns()
        self._profile = {}
        self._marks = {"begin": now}
        if self._wait_from is not None:
            wait = self._fetch_ns if self._fetch_ns is not None else now - self._wait_from
            self._profile[names.DATA_WAIT_MS] = wait / 1e6
        self._fetch_ns = self._fetch_start = None
        self._begin = now

    def fetch_begin(self) -> None:
        """The framework starts fetching a batch (Lightning's data fetcher). Once a fetch is
        seen between two steps, the data wait is the time inside fetches, and the rest of the gap
        between the steps (other callbacks, validation, checkpoints, the loop's bookkeeping) is
        host time between the hooks."""
        self._fetch_start = perf_counter_ns()

    def fetch_end(self) -> None:
        """The fetch ``fetch_begin`` announced returned (or raised)."""
        if self._fetch_start is not None:
            self._fetch_ns = (self._fetch_ns or 0) + perf_counter_ns() - self._fetch_start
            self._fetch_start = None

    def after_step(self) -> None:
        """A hook the framework calls after a step's end and before it fetches the next batch
        (Hugging Face: ``on_log``, ``on_evaluate``, ``on_save``, each called once its work is
        done): the next data wait starts here, not at the step's end. The logging, evaluation or
        checkpoint before it stays in the next ``step_ms`` and in no phase: host time between
        the hooks, not data wait. Outside the gap between two steps it does nothing."""
        if self._begin is None and self._wait_from is not None:
            self._wait_from = perf_counter_ns()

    def mark(self, what: str) -> None:
        """Remember when ``what`` happened (``begin`` is the step's begin)."""
        self._marks[what] = perf_counter_ns()

    def span(self, name: str, start: str, end: str | None = None) -> None:
        """Record the time from mark ``start`` to mark ``end`` (default: now) as ``name``."""
        t0 = self._marks.get(start)
        if t0 is not None:
            t1 = self._marks.get(end, 0) if end is not None else perf_counter_ns()
            if t1 >= t0:
                self._profile[name] = (t1 - t0) / 1e6

    def step_end(self, step: int, tokens: int | None = None) -> None:
        """Publish the step's profile under ``step`` (the framework's global step). Its
        ``step_ms`` runs from the previous step's end (the first step: its begin), so the data
        wait lies inside it like every other phase."""
        now = perf_counter_ns()
        if self._begin is not None:
            start = self._last_end if self._last_end is not None else self._begin
            self._profile[names.STEP_MS] = (now - start) / 1e6
        self._tm.publish(int(step), self._profile)
        self._tm.count(names.BATCHES)
        if tokens:
            self._tm.count(names.TOKENS, tokens)
        self._last_end = self._wait_from = now
        self._begin = None
        self._fetch_ns = self._fetch_start = None  # a fetch inside the step is not a wait between steps

    def gauge(self, name: str, value: Any) -> None:
        """A gauge from a value the framework already holds as a Python number (never a tensor
        read: that could synchronize)."""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            self._tm.gauge(name, value)

    def scalar(self, name: str, value: Any) -> None:
        """A tensor (or number) published without synchronizing: a CUDA tensor through
        ``telemetry.scalar`` (an asynchronous copy), a CPU tensor as a gauge whose value the
        flusher thread reads (``.item()`` here would cost the training thread microseconds)."""
        detach = getattr(value, "detach", None)
        if detach is None:
            self.gauge(name, value)
        elif getattr(value, "is_cuda", False):
            self._tm.scalar(name, detach())
        else:
            try:
                self._tm.gauge(name, detach())
            except TypeError:  # a strict channel takes only numbers as gauges: a tensor is scalar()'s
                self._tm.scalar(name, detach())


def announce_wandb_run(run_id: str | None = None) -> None:
    """Announce the trainer's W&B run now rather than within 5 s (only if wandb is imported or
    an id is given)."""
    if run_id or "wandb" in sys.modules:
        telemetry.announce_wandb_run(run_id)


class CallbackCore:
    """What each framework callback holds: its step clock, the channel it publishes on and its
    ``wandb_open_metrics`` choice. Mixed in before the framework's callback class."""

    def __init__(self, channel: Any = None, wandb_open_metrics: bool | str = False) -> None:
        """``channel``: a ``telemetry.channel(...)`` to publish on; default: the process's
        default channel. ``wandb_open_metrics``: off by default; see ``wandb_metrics.opt_in``."""
        self._open_metrics = wandb_metrics.opt_in(wandb_open_metrics)
        self._clock = StepClock(channel)
        self._tm = channel if channel is not None else telemetry

    def _train_begins(self) -> None:
        """At train start: announce the W&B run, and describe it to the open-metrics endpoint
        where opted in."""
        announce_wandb_run()
        if self._open_metrics:
            wandb_metrics.describe_run(addr=self._open_metrics)
