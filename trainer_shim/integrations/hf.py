"""Hugging Face Transformers: a ``TrainerCallback``. Two lines::

    from trainer_shim.integrations.hf import SidecarCallback
    trainer = Trainer(..., callbacks=[SidecarCallback()])

Per optimizer step it publishes the step (``state.global_step``) with ``step_ms`` (from the
previous step's end to this one's), ``data_wait_ms`` (from the last hook the Trainer calls
between two steps to the next step's begin: the fetch of the next batches; see below),
``forward_backward_ms`` (from
``on_step_begin`` to ``on_pre_optimizer_step``: every micro-batch's forward and backward, and
gradient clipping) and ``optimizer_step_ms`` (from ``on_pre_optimizer_step`` to
``on_optimizer_step``), and counts ``batches`` (and ``tokens`` when the Trainer counts input
tokens, ``include_num_input_tokens_seen``). Each checkpoint the Trainer saves is timed as
``checkpoint_ms``: from the last hook before the save (``on_step_end``, ``on_log``,
``on_evaluate`` or ``on_epoch_end``: the Trainer logs and evaluates, then saves) to ``on_save``,
which it calls once the checkpoint is written. ``loss`` and ``lr`` come from the Trainer's own logs,
which hold Python floats already: nothing here reads a tensor, so nothing synchronizes. When the
Trainer has a W&B run (its ``WandbCallback`` starts it at train begin), the run id is announced
at once. Names: ``trainer_shim.integrations.names``.

What the data wait can see: between ``on_step_end`` and the next ``on_step_begin`` the Trainer
logs, evaluates and saves when due, then fetches the next batches. ``on_log``, ``on_evaluate``
and ``on_save`` come after their work, so the data wait starts at the last of them that ran:
the logging, evaluation or checkpoint lies in ``step_ms`` and in no phase (host time between
the hooks). What no hook marks stays in it: the step-end and log hooks of callbacks listed
after this one (list ``SidecarCallback()`` last to keep them out).
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any

from transformers import TrainerCallback

from trainer_shim.integrations import names
from trainer_shim.integrations._steps import CallbackCore


class SidecarCallback(CallbackCore, TrainerCallback):  # type: ignore[misc]
    """Publishes the Trainer's step-time breakdown, loss and learning rate to the sidecar."""

    def __init__(self, channel: Any = None, wandb_open_metrics: bool | str = False) -> None:
        """As ``CallbackCore``."""
        super().__init__(channel, wandb_open_metrics)
        self._tokens_seen = 0
        self._last_hook_ns: int | None = None
        """When the last hook before a possible save returned (``perf_counter_ns``)."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._train_begins()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._clock.step_begin()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._clock.mark("optimizer")
        self._clock.span(names.FORWARD_BACKWARD_MS, "begin", "optimizer")

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._clock.span(names.OPTIMIZER_STEP_MS, "optimizer")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        seen = getattr(state, "num_input_tokens_seen", 0) or 0
        tokens, self._tokens_seen = int(seen) - self._tokens_seen, int(seen)
        self._clock.step_end(state.global_step, tokens if tokens > 0 else None)
        self._last_hook_ns = perf_counter_ns()

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._last_hook_ns = perf_counter_ns()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._clock.after_step()  # the next data wait starts after the evaluation
        self._last_hook_ns = perf_counter_ns()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._clock.after_step()  # the next data wait starts after the checkpoint
        if self._last_hook_ns is not None:
            self._tm.timing(names.CHECKPOINT_MS, (perf_counter_ns() - self._last_hook_ns) / 1e6)
        self._last_hook_ns = None

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        self._clock.after_step()
        logs = logs or {}
        if "loss" in logs:
            self._clock.gauge(names.LOSS, logs["loss"])
        if "learning_rate" in logs:
            self._clock.gauge(names.LR, logs["learning_rate"])
        self._last_hook_ns = perf_counter_ns()
