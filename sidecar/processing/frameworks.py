"""The training frameworks' own metric names, as built-in presets (no config needed).

Each row was read from the framework's sources at the version named: the keys it hands its
loggers (TensorBoard, W&B, its own JSON), matched like the other presets on the name without
its unit, after ``sidecar.model.names.metric_token`` (``time_metrics/data_loading(s)`` ->
``time_metrics_data_loading``) and case-insensitively. A row's ``unit`` is the one the framework
uses for a name that says none (mmengine's ``data_time`` is in seconds); a name that says its own
unit must agree with it (a percent of a phase excepted: that is the phase's share of the step).
A unit stated by a row applies to a ``publish()`` dict key and a ``gauge()``; a ``timing()`` record
whose name says no unit is in milliseconds, as its API says. docs/METRICS.md prints this table.
"""

from __future__ import annotations

from typing import NamedTuple


class FrameworkRow(NamedTuple):
    """One framework name group: who emits it, at which version, what it means, its unit."""

    preset: str
    version: str
    meaning: str
    unit: str
    """The unit the framework uses when the name says none (grammar spelling: ``s``, ``%``,
    ``MiB``, ``tflops``), ``""``: none stated."""
    names: tuple[str, ...]
    """As the framework spells them (docs); matched by their ``metric_token``, lower case."""


def _rows(preset: str, version: str, *rows: tuple[str, str, tuple[str, ...]]) -> tuple[FrameworkRow, ...]:
    """One framework's rows, each ``(meaning, unit, names)``, at the version read."""
    return tuple(FrameworkRow(preset, version, *row) for row in rows)


FRAMEWORKS: tuple[FrameworkRow, ...] = (
    # torchtitan: torchtitan/components/metrics.py, MetricsProcessor.log (per log_freq steps)
    *_rows("torchtitan", "git 00fbaaf",
           ("step", "s", ("time_metrics/end_to_end(s)",)),
           ("data_wait", "s", ("time_metrics/data_loading(s)", "time_metrics/data_loading(%)")),
           ("tokens_per_s", "tps", ("throughput(tps)",)),
           ("flops_per_s", "tflops", ("tflops",)),
           ("mfu", "%", ("mfu(%)",)),
           ("loss", "", ("loss_metrics/global_avg_loss",)),
           ("grad_norm", "", ("grad_norm",)),
           ("memory_reserved", "GiB", ("memory/max_reserved(GiB)",)),
    ),
    # Megatron-LM: megatron/training/training.py training_log -> timers.write(name + "-time"),
    # seconds per iteration (normalized by the iterations since the last log), and its scalars
    *_rows("megatron", "git 86df799",
           ("step", "s", ("iteration-time",)),
           ("data_wait", "s", ("batch-generator-time",)),
           ("forward_backward", "s", ("forward-backward-time",)),
           ("comm_wait", "s", ("grads-all-reduce-time", "all-grads-sync-time", "grads-reduce-scatter-time",
                               "params-all-gather-time", "layernorm-grads-all-reduce-time",
                               "embedding-grads-all-reduce-time")),
           ("optimizer", "s", ("optimizer-time",)),
           ("flops_per_s", "tflops", ("throughput",)),
           ("lr", "", ("learning-rate",)),
           ("loss", "", ("lm loss",)),
           ("grad_norm", "", ("grad-norm",)),
    ),
    # HF transformers Trainer: Trainer._maybe_log_save_evaluate logs and trainer_utils.speed_metrics;
    # its WandbCallback rewrites them to train/<key> (integration_utils.rewrite_logs)
    *_rows("hf", "transformers 5.24",
           ("samples_per_s", "", ("train_samples_per_second", "train/train_samples_per_second")),
           ("steps_per_s", "", ("train_steps_per_second", "train/train_steps_per_second")),
           ("tokens_per_s", "", ("train_tokens_per_second", "train/train_tokens_per_second")),
           ("loss", "", ("train/loss",)),
           ("lr", "", ("train/learning_rate",)),
           ("grad_norm", "", ("train/grad_norm",)),
           ("epoch", "", ("train/epoch",)),
           ("step_number", "", ("train/global_step",)),
    ),
    # nanoGPT: train.py, the wandb.log dict at each eval_interval (mfu as a percent)
    *_rows("nanogpt", "git 005475c",
           ("step_number", "", ("iter",)),
           ("mfu", "%", ("mfu",)),
           ("loss", "", ("train/loss",)),
    ),
    # mmengine: hooks/iter_timer_hook.py (message hub train/data_time, train/time, in seconds) and
    # runner/log_processor.py (the train/ prefix dropped for the loggers; memory in MB = MiB)
    *_rows("mmengine", "main",
           ("data_wait", "s", ("data_time", "train/data_time")),
           ("step", "s", ("time", "train/time")),
           ("memory_reserved", "MiB", ("memory",)),
    ),
    # detectron2: engine/train_loop.py (data_time, the max over workers) and engine/hooks.py
    # IterationTimer (time), in seconds; the same names as mmengine's
    *_rows("detectron2", "git 059601d",
           ("data_wait", "s", ("data_time",)),
           ("step", "s", ("time",)),
           ("loss", "", ("total_loss",)),
    ),
    # Accelerate: Accelerator.log passes the trainer's own dict to its trackers and defines no
    # names of its own; its examples log train_loss and epoch (the generic preset's)
    *_rows("accelerate", "1.15",
           ("epoch", "", ("epoch",)),
           ("step_number", "", ("step",)),
    ),
)
"""Read in order: the first row that fits a name, kind and unit decides (detectron2's rows, the
same names as mmengine's, are listed for the docs; ``explain`` names the first)."""


def doc_table() -> list[str]:
    """docs/METRICS.md's framework table, one row per framework and meaning (a test keeps the two
    equal)."""
    lines = ["| framework | version read | its keys | maps to |", "| --- | --- | --- | --- |"]
    for r in FRAMEWORKS:
        keys = ", ".join(f"`{n}`" for n in r.names)
        unit = f", unit `{r.unit}` when the name says none" if r.unit else ""
        lines.append(f"| {r.preset} | {r.version} | {keys} | `{r.meaning}`{unit} |")
    return lines
