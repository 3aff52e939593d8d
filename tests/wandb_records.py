"""Read the records of a run's ``.wandb`` file, for tests.

wandb 0.31 no longer ships a Python reader for its transaction log (``wandb.sdk.internal.
datastore`` is gone; wandb-core writes the file), so this is a small one. The format is the
leveldb log format (https://github.com/google/leveldb/blob/main/doc/log_format.md) behind a
7-byte file header: ``":W&B"``, magic ``0xBEE1`` (uint16, little-endian), version ``0``. The
file is cut into 32 KiB blocks counted from the start of the file; each chunk has a 7-byte
header (CRC-32 (IEEE) of the type byte and the data, length, type: FULL, FIRST, MIDDLE, LAST) and
a record may span blocks. Each record is a ``wandb.proto.wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
import pathlib
import struct
import zlib
from collections.abc import Iterator
from typing import Any

from wandb.proto import wandb_internal_pb2

HEADER = struct.Struct("<4sHB")
CHUNK = struct.Struct("<IHB")
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


class CorruptLog(ValueError):
    """The file is not a readable ``.wandb`` transaction log."""


def records(path: str | pathlib.Path) -> Iterator[wandb_internal_pb2.Record]:
    """Yield every record of the ``.wandb`` file at ``path``; raise ``CorruptLog`` on a bad
    header or checksum. A chunk cut short at the end (a file still being written) ends it."""
    data = pathlib.Path(path).read_bytes()
    ident, magic, version = HEADER.unpack_from(data, 0)
    if (ident, magic, version) != (b":W&B", 0xBEE1, 0):
        raise CorruptLog(f"{path}: not a .wandb file (header {data[:7]!r})")
    offset, parts = HEADER.size, bytearray()
    while offset + CHUNK.size <= len(data):
        if BLOCK - offset % BLOCK < CHUNK.size:  # block trailer: zero padding
            offset += BLOCK - offset % BLOCK
            continue
        start = offset
        crc, length, kind = CHUNK.unpack_from(data, start)
        chunk = data[start + CHUNK.size:start + CHUNK.size + length]
        offset = start + CHUNK.size + length
        if kind == 0 and length == 0:
            continue  # zero padding inside a block
        if len(chunk) < length:
            break
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != crc:
            raise CorruptLog(f"{path}: checksum mismatch in the chunk at byte {start}")
        if kind in (FULL, FIRST):
            parts = bytearray(chunk)
        else:
            parts += chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(bytes(parts))
            yield record


def of_type(path: str | pathlib.Path, kind: str) -> list[Any]:
    """The payloads of the records of one type (``"history"``, ``"metric"``, ``"run"``...)."""
    return [getattr(r, kind) for r in records(path) if r.WhichOneof("record_type") == kind]


def history_rows(path: str | pathlib.Path) -> list[dict[str, Any]]:
    """The history rows, each as ``{key: decoded JSON value}``; a logged object (a media file:
    ``wandb.Html``...) comes as its fields under further ``nested_key`` parts, gathered back into
    one dict under its key (``{"_type": "html-file", "path": ...}``)."""
    rows = []
    for history in of_type(path, "history"):
        row: dict[str, Any] = {}
        for item in history.item:
            key, *fields = list(item.nested_key) or [item.key]
            if not fields:
                row[key] = json.loads(item.value_json)
                continue
            target = row.setdefault(key, {})
            for field in fields[:-1]:
                target = target.setdefault(field, {})
            target[fields[-1]] = json.loads(item.value_json)
        rows.append(row)
    return rows


def find_run_file(root: str | pathlib.Path, run_id: str) -> pathlib.Path:
    """The ``run-<id>.wandb`` file under ``root`` (a ``wandb`` dir or a folder above it)."""
    found = sorted(pathlib.Path(root).rglob(f"run-{run_id}.wandb"))
    found = [p for p in found if "latest-run" not in p.parts]
    if len(found) != 1:
        raise FileNotFoundError(f"expected one run-{run_id}.wandb under {root}, found {found}")
    return found[0]
