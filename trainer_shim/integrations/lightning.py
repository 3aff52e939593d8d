"""PyTorch Lightning: a ``Callback``. Two lines::

    from trainer_shim.integrations.lightning import SidecarCallback
    trainer = L.Trainer(..., callbacks=[SidecarCallback()])

Per training batch it publishes ``trainer.global_step`` with ``step_ms`` (the previous batch's
end to this batch's end, so its data wait included), ``data_wait_ms`` (the time inside the
loop's fetch of the next batch, between a batch's end and the next batch's start; see below),
``forward_ms``
(batch start to ``on_before_backward``: the training step), ``backward_ms``
(``on_before_backward`` to ``on_after_backward``) and ``optimizer_step_ms`` (``on_after_backward``
to batch end: the optimizer step, with gradient clipping if any), and counts ``batches``. The
loss goes through ``telemetry.scalar`` (a CUDA loss is copied asynchronously, never read), the
learning rate is the first optimizer's first group's ``lr`` (a Python float). The W&B run, when
the trainer has one, is announced at train start. Each checkpoint is timed as ``checkpoint_ms``:
Lightning's save hook for callbacks, ``on_save_checkpoint``, runs before the checkpoint is written
and nothing tells a callback when the write is done, so from ``setup`` to ``teardown`` the callback
times that trainer's ``save_checkpoint`` itself (through which ``ModelCheckpoint`` and manual saves
go: gathering the state, writing it, the ranks' barrier). Names: ``trainer_shim.integrations.names``.

What the data wait can see: between two batches the loop runs the other callbacks' batch-end
hooks, validation and checkpoints when due, its own bookkeeping, and fetches the next batch.
The fetch is timed through the training epoch loop's fetch hooks (the ones Lightning's profiler
gets, ``_on_before_fetch``/``_on_after_fetch``, wrapped at train start and always passed
through), so the rest of the gap lies in ``step_ms`` and in no phase: host time between the
hooks. A Lightning without those hooks leaves the data wait as the whole gap.
"""

from __future__ import annotations

import contextlib
from time import perf_counter_ns
from typing import Any

from lightning.pytorch import Callback

from trainer_shim.integrations import names
from trainer_shim.integrations._steps import CallbackCore, StepClock


class SidecarCallback(CallbackCore, Callback):  # type: ignore[misc]
    """Publishes Lightning's step-time breakdown, loss and learning rate to the sidecar
    (``channel``, ``wandb_open_metrics``: as ``CallbackCore``)."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if not isinstance(trainer.__dict__.get("save_checkpoint"), _TimedSave):
            trainer.save_checkpoint = _TimedSave(trainer.save_checkpoint, self._tm)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if isinstance(trainer.__dict__.get("save_checkpoint"), _TimedSave):
            del trainer.save_checkpoint  # the class's method again

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        _time_fetches(trainer, self._clock)
        self._train_begins()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._clock.step_begin()

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self._clock.mark("backward")
        self._clock.span(names.FORWARD_MS, "begin", "backward")
        self._clock.scalar(names.LOSS, loss)

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        # One mark serves both: the optimizer step follows the backward at once (a separate
        # on_before_optimizer_step hook would cost another cold-cache call per step).
        self._clock.mark("optimizer")
        self._clock.span(names.BACKWARD_MS, "backward", "optimizer")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._clock.span(names.OPTIMIZER_STEP_MS, "optimizer")
        optimizers = getattr(trainer, "optimizers", None) or []
        if optimizers:
            self._clock.gauge(names.LR, optimizers[0].param_groups[0].get("lr"))
        self._clock.step_end(trainer.global_step)


def _time_fetches(trainer: Any, clock: StepClock) -> None:
    """Wrap the training epoch loop's fetch hooks (each epoch hands them to its data fetcher) so
    that ``clock`` sees every batch fetch. Does nothing where the loop has no such hooks, or
    already has ours; the wrappers call the originals whatever the clock does."""
    loop: Any = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    before, after = getattr(loop, "_on_before_fetch", None), getattr(loop, "_on_after_fetch", None)
    if not callable(before) or not callable(after) or getattr(before, "_sidecar_clock", None) is clock:
        return

    def on_before_fetch() -> None:
        with contextlib.suppress(Exception):  # never into the trainer
            clock.fetch_begin()
        before()

    def on_after_fetch() -> None:
        after()
        with contextlib.suppress(Exception):
            clock.fetch_end()

    on_before_fetch._sidecar_clock = clock  # type: ignore[attr-defined]
    loop._on_before_fetch = on_before_fetch
    loop._on_after_fetch = on_after_fetch


class _TimedSave:
    """``trainer.save_checkpoint`` that also publishes how long it took as ``checkpoint_ms`` (a
    failed save too: the time was spent; the trainer's exception goes on to the trainer)."""

    def __init__(self, save: Any, tm: Any) -> None:
        self._save = save
        self._tm = tm

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t0 = perf_counter_ns()
        try:
            return self._save(*args, **kwargs)
        finally:
            self._tm.timing(names.CHECKPOINT_MS, (perf_counter_ns() - t0) / 1e6)
