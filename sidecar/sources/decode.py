"""Frames to messages, for every protocol version ever released (see docs/PROTOCOL.md).

A frame that cannot be understood raises ``DecodeError`` with a drop reason; nothing else
escapes. A new protocol version adds a decoder to ``_DECODERS`` and never removes one: a training
run keeps the shim it started with while the daemon is upgraded under it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeGuard, Union

import msgspec
from msgspec import Meta

from sidecar.model.messages import BatchMessage, HelloMessage, Message
from sidecar.model.names import label_value
from trainer_shim.wire import MAX_MESSAGE_BYTES, MAX_PROFILE_KEYS, MAX_RECORDS_PER_BATCH, Hello, MessageKind

# Typed decoders bound what one frame can make the daemon allocate: msgspec checks each array's
# and map's length against these limits before decoding its items, and every value is a scalar
# or a small flat container, so a 4 MiB frame becomes at most a few times 4 MiB of Python objects
# and a frame that breaks a limit costs almost nothing (an untyped decode of 4 MiB of nested
# empty arrays took 26 s and 270 MB). Limits are in docs/PROTOCOL.md.
MAX_HELLO_KEYS = 64
MAX_HELLO_STR = 256
MAX_DROP_REASONS = 32

_Scalar = Union[int, float, str, bool, None]
_Value = Union[int, float, str, bool, None,
               Annotated[dict[Union[int, str], _Scalar], Meta(max_length=MAX_PROFILE_KEYS)],
               Annotated[list[_Scalar], Meta(max_length=8)]]
_Record = Annotated[list[_Value], Meta(max_length=3)]
_Dropped = Annotated[dict[Union[int, str], _Scalar], Meta(max_length=MAX_DROP_REASONS)]
_HelloStr = Annotated[str, Meta(max_length=MAX_HELLO_STR)]
_HelloValue = Union[int, float, bool, None, _HelloStr,
                    Annotated[list[Union[int, float, bool, None, _HelloStr]], Meta(max_length=16)]]
HELLO_KEYS = frozenset(Hello.__struct_fields__)
"""The hello keys the daemon keeps; others are ignored (a newer shim may send more)."""

_batch_v1 = msgspec.msgpack.Decoder(tuple[_Scalar, _Scalar, _Scalar, _Scalar, _Scalar, _Scalar, _Scalar, _Scalar,
                                          _Dropped, Annotated[list[_Record], Meta(max_length=MAX_RECORDS_PER_BATCH)]])
"""The fast path: a well-formed v1 batch in one typed decode."""
_envelope = msgspec.msgpack.Decoder(Annotated[list[msgspec.Raw], Meta(max_length=16)])
"""Anything else: the top-level array, its items left undecoded (zero-copy)."""
_scalar = msgspec.msgpack.Decoder(_Scalar)
_dropped = msgspec.msgpack.Decoder(_Dropped)
_raw_records = msgspec.msgpack.Decoder(Annotated[list[msgspec.Raw], Meta(max_length=MAX_RECORDS_PER_BATCH)])
_record = msgspec.msgpack.Decoder(_Record)
_hello_fields = msgspec.msgpack.Decoder(Annotated[dict[str, msgspec.Raw], Meta(max_length=MAX_HELLO_KEYS)])
_hello_value = msgspec.msgpack.Decoder(_HelloValue)

_MAX_INT = 2**63 - 1
_V1_BATCH_PREFIX = bytes([0x9A, 1, MessageKind.BATCH])
"""A 10-item array, version 1, kind BATCH: how the shim's encoder starts every batch."""


