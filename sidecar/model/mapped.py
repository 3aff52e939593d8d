"""What the mapping stage hands the series stage: a trainer's series name resolved, and the
batches that carry the mapped names into the aggregator."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple


@dataclass(frozen=True, slots=True)
class Mapped:
    """What a series name resolved to. ``name``: the name the series is kept under (as sent, less a
    role/worker prefix); ``meaning``: a ``model.meanings.MEANINGS`` key or ``""`` (unmapped);
    ``rule``: what decided it (``mapping[2]``, ``preset dflash``, ``key grammar``), and the unit read.

    Units (``sidecar.model.units``): ``unit`` is the base unit the series holds (``seconds``,
    ``ratio``, ``bytes``, ``per_second``; ``""``: none read from the name, today's behaviour);
    ``scale`` multiplies each value as sent into the series' unit (a timing series holds
    milliseconds and is exported in seconds; any other in its base unit); ``token`` is the exported
    name fragment, base unit included (``""``: the kind's default from ``name``); ``kind`` is the
    record kind the series is kept as (a profile entry's is decided by the mapping stage; ``-1``:
    the kind it was sent as).

    A meaning read from the name (``READ`` in ``rule``: no rule or preset knew it) carries what
    the reading could not settle: ``certainty`` (0-1, below 1 where the name means different things
    in different codebases), ``sibling`` (the meaning it takes beside phases of the same prefix:
    DeepSpeed's ``..._step`` next to ``..._forward`` is the optimizer step), and ``outside`` (the
    name says it is no part of one training step: eval, checkpoint, time since the start).
    ``stem``: a timing's words without its unit, joined by ``_`` (``elapsed_time_backward``), how
    the insight tells a phase from its parts (``..._backward_inner`` is part of ``..._backward``)."""

    role: str
    worker: str
    name: str
    meaning: str
    rule: str
    kind: int = -1
    token: str = ""
    scale: float = 1.0
    unit: str = ""
    certainty: float = 1.0
    sibling: str = ""
    outside: bool = False
    stem: str = ""
    axis: bool = False
    """A ``publish()`` key whose namespace is a count of items (``Train/Samples/...``): its sender's
    step may count samples, not steps (``sidecar.aggregation.step_axis``)."""


READ = "read from the name"
"""A ``rule`` that starts with this: the meaning was read from the name (``sidecar.processing.reader``)."""


NameKey = tuple[int, str]
"""A series name as a sender sent it: (record kind, name); a ``publish()`` dict key is (PROFILE, key)."""


NO_NAMES: Mapping[NameKey, Mapped] = MappingProxyType({})
"""No mapped names (a batch before the mapping stage answered for any)."""


class PendingBatch(NamedTuple):
    """The rest of a sender's batch that the aggregator stopped in, at the first record whose name
    its sender's series table does not know: the names it needs mapped (``unmapped``, in the order
    the batch meets them), to be handed back with the mapping stage's answers
    (``Aggregator.resume``). Made only where a batch meets new names, never per frame.

    ``sender_id`` keys the sender's series table; ``records`` are the records left, from the one
    that stopped it; ``resume`` and ``batch`` are the aggregator's own bookmark in the batch (its
    sender's turn, and which of the sender's batches this is: a batch is resumed before the
    sender's next one begins)."""

    sender_id: int
    records: Sequence[object]
    unmapped: tuple[NameKey, ...]
    resume: object
    batch: int


Ingested = tuple[int, dict[str, int], "PendingBatch | None"]
"""What the aggregator made of (a part of) a batch: (records accepted, records rejected by reason
(a new dict), the rest of the batch waiting for names (None: the batch is done)). A plain tuple,
made once per frame (bench/RESULTS_DAEMON.md, "The second step's path")."""
