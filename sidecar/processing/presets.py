"""The built-in presets: the names the mapping stage knows without config.

Two tables: ``PRESETS`` (the DFlash trainer's names and a generic training loop's) and
``sidecar.processing.frameworks.FRAMEWORKS`` (the training frameworks' own vocabularies, each with
the unit the framework uses for a name that says none). ``find`` looks a name up in both, once
per new series: the name without its unit first (``units.read_unit``), then the whole name.
"""

from __future__ import annotations

from typing import NamedTuple

from sidecar.model.meanings import PHASES, UNITS, accepts
from sidecar.model.names import counter_token, metric_token
from sidecar.model.window import COUNT, TIMING
from sidecar.processing.frameworks import FRAMEWORKS
from sidecar.processing.units import RATIO, SECONDS, Unit, implied

PRESETS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # (preset, meaning, names as sent without unit; matched case-insensitively)
    ("dflash", "forward", ("model_forward", "forward", "target_forward", "drafter_forward", "fwd")),
    ("dflash", "pack", ("pack_hidden", "pack", "pack_hidden_states", "hidden_pack", "handoff")),
    ("dflash", "queue_wait", ("queue_get", "queue_wait", "queue_get_wait", "get_wait", "ready_wait")),
    ("dflash", "queue_put_wait", ("queue_put", "queue_put_wait", "put_wait")),
    ("dflash", "backward", ("backward", "bwd")),
    ("dflash", "optimizer", ("optimizer", "optimizer_step", "optim_step", "opt_step", "optim")),
    ("dflash", "data_wait", ("data_wait", "data_load", "dataloader_wait")),
    ("dflash", "batches", ("batches", "batch_count", "steps")),
    ("dflash", "tokens", ("tokens", "num_tokens", "token_count")),
    ("dflash", "loss_tokens", ("loss_tokens", "num_loss_tokens")),
    ("dflash", "queue_depth", ("queue_depth", "queue_size", "queue_len", "queue_qsize")),
    ("dflash", "queue_capacity", ("queue_capacity", "queue_maxsize", "queue_max")),
    ("dflash", "queue_fill", ("queue_fill", "queue_fill_ratio", "queue_util")),
    ("dflash", "prefetch_depth", ("prefetch_depth", "prefetch", "prefetch_size", "prefetched")),
    ("dflash", "prefetch_capacity", ("prefetch_capacity", "prefetch_max")),
    ("dflash", "batch_tokens", ("batch_tokens",)),
    ("dflash", "loss_token_fraction", ("loss_token_fraction", "loss_token_ratio")),
    ("dflash", "bucket", ("bucket", "hidden_bucket")),
    ("generic", "data_wait", ("data_time", "data", "dataloader", "data_loading", "input_wait", "load_time")),
    ("generic", "step", ("step", "step_time", "batch_time", "iter_time", "iteration", "iteration_time",
                         "train_step")),
    ("generic", "batches", ("iterations", "iters", "iteration_count", "num_steps")),
    ("generic", "comm_wait", ("comm", "comm_wait", "allreduce", "all_reduce", "allreduce_wait", "all_gather",
                              "reduce_scatter", "collective", "collectives", "nccl", "nccl_wait", "sync",
                              "barrier", "grad_sync")),
    ("generic", "forward", ("forward_time", "fwd_time")),
    ("generic", "backward", ("backward_time", "bwd_time")),
    ("generic", "forward_backward", ("forward_backward", "fwd_bwd", "forward_backward_time", "fwd_bwd_time")),
    ("generic", "optimizer", ("optimizer_time", "optim_time", "step_optimizer")),
    ("generic", "loss", ("loss", "train_loss")),
    ("generic", "lr", ("lr", "learning_rate")),
    ("generic", "step_number", ("step", "iter", "iteration", "global_step", "iter_num")),
    ("generic", "epoch", ("epoch",)),
    ("generic", "grad_norm", ("grad_norm", "gradient_norm")),
    ("generic", "tokens_per_s", ("tokens", "tok", "throughput_tokens")),
    ("generic", "samples_per_s", ("samples", "throughput_samples")),
    ("generic", "steps_per_s", ("steps", "iters", "iterations", "it")),
)
"""The built-in names, one table (docs/SHIM.md prints it). A name maps only for a record kind its
meaning accepts (a timing meaning needs a ``timing()`` record or a profile key in a time unit), and
for a unit it fits (``tokens`` is a counter, ``tokens/s`` a throughput: ``units.read_unit``)."""



class Hit(NamedTuple):
    """A preset's answer: the meaning, the presets that name it (``mmengine/detectron2``), and
    the unit the series is read in (the name's own, or the one the framework states)."""

    meaning: str
    preset: str
    unit: Unit


_Row = tuple[str, str, str]
"""(meaning, presets, stated unit) of one preset name."""


def _index() -> dict[str, list[_Row]]:
    index: dict[str, list[_Row]] = {}
    rows = [(p, m, "", names) for p, m, names in PRESETS] + [(r.preset, r.meaning, r.unit, r.names)
                                                            for r in FRAMEWORKS]
    for preset, meaning, unit, names in rows:
        for name in names:
            found = index.setdefault(metric_token(name).lower(), [])
            same = next((i for i, (m, _, u) in enumerate(found) if (m, u) == (meaning, unit)), None)
            if same is None:
                found.append((meaning, preset, unit))
            elif preset not in found[same][1].split("/"):
                found[same] = (meaning, f"{found[same][1]}/{preset}", unit)
    return index


_INDEX = _index()


def find(kind: int, name: str, unit: Unit, entry: bool) -> Hit | None:
    """The first preset row that fits ``name`` (as kept, role and worker taken off) sent as a
    record of ``kind`` whose name reads as ``unit``; ``entry``: a ``publish()`` dict key (it may
    be a timing only in a time unit, its own or its framework's). None: no preset knows it."""
    whole = (counter_token if kind == COUNT else metric_token)(name).lower()
    stem = metric_token(unit.stem).lower() if unit.written else whole
    for token in (stem, whole) if stem != whole else (whole,):
        for meaning, preset, stated in _INDEX.get(token, ()):
            u = _unit_for(kind, meaning, unit, stated, entry)
            if u is not None and accepts(meaning, kind, u.base) and UNITS.get(meaning, u.base) == u.base:
                return Hit(meaning, preset, u)
    return None


def _unit_for(kind: int, meaning: str, unit: Unit, stated: str, entry: bool) -> Unit | None:
    """The unit a row reads the name in, or None if the row does not fit it."""
    if unit.known:
        own = implied(stated, unit.stem) if stated else unit
        if own.base != unit.base and not (unit.base == RATIO and meaning in PHASES):
            return None  # the framework's unit for this name is another one
        if own.per and unit.per and own.per != unit.per:
            return None  # tokens/s is not the FLOP/s a framework logs under the same word
        if kind == TIMING and unit.base != SECONDS:
            return None
        return unit
    if stated and (entry or kind != TIMING):  # a timing() without unit in its name is in ms, as its API says
        return implied(stated, unit.stem)
    if entry and kind == TIMING:
        return None  # a dict key is a timing only in a time unit
    return unit