class DecodeError(Exception):
    """A frame was dropped; ``reason`` is the counted drop reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def decode(frame: bytes | memoryview) -> Message:
    """Decode one frame. Raises ``DecodeError`` (reasons: ``oversized`` for a frame over
    ``MAX_MESSAGE_BYTES`` or a batch of more than ``MAX_RECORDS_PER_BATCH`` records,
    ``malformed``, ``unknown_version``)."""
    if len(frame) > MAX_MESSAGE_BYTES:
        raise DecodeError("oversized")
    try:
        msg = _batch_v1.decode(frame)
    except msgspec.ValidationError as exc:
        if bytes(frame[:3]) == _V1_BATCH_PREFIX and str(exc).endswith("`$[9]`") and "length" in str(exc):
            raise DecodeError("oversized") from None  # too many records: known before decoding them
        msg = None  # not a well-formed v1 batch: classify it below
    except Exception:  # noqa: BLE001 - invalid msgpack, absurd nesting: classified below
        msg = None
    if msg is not None and msg[0].__class__ is int and msg[0] == 1 and msg[1].__class__ is int \
            and msg[1] == MessageKind.BATCH:
        return _batch(msg)
    try:
        items = _envelope.decode(frame)
        version = _scalar.decode(items[0]) if items else None
    except Exception:  # noqa: BLE001 - msgspec.DecodeError/ValidationError, RecursionError on absurd nesting
        raise DecodeError("malformed") from None
    if version.__class__ is not int or len(items) < 2:
        raise DecodeError("malformed")
    decoder = _DECODERS.get(version)
    if decoder is None:
        raise DecodeError("unknown_version")
    return decoder(items)


def _is_uint(x: Any) -> TypeGuard[int]:
    return x.__class__ is int and 0 <= x <= _MAX_INT


def _decode_v1(items: list[msgspec.Raw]) -> Message:
    try:
        kind = _scalar.decode(items[1])
        if kind.__class__ is int and kind == MessageKind.BATCH and len(items) == 10:
            header = [_scalar.decode(raw) for raw in items[:8]]
            return _batch((*header, _dropped.decode(items[8]), _records(items[9])))
        if kind.__class__ is int and kind == MessageKind.HELLO and len(items) == 5:
            sender, seq = _scalar.decode(items[2]), _scalar.decode(items[3])
            fields = _hello_fields.decode(items[4])
            if not _is_uint(sender) or not _is_uint(seq):
                raise DecodeError("malformed")
            return HelloMessage(sender, seq, _hello_info(fields))
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        raise DecodeError("malformed") from None
    raise DecodeError("malformed")


def _hello_info(fields: dict[str, msgspec.Raw]) -> dict[str, Any]:
    """The known hello keys whose value is a scalar, a short string or a short flat list; an
    unusable value is left out, as if the shim had not sent it."""
    info = {}
    for key, raw in fields.items():
        if key in HELLO_KEYS:
            try:
                info[key] = _hello_value.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                pass
    return info


def _records(raw: msgspec.Raw) -> list[Any]:
    """A batch's records one by one (the slow path, for a batch the fast path refused): a record
    that is not a flat ``[kind, name, value]`` becomes None, which aggregation counts as
    ``malformed_record``, so the rest of the batch still counts."""
    try:
        records = _raw_records.decode(raw)
    except msgspec.ValidationError as exc:
        raise DecodeError("oversized" if "length" in str(exc) else "malformed") from None
    out: list[Any] = []
    for rec in records:
        try:
            out.append(_record.decode(rec))
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            out.append(None)
    return out


def _batch(msg: tuple[Any, ...] | list[Any]) -> BatchMessage:
    _, _, sender, seq, role, worker, step, records_total, dropped, records = msg
    role, worker = label_value(role), label_value(worker)
    if (not _is_uint(sender) or not _is_uint(seq) or role is None or worker is None
            or not (step is None or _is_uint(step)) or not _is_uint(records_total)
            or len(records) > records_total):
        raise DecodeError("malformed")
    clean_dropped = {}
    for reason, count in dropped.items():
        key = label_value(reason)
        if key is None or not _is_uint(count):
            raise DecodeError("malformed")
        clean_dropped[key] = count
    return BatchMessage(sender, seq, role, worker, step, records_total, clean_dropped, records)


_DECODERS: dict[int, Callable[[list[Any]], Message]] = {1: _decode_v1}
