"""The trainer's two-line integration::

    from trainer_shim import telemetry
    telemetry.publish(step, profile)

Module-level calls go to the process's default channel, created on first use from the
environment: endpoint ``DFLASH_SIDECAR_ENDPOINT`` (see ``trainer_shim.endpoint``), role
``DFLASH_ROLE`` (default ``trainer``), worker ``RANK``/``LOCAL_RANK`` or the thread name, strict
mode ``DFLASH_TELEMETRY_STRICT``. ``configure()`` overrides them; worker threads that should be
told apart take their own ``channel(role, worker)``.

The module's functions are plain functions that never change (``torch.compile`` guards on
their identity and defers a call of them to the end of the graph, see
``trainer_shim.compile_support``). Each
appends to the default channel's queue, held in module globals; until the default channel exists
the queue's capacity is 0, so the first call takes the slow path, which creates the channel. In
strict mode the capacity stays 0 and every call goes through the strict channel's checks.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from time import perf_counter
from typing import Any

from trainer_shim import capture, compile_support
from trainer_shim.channel import (
    _CATEGORY,
    _COUNT,
    _GAUGE,
    _SCALAR,
    _STEP_KEY,
    _TIMING,
    Channel,
    ChannelStats,
    Record,
    Timer,
    gpu_scalars,
    strict_from_env,
)
from trainer_shim.endpoint import ENDPOINT_ENV, shim_endpoint
from trainer_shim.publisher import Publisher, env_worker
from trainer_shim.run_label import FLOPS_ENV, RUN_LABEL_ENV

__all__ = [
    "announce_wandb_run",
    "category",
    "channel",
    "close",
    "configure",
    "count",
    "flush",
    "gauge",
    "on_close",
    "publish",
    "scalar",
    "stats",
    "timer",
    "timing",
]

ROLE_ENV = "DFLASH_ROLE"
log = logging.getLogger("trainer_shim")
_lock = threading.Lock()
_publisher: Publisher | None = None
_default: Channel | None = None
_defaults: dict[str, Any] = {}
_close_hooks: list[Callable[[], None]] = []
# The default channel's queues and the capacity the fast path may use (0: take the slow path).
_q: collections.deque[Record] = collections.deque()
_pq: collections.deque[dict[str, float]] = collections.deque()
_cap = 0


def configure(
    endpoint: str | None = None,
    role: str | None = None,
    worker: str | None = None,
    *,
    devices: list[int] | None = None,
    flush_interval_s: float = 0.1,
    max_pending: int = 100_000,
    strict: bool | None = None,
    allocator_interval_s: float = 5.0,
    wandb_run_id: str | None = None,
    run_label: str | None = None,
    flops_per_token: float | None = None,
) -> Channel:
    """(Re)create the process's publisher and default channel; returns the default channel.
    Unset arguments come from the environment. A given ``endpoint``, ``role``, ``run_label`` and
    ``flops_per_token`` are also written to the environment (``DFLASH_SIDECAR_ENDPOINT``,
    ``DFLASH_ROLE``, ``DFLASH_RUN_LABEL``, ``DFLASH_FLOPS_PER_TOKEN``), so children started
    afterwards by any start method (spawn and forkserver too) publish to the same daemon, in the
    same run, each under a worker label of its own. ``run_label`` names the run where the trainer
    has no W&B run (default: from the launcher, ``trainer_shim.run_label``); ``flops_per_token``:
    the model FLOPs per trained token, for the run ledger's MFU. Raises ``ValueError`` for
    impossible settings (this runs once at set-up, where failing loudly is right)."""
    with _lock:
        old, ch = _configure_locked(endpoint, role, worker, devices, flush_interval_s, max_pending,
                                    strict, allocator_interval_s, wandb_run_id, run_label, flops_per_token)
    if old is not None:
        old.close()
    return ch


def _configure_locked(
    endpoint: str | None,
    role: str | None,
    worker: str | None,
    devices: list[int] | None,
    flush_interval_s: float,
    max_pending: int,
    strict: bool | None,
    allocator_interval_s: float,
    wandb_run_id: str | None,
    run_label: str | None = None,
    flops_per_token: float | None = None,
) -> tuple[Publisher | None, Channel]:
    global _publisher, _default
    publisher = Publisher(
        endpoint or shim_endpoint(),
        flush_interval_s=flush_interval_s,
        max_pending=max_pending,
        strict=strict_from_env() if strict is None else strict,
        allocator_interval_s=allocator_interval_s,
        wandb_run_id=wandb_run_id,
        run_label=run_label,
        flops_per_token=flops_per_token,
    )
    _export_to_children(endpoint, role)
    if publisher.run_label and run_label is not None:
        os.environ[RUN_LABEL_ENV] = publisher.run_label
    if publisher.flops_per_token and flops_per_token is not None:
        os.environ[FLOPS_ENV] = repr(publisher.flops_per_token)
    old, _publisher = _publisher, publisher
    _defaults.update(role=role, worker=worker, devices=devices)
    _default = publisher.channel(*_identity(role, worker), devices=devices or _env_devices(),
                                 default_worker=_is_default_worker(worker))
    _bind(_default)
    _prepare_gpu_scalars()
    return old, _default


def _prepare_gpu_scalars() -> None:
    """Start the GPU scalar resolver's one-time set-up on its own thread now if CUDA is already
    initialised, so that the first ``scalar()`` costs what later ones do."""
    if "torch" in sys.modules:
        gpu_scalars().prepare()


def _export_to_children(endpoint: str | None, role: str | None) -> None:
    """Put what ``configure()`` was given into the environment, where every child inherits it:
    a spawned or forkserver child starts a fresh interpreter that knows nothing of this
    process's publisher (a forked one inherits it anyway), and its shim reads the endpoint and
    role from the environment. The worker label is not exported: each child has its own."""
    if endpoint:
        os.environ[ENDPOINT_ENV] = endpoint
    if role:
        os.environ[ROLE_ENV] = role


def channel(role: str | None = None, worker: str | None = None, devices: list[int] | None = None) -> Channel:
    """A channel of the default publisher for one worker (e.g. one per worker thread)."""
    _default_channel()
    assert _publisher is not None
    return _publisher.channel(*_identity(role, worker), devices=devices or _env_devices(),
                              default_worker=_is_default_worker(worker))


def flush(wait_s: float = 0.0) -> bool:
    """Ask the flusher to send what is queued now. Returns at once, or with ``wait_s`` > 0 waits
    up to that many seconds for the flush to complete and returns whether it did."""
    if _publisher is not None:
        return _publisher.flush(wait_s)
    return False


def close() -> None:
    """Flush and close the default publisher (also done automatically at exit), after running
    the ``on_close`` callbacks (a tap on the default channel comes off)."""
    hooks, _close_hooks[:] = _close_hooks[:], []
    for hook in hooks:
        try:
            hook()
        except Exception as exc:  # noqa: BLE001 - closing goes on
            log.warning("trainer_shim: a close callback failed: %r", exc)
    if _publisher is not None:
        _publisher.close()


def on_close(callback: Callable[[], None]) -> None:
    """Call ``callback()`` once, at the next ``close()`` (not at ``configure()``, which keeps
    the default channel going)."""
    if callback not in _close_hooks:
        _close_hooks.append(callback)


def announce_wandb_run(run_id: str | None = None) -> None:
    """Say hello with the trainer's W&B run at the next flush (the shim otherwise notices a new
    ``wandb.run`` within 5 s). ``run_id`` is announced when ``wandb.run`` is not set."""
    _default_channel()
    if _publisher is not None:
        _publisher.refresh_wandb(run_id)


def stats() -> dict[tuple[str, str], ChannelStats]:
    """Per channel: records sent, drops by reason, records queued (see ``Publisher.stats``)."""
    return _publisher.stats() if _publisher is not None else {}


def _identity(role: str | None, worker: str | None) -> tuple[str, str]:
    role = role or _defaults.get("role") or os.environ.get(ROLE_ENV) or "trainer"
    worker = worker or _defaults.get("worker") or env_worker()
    return str(role), str(worker)


def _is_default_worker(worker: str | None) -> bool:
    return not (worker or _defaults.get("worker"))


def _env_devices() -> list[int]:
    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank is None or not local_rank.isdigit():
        return []
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip().isdigit()]
    index = int(local_rank)
    return [int(visible[index])] if index < len(visible) else [index]


def _default_channel() -> Channel:
    ch = _default
    if ch is None:
        with _lock:  # one default publisher even if several threads make the first call at once
            ch = _default
            if ch is None:
                _, ch = _configure_locked(None, None, None, None, 0.1, 100_000, None, 5.0, None)
    return ch


def _bind(ch: Channel) -> None:
    global _q, _pq, _cap
    _cap = 0  # while the globals change, calls take the slow path
    _q, _pq = ch._q, ch._pq
    _cap = 0 if _is_strict(ch) else ch._cap


def _is_strict(ch: Channel) -> bool:
    from trainer_shim.channel import StrictChannel

    return isinstance(ch, StrictChannel)


def _slow(kind: int, name: Any, value: Any) -> None:
    ch = _default_channel()
    if kind == _TIMING:
        ch.timing(name, value)
    elif kind == _COUNT:
        ch.count(name, value)
    elif kind == _GAUGE:
        ch.gauge(name, value)
    else:
        ch.category(name, value)


# The fast path appends to the default channel's queue; the slow path (first call, full queue,
# strict mode) goes through the channel itself, which creates it, counts overflow or validates.

def publish(step: int, profile: Mapping[str, float]) -> None:
    """Publish the trainer's profile dict for ``step`` (keys in a time unit, ``*_ms``, ``*_s``,
    ``*(s)``, are timings: docs/METRICS.md's units grammar)."""
    if len(_pq) < _cap:
        try:
            snapshot = {**profile}
        except Exception:  # noqa: BLE001 - not a mapping: counted by the channel
            _default_channel().publish(step, profile)
            return
        snapshot[_STEP_KEY] = step
        _pq.append(snapshot)
        _default.step = step  # type: ignore[union-attr]
        if capture.armed:  # the step boundary a capture on request waits for (trainer_shim.capture)
            capture.at_step(_default, step)
    else:
        _default_channel().publish(step, profile)


