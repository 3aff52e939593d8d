"""A decoded message, as the stages after decode read it (``sidecar.sources.decode`` builds them).

``BatchMessage.records`` are ``[kind, name, value]`` lists as sent, not yet checked (aggregation
checks and counts each); ``HelloMessage.info`` holds the hello keys the daemon keeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class HelloMessage:
    sender: int
    seq: int
    info: dict[str, Any]


@dataclass(frozen=True, slots=True)
class BatchMessage:
    sender: int
    seq: int
    role: str
    worker: str
    step: int | None
    records_total: int
    dropped: dict[str, int]
    records: list[Any]


Message = HelloMessage | BatchMessage
