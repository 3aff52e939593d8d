"""What the mapping stage hands the series stage: a trainer's series name resolved."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Mapped:
    """What a series name resolved to. ``name``: the name the series is kept and exported under
    (as sent, less a role/worker prefix); ``meaning``: a ``model.meanings.MEANINGS`` key or ``""``
    (unmapped); ``rule``: what decided it (``mapping[2]``, ``preset dflash``, ``key grammar``)."""

    role: str
    worker: str
    name: str
    meaning: str
    rule: str
