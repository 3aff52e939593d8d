"""Frames to messages, for every protocol version ever released (see docs/PROTOCOL.md).

A frame that cannot be understood raises ``DecodeError`` with a drop reason; nothing else
escapes. A new protocol version adds a decoder to ``_DECODERS`` and never removes one: a training
run keeps the shim it started with while the daemon is upgraded under it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from sidecar.aggregation.names import label_value
from trainer_shim.wire import MAX_MESSAGE_BYTES, MessageKind

_decoder = msgspec.msgpack.Decoder()

_MAX_INT = 2**63 - 1


class DecodeError(Exception):
    """A frame was dropped; ``reason`` is the counted drop reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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


def decode(frame: bytes | memoryview) -> Message:
    """Decode one frame. Raises ``DecodeError`` (reasons: ``oversized``, ``malformed``,
    ``unknown_version``)."""
    if len(frame) > MAX_MESSAGE_BYTES:
        raise DecodeError("oversized")
    try:
        msg = _decoder.decode(frame)
    except Exception:  # msgspec.DecodeError, RecursionError, MemoryError on absurd payloads
        raise DecodeError("malformed") from None
    if msg.__class__ is not list or len(msg) < 2 or msg[0].__class__ is not int:
        raise DecodeError("malformed")
    decoder = _DECODERS.get(msg[0])
    if decoder is None:
        raise DecodeError("unknown_version")
    return decoder(msg)


def _is_uint(x: Any) -> bool:
    return x.__class__ is int and 0 <= x <= _MAX_INT


def _decode_v1(msg: list[Any]) -> Message:
    kind = msg[1]
    if kind == MessageKind.BATCH and len(msg) == 10:
        _, _, sender, seq, role, worker, step, records_total, dropped, records = msg
        role, worker = label_value(role), label_value(worker)
        if (not _is_uint(sender) or not _is_uint(seq) or role is None or worker is None
                or not (step is None or _is_uint(step)) or not _is_uint(records_total)
                or dropped.__class__ is not dict or records.__class__ is not list
                or len(records) > records_total):
            raise DecodeError("malformed")
        clean_dropped = {}
        for reason, count in dropped.items():
            if label_value(reason) is None or not _is_uint(count):
                raise DecodeError("malformed")
            clean_dropped[reason] = count
        return BatchMessage(sender, seq, role, worker, step, records_total, clean_dropped, records)
    if kind == MessageKind.HELLO and len(msg) == 5:
        _, _, sender, seq, info = msg
        if not _is_uint(sender) or not _is_uint(seq) or info.__class__ is not dict:
            raise DecodeError("malformed")
        return HelloMessage(sender, seq, info)
    raise DecodeError("malformed")


_DECODERS: dict[int, Callable[[list[Any]], Message]] = {1: _decode_v1}