def timing(name: str, ms: float) -> None:
    """Record a duration in milliseconds."""
    if len(_q) < _cap:
        _q.append((_TIMING, name, ms))
    else:
        _slow(_TIMING, name, ms)


def count(name: str, n: float = 1) -> None:
    """Add ``n`` to a counter."""
    if len(_q) < _cap:
        _q.append((_COUNT, name, n))
    else:
        _slow(_COUNT, name, n)


def gauge(name: str, value: float) -> None:
    """Record a gauge value."""
    if len(_q) < _cap:
        _q.append((_GAUGE, name, value))
    else:
        _slow(_GAUGE, name, value)


def category(name: str, key: str | int) -> None:
    """Record one categorical sample."""
    if len(_q) < _cap:
        _q.append((_CATEGORY, name, key))
    else:
        _slow(_CATEGORY, name, key)


class _Timer(Timer):
    """What ``timer(name)`` returns: queued, when the block ends, in the default channel of that
    moment, like ``timing`` (a block open across ``configure()`` is recorded in the new channel)."""

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        start = self.value
        if start < 0.0:  # open (see channel.Timer)
            self.value = ms = (perf_counter() + start) * 1e3
            if len(_q) < _cap:
                _q.append(self)
            else:
                _slow(_TIMING, self.name, ms)
        else:
            _default_channel()._count_dropped("bad_argument")  # entered again


def timer(name: str) -> AbstractContextManager[None]:
    """Context manager timing its block (host wall time, from this call to the block's end) as a
    timing in ms, also when the block raises. Inside a ``torch.compile``d function it reads the
    clock when the graph runs (see ``trainer_shim.compile_support``)."""
    if not _cap:  # first call or strict mode: the channel's own timer (creates, validates)
        return _default_channel().timer(name)
    return _Timer(_TIMING, name, -perf_counter())


def scalar(name: str, tensor: Any) -> None:
    """Publish a GPU scalar without synchronizing (see ``trainer_shim.cuda_scalar``)."""
    _default_channel().scalar(name, tensor)


def _fresh_scalar(name: str, value: Any) -> None:
    """``scalar`` of a tensor that compiled code computed for this call alone (see
    ``compile_support.register``): queued as it is, read by the flusher."""
    if len(_q) < _cap:
        _q.append((_SCALAR, name, value))
    else:
        _default_channel().scalar(name, value)


compile_support.register({"publish": publish, "timing": timing, "count": count, "gauge": gauge,
                          "category": category, "timer": timer, "scalar": scalar},
                         fresh_scalar=_fresh_scalar)
