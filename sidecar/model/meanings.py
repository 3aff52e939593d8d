"""What a trainer series means to the pipeline insight: the vocabulary the mapping stage maps
names onto and the insight reads. Declared once here; docs/SHIM.md lists it for trainer authors.

A meaning has a class, which fixes the record kinds it can come from:

- ``wait``: a timing the worker spends waiting (data loader, hidden-state queue, collectives);
- ``busy``: a timing of work (forward, backward, optimizer step, hidden-state packing);
- ``cycle``: the whole step (``step``): the wall time of one batch, phases included;
- ``overlap``: a timing inside a wait that the worker spent computing, not waiting (``OVERLAP_OF``);
- ``counter``: a count (batches, tokens);
- ``gauge``: a level (queue depth, capacity, fill, loss, learning rate);
- ``category``: a categorical sample (the hidden-state bucket);
- ``throughput``: a rate the trainer computes itself (tokens/s, samples/s, steps/s), per second;
- ``efficiency``: how well the trainer uses its GPUs by its own count (achieved TFLOP/s, MFU).

A phase meaning (``wait``, ``busy``, ``cycle``) also accepts a gauge whose unit is a share
(``data_loading(%)``, ``data_ratio``): that phase's share of the step, 0-1 (``accepts``).

``REPORTED`` says how the insight combines and exports the ``throughput`` and ``efficiency``
meanings; their descriptions here are the exported families' HELP.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from sidecar.model.names import phrases
from sidecar.model.window import CATEGORY, COUNT, GAUGE, SCALAR, TIMING

MEANINGS: dict[str, tuple[str, str]] = {
    # timings (milliseconds)
    "data_wait": ("wait", "waiting for the next input batch from the host data loader"),
    "queue_wait": ("wait", "waiting on an empty hidden-state queue (DFlash drafters: the ready deficit)"),
    "queue_put_wait": ("wait", "blocked putting into a full hidden-state queue (DFlash targets)"),
    "comm_wait": ("wait", "waiting in collectives: all-reduce, all-gather, barrier, NCCL sync"),
    "forward": ("busy", "forward pass of one batch"),
    "backward": ("busy", "backward pass of one batch"),
    "forward_backward": ("busy", "forward and backward of one batch, timed as one phase (a framework hook pair)"),
    "optimizer": ("busy", "optimizer step"),
    "pack": ("busy", "packing / copying one batch's hidden states for the drafters"),
    "step": ("cycle", "the whole step of one batch (its phases and everything between them)"),
    "comm_overlap": ("overlap", "the part of the communication wait spent while the backward still computed "
                                "(torch DDP's compute-communication overlap): not waited, taken off comm_wait"),
    # counters
    "batches": ("counter", "batches processed"),
    "tokens": ("counter", "tokens processed"),
    "loss_tokens": ("counter", "tokens that carry loss"),
    # gauges
    "queue_depth": ("gauge", "batches in the hidden-state queue"),
    "queue_capacity": ("gauge", "the hidden-state queue's capacity"),
    "queue_fill": ("gauge", "hidden-state queue fill, depth over capacity (0-1)"),
    "prefetch_depth": ("gauge", "batches in a drafter's prefetch buffer"),
    "prefetch_capacity": ("gauge", "a drafter's prefetch buffer capacity"),
    "batch_tokens": ("gauge", "total tokens of one batch"),
    "loss_token_fraction": ("gauge", "share of a batch's tokens that carry loss (0-1)"),
    "loss": ("gauge", "training loss"),
    "lr": ("gauge", "learning rate"),
    "step_number": ("gauge", "the trainer's own step or iteration number (a framework's iter/step field)"),
    "epoch": ("gauge", "the trainer's epoch (fractional where the framework says so)"),
    "grad_norm": ("gauge", "gradient norm"),
    "memory_reserved": ("gauge", "device memory the framework reports reserved (peak over its interval), bytes"),
    # categories
    "bucket": ("category", "the hidden-state bucket of a batch"),
    # the trainer's own throughput and efficiency figures (gauges, converted to base units)
    "tokens_per_s": ("throughput", "tokens per second the trainer computes itself (per device where the "
                                   "framework says so: torchtitan's tps)"),
    "samples_per_s": ("throughput", "samples per second the trainer computes itself"),
    "steps_per_s": ("throughput", "steps (iterations) per second the trainer computes itself"),
    "flops_per_s": ("efficiency", "achieved model FLOP/s per device the trainer computes itself (TFLOPs x 1e12)"),
    "mfu": ("efficiency", "model FLOPs utilization the trainer computes itself, ratio 0-1"),
}
"""Meaning -> (class, description)."""

KINDS_OF_CLASS: dict[str, frozenset[int]] = {
    "wait": frozenset({TIMING}), "busy": frozenset({TIMING}), "cycle": frozenset({TIMING}),
    "overlap": frozenset({TIMING}), "counter": frozenset({COUNT}), "gauge": frozenset({GAUGE, SCALAR}),
    "category": frozenset({CATEGORY}),
    "throughput": frozenset({GAUGE, SCALAR}), "efficiency": frozenset({GAUGE, SCALAR}),
}
"""Which record kinds may carry a meaning of each class (a rule never maps across kinds)."""

WAIT_PHASES = tuple(m for m, (c, _) in MEANINGS.items() if c == "wait")
BUSY_PHASES = tuple(m for m, (c, _) in MEANINGS.items() if c == "busy")
PHASES = WAIT_PHASES + BUSY_PHASES
"""Timings that make up a worker's wall time (``step`` is their total, not one of them)."""
THROUGHPUT = tuple(m for m, (c, _) in MEANINGS.items() if c == "throughput")
OVERLAP_OF: dict[str, str] = {"comm_overlap": "comm_wait"}
"""An ``overlap`` meaning -> the wait it is timed inside. torch DDP times its gradient all-reduce
from the first bucket's launch to the last one's end (``backward_comm_time``), most of it while the
backward still computes (``backward_compute_comm_overlap_time``: launch to the backward's end); the
worker waited only for the rest. The insight reads the wait less its overlap."""
OVERLAP_WORDS = frozenset({"overlap", "overlapped", "overlapping"})
EXPOSED_WORDS = frozenset({"exposed", "unoverlapped", "nonoverlapped", "without", "wo", "minus", "beyond", "outside",
                           "less", "after", "tail", "unhidden"})
