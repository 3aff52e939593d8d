"""The names the integrations publish: a generic training loop's vocabulary, which the daemon's
generic-loop preset maps with no user configuration. Timings are milliseconds of host wall time;
each is one sample per optimizer step (``data_wait_ms``: per batch for the loader wrapper)."""

DATA_WAIT_MS = "data_wait_ms"
"""Waiting for the next batch: the gap between a step's end (Hugging Face: or the later log,
evaluate or save hook that ran) and the next step's begin (callbacks), or the exact time spent in
the loader's ``next()`` (loader wrapper)."""
FORWARD_BACKWARD_MS = "forward_backward_ms"
"""Forward and backward of one optimizer step as one phase (Hugging Face: ``on_step_begin`` to
``on_pre_optimizer_step``, gradient clipping and every accumulation micro-batch included). Host
wall time: on a GPU the host returns once the kernels are queued, so this is launch time plus
whatever the host waited on (a sync, a full launch queue), not the kernels' own time."""
FORWARD_MS = "forward_ms"
"""The training step's forward pass and loss, up to the start of backward (Lightning)."""
BACKWARD_MS = "backward_ms"
"""The backward pass (Lightning)."""
OPTIMIZER_STEP_MS = "optimizer_step_ms"
"""The optimizer step (``optimizer.step()``; host time, for GPU work launch time)."""
STEP_MS = "step_ms"
"""A whole training step, its data wait included: from the previous step's end hook (the first
step: its begin hook) to its own end hook. Every other timing of the callbacks lies inside it, so
the part of it they leave uncovered is host time between the hooks."""
CHECKPOINT_MS = "checkpoint_ms"
"""Saving a checkpoint (Hugging Face: from the Trainer's last hook before the save to ``on_save``;
Lightning: the whole ``trainer.save_checkpoint``). The run ledger tells it as ``checkpoint``."""
COMM_WAIT_MS = "comm_wait_ms"
"""Waiting on collectives (reserved for trainers that measure it; no integration does)."""
BATCHES = "batches"
"""Counter: batches (callbacks: optimizer steps) completed."""
TOKENS = "tokens"
"""Counter: input tokens consumed, when the framework or the caller knows them."""
LOSS = "loss"
"""Gauge: the training loss."""
LR = "lr"
"""Gauge: the learning rate of the first parameter group."""