NEGATIONS = frozenset({"non", "not", "no"})
"""Words of a wait's name: with one of ``OVERLAP_WORDS`` it names the overlap inside the wait
(``backward_compute_comm_overlap_time``), unless one of ``EXPOSED_WORDS`` or ``NEGATIONS`` says it
is what lies outside it (``comm_time_without_overlap``, ``non_overlapped_comm``). A wait whose name
has one of ``EXPOSED_WORDS``, or one of ``NEGATIONS`` beside an overlap word (not
``allreduce_non_blocking``: a mode), is exposed already (``comm_exposed_us``): no overlap is
taken off it (``said_exposed``)."""


def said_exposed(words: Collection[str]) -> bool:
    """Whether a wait's name (its words, lower case) says it lies outside any overlap."""
    return not EXPOSED_WORDS.isdisjoint(words) or (not NEGATIONS.isdisjoint(words)
                                                   and not OVERLAP_WORDS.isdisjoint(words))
EFFICIENCY = tuple(m for m, (c, _) in MEANINGS.items() if c == "efficiency")

COLLECTIVES: dict[str, frozenset[str]] = {
    "allreduce": frozenset({"allreduce", "all_reduce"}),
    "allgather": frozenset({"allgather", "all_gather"}),
    "reducescatter": frozenset({"reducescatter", "reduce_scatter"}),
    "alltoall": frozenset({"alltoall", "all_to_all", "all2all", "a2a"}),
    "broadcast": frozenset({"broadcast", "bcast"}),
    "send": frozenset({"send"}),
    "recv": frozenset({"recv"}),
}
"""A collective -> how trainers spell it, as words of a name split at separators and case changes
(``AllGather`` -> ``all_gather``; ``all2all`` is one word): the reader reads each spelling as
``comm_wait``, and the insight tells the collectives of one loop's communication waits apart by them
(an FSDP loop's all-gather and reduce-scatter are two parts of its wait, summed)."""


def collectives(words: Sequence[str]) -> frozenset[str]:
    """The ``COLLECTIVES`` that ``words`` (a name's words, lower case, in order) name: a spelling is
    one of their ``phrases``."""
    spelt = phrases(words)
    return frozenset(c for c, spellings in COLLECTIVES.items() if spellings & spelt)


UNITS: dict[str, str] = {
    "tokens_per_s": "per_second", "samples_per_s": "per_second", "steps_per_s": "per_second",
    "flops_per_s": "per_second", "mfu": "ratio", "memory_reserved": "bytes",
}
"""The base unit (``sidecar.processing.units``) a gauge meaning's values are exported in; a preset
gives one of these meanings only to a name in that unit (its own or its framework's)."""

SHARE_UNIT = "ratio"
"""The base unit of a share (``sidecar.model.units``): a phase gauge in it is a share of the step."""


def accepts(meaning: str, kind: int, unit: str = "") -> bool:
    """Whether a record of ``kind`` (a ``RecordKind`` value) whose name reads as ``unit`` (a base
    unit of ``sidecar.model.units``, ``""``: none) can carry ``meaning``: a phase meaning also
    takes a gauge in ``SHARE_UNIT`` (the phase's share of the step)."""
    cls = MEANINGS.get(meaning)
    if cls is None:
        return False
    if kind in KINDS_OF_CLASS[cls[0]]:
        return True
    return unit == SHARE_UNIT and kind == GAUGE and cls[0] in ("wait", "busy")


@dataclass(frozen=True, slots=True)
class ReportedFigure:
    """A throughput or efficiency figure the trainer computes itself, and how it is exported."""

    meaning: str
    """Its ``model.meanings`` meaning (class ``throughput`` or ``efficiency``)."""
    family: str
    """Prometheus family, after ``dflash_pipeline_reported_`` (labels host, role)."""
    combine: Literal["sum", "mean"]
    """Over the role's workers that report it: ``sum`` (each reports its own share: tokens and
    samples per second) or ``mean`` (the same figure on every worker: data-parallel workers step
    together, and FLOP/s and MFU are per GPU)."""

    @property
    def wandb_key(self) -> str:
        """W&B key, after ``pipeline/reported/`` (then ``/<role>``): its meaning."""
        return self.meaning

    @property
    def help(self) -> str:
        """Prometheus HELP and W&B description: the meaning's own description and how the
        workers' values combine."""
        how = "summed over" if self.combine == "sum" else "mean over"
        text = MEANINGS[self.meaning][1]
        return f"{text[0].upper()}{text[1:]}, {how} the role's workers that report it."


REPORTED: tuple[ReportedFigure, ...] = (
    ReportedFigure("tokens_per_s", "tokens_per_second", "sum"),
    ReportedFigure("samples_per_s", "samples_per_second", "sum"),
    ReportedFigure("steps_per_s", "steps_per_second", "mean"),
    ReportedFigure("flops_per_s", "flops_per_second", "mean"),
    ReportedFigure("mfu", "mfu_ratio", "mean"),
)
"""The trainer's own figures the insight reads (per role), in export order."""
