"""The dflash-sidecar wire protocol: the one module both the shim and the daemon use.

Every message is one ZeroMQ frame holding one msgpack array whose first two items are the
protocol version and the message kind. The full description, with the versioning rule, is in
``docs/PROTOCOL.md``; this module is its executable form and must stay in step with it.

Version 1 messages::

    HELLO: [1, 1, sender, seq, info]
    BATCH: [1, 2, sender, seq, role, worker, step, records_total, dropped, records]

``sender`` is a random 63-bit id chosen per publisher (a forked child picks a new one), ``seq``
numbers that sender's messages from 0 without gaps. ``records_total`` is the number of records
the sender has handed to the transport so far, this batch included; with it the daemon counts
every record lost in transit exactly, even though ZeroMQ's PUB socket drops silently.
``dropped`` maps a reason to the sender's cumulative count of records it dropped itself.
``records`` is a list of ``[kind, name, value]`` triples (see ``RecordKind``).

This module imports nothing but the standard library and msgspec: the shim must stay light.
"""

from __future__ import annotations

import enum
import math
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, NamedTuple, TypeGuard

import msgspec

PROTOCOL_VERSION: Final = 1
"""The version this shim speaks. The daemon accepts every version listed in ``KNOWN_VERSIONS``."""

KNOWN_VERSIONS: Final = frozenset({1})

MAX_MESSAGE_BYTES: Final = 1024 * 1024
"""Largest frame the daemon accepts (ZeroMQ ``MAXMSGSIZE``); the shim splits batches below it.
A flush of 4096 records with 128-byte names is about 600 kB; the limit times the daemon's receive
queue bounds its memory (was 4 MiB in 0.1.0, which let a flood hold 10,000 x 4 MiB)."""

MAX_RECORDS_PER_BATCH: Final = 4096
"""The shim never puts more records than this in one message (keeps frames far below the cap)."""

MAX_NAME_BYTES: Final = 128
"""Longest metric name (UTF-8 bytes) the daemon accepts; longer names are rejected, not cut."""


class MessageKind(enum.IntEnum):
    """Second item of every message."""

    HELLO = 1
    BATCH = 2


class RecordKind(enum.IntEnum):
    """First item of every record triple ``[kind, name, value]``."""

    TIMING = 1
    """``name``: str; ``value``: duration in milliseconds (float, >= 0)."""
    COUNT = 2
    """``name``: str; ``value``: increment (int or float, >= 0)."""
    GAUGE = 3
    """``name``: str; ``value``: instantaneous value (float)."""
    CATEGORY = 4
    """``name``: str; ``value``: the category key (str or int), e.g. a hidden-state bucket id."""
    SCALAR = 5
    """``name``: str; ``value``: a GPU scalar resolved without synchronization (float)."""
    PROFILE = 6
    """``name``: the trainer step (int); ``value``: dict of profile name -> float.
    Keys ending in ``_ms`` are timings in milliseconds, all others gauges."""
    ALLOCATOR = 7
    """``name``: CUDA device index (int); ``value``: ``[allocated, reserved, max_reserved]`` bytes
    from the CUDA caching allocator's host-side counters."""


MAX_MAGNITUDE: Final = 1e18
"""Largest timing (ms: 31 million years) or counter increment a record may carry: with it a
series' lifetime sum stays finite (two timings of 1e308 made a ``_sum`` +Inf for the daemon's
life). Larger finite values are refused as ``out_of_range``."""
MAX_GAUGE_MAGNITUDE: Final = 1e150
"""Largest magnitude of a gauge or scalar (and of a profile entry that is not a timing): a
window's mean over any number of values stays finite. Beyond: ``out_of_range``."""

MAX_CATEGORY_KEY_CHARS: Final = 64
"""Longest category key accepted (a str key; int keys are always fine)."""

MAX_PROFILE_KEYS: Final = 1024
"""Entries in one PROFILE record's map; a longer one is refused whole as ``malformed_record`` (the
daemon's decoder checks the length before it decodes an entry)."""


def name_problem(name: object) -> str | None:
    """Why ``name`` is not a usable metric name, or None. A name is a str of 1 to
    ``MAX_NAME_BYTES`` UTF-8 bytes without control characters; the daemon maps any other
    character Prometheus does not allow to ``_``."""
    if type(name) is not str:
        return "bad_name"
    if not name or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES or not name.isprintable():
        return "bad_name"
    return None


def _index_problem(name: object) -> str | None:
    """A PROFILE's step or an ALLOCATOR's device index: an int >= 0."""
    return None if type(name) is int and name >= 0 else "invalid_value"


def _is_number(value: object) -> TypeGuard[int | float]:
    return (type(value) is float or type(value) is int) and math.isfinite(value)


VALUE_BOUNDS: Final[Mapping[int, tuple[float, float]]] = {
    RecordKind.TIMING: (0.0, MAX_MAGNITUDE),
    RecordKind.COUNT: (0.0, MAX_MAGNITUDE),
    RecordKind.GAUGE: (-MAX_GAUGE_MAGNITUDE, MAX_GAUGE_MAGNITUDE),
    RecordKind.SCALAR: (-MAX_GAUGE_MAGNITUDE, MAX_GAUGE_MAGNITUDE),
}
"""The accepted range of each numeric kind's value, inclusive. The daemon's series accept a value
with one inlined comparison against these (the hottest path); ``RECORD_RULES`` gives the reason."""


def _number_rule(kind: RecordKind) -> Callable[[object], str | None]:
    low, high = VALUE_BOUNDS[kind]
    below = "invalid_value" if low >= 0 else "out_of_range"  # a negative duration is no number at all

    def problem(value: object) -> str | None:
        if not _is_number(value):
            return "invalid_value"  # wrong type, NaN, infinities
        if value < low:
            return below
        return "out_of_range" if value > high else None

    return problem


def category_key_problem(value: object) -> str | None:
    """A category key: an int, or a str of 1 to ``MAX_CATEGORY_KEY_CHARS`` printable characters."""
    if type(value) is int or (
        type(value) is str and 0 < len(value) <= MAX_CATEGORY_KEY_CHARS and value.isprintable()
    ):
        return None
    return "invalid_value"


def _profile_problem(value: object) -> str | None:
    if type(value) is not dict:
        return "invalid_value"
    return "malformed_record" if len(value) > MAX_PROFILE_KEYS else None  # entries are judged one by one


def _allocator_problem(value: object) -> str | None:
    if type(value) is list and len(value) == 3 and all(type(v) is int and v >= 0 for v in value):
        return None
    return "invalid_value"


class RecordRule(NamedTuple):
    """How a record of one kind is judged, by the daemon (which drops and counts it by the
    reason) and by the shim's strict mode (which raises at the call site). A NamedTuple, not a
    dataclass: the shim does not import ``dataclasses`` (5 ms)."""

    word: str
    """The kind as a word in messages: ``timing``, ``count``, ..."""
    name_problem: Callable[[object], str | None]
    """Why the record's ``name`` is refused (a drop reason), or None."""
    value_problem: Callable[[object], str | None]
    """Why its ``value`` is refused, or None."""
    name_types: tuple[type, ...]
    value_types: tuple[type, ...]
    """The types ``name`` and ``value`` may have on the wire: a refused value of another type is a
    ``TypeError`` in strict mode, one of these types a ``ValueError``."""
    accepts: str
    """The accepted values, in words (strict mode's messages)."""
    name_accepts: str = f"the name must be a str of 1 to {MAX_NAME_BYTES} UTF-8 bytes without control characters"
    """The accepted names, in words."""


RECORD_RULES: Final[Mapping[int, RecordRule]] = {
    RecordKind.TIMING: RecordRule("timing", name_problem, _number_rule(RecordKind.TIMING), (str,), (int, float),
                                  f"a finite number of milliseconds from 0 to {MAX_MAGNITUDE:g}"),
    RecordKind.COUNT: RecordRule("count", name_problem, _number_rule(RecordKind.COUNT), (str,), (int, float),
                                 f"a finite increment from 0 to {MAX_MAGNITUDE:g}"),
    RecordKind.GAUGE: RecordRule("gauge", name_problem, _number_rule(RecordKind.GAUGE), (str,), (int, float),
                                 f"a finite number within ±{MAX_GAUGE_MAGNITUDE:g}"),
    RecordKind.CATEGORY: RecordRule("category", name_problem, category_key_problem, (str,), (int, str),
                                    f"an int or 1 to {MAX_CATEGORY_KEY_CHARS} printable characters"),
    RecordKind.SCALAR: RecordRule("scalar", name_problem, _number_rule(RecordKind.SCALAR), (str,), (int, float),
                                  f"a finite number within ±{MAX_GAUGE_MAGNITUDE:g}"),
    RecordKind.PROFILE: RecordRule("profile", _index_problem, _profile_problem, (int,), (dict,),
                                   f"a dict of at most {MAX_PROFILE_KEYS} entries name -> number",
                                   "the step must be an int >= 0"),
    RecordKind.ALLOCATOR: RecordRule("allocator", _index_problem, _allocator_problem, (int,), (list,),
                                     "[allocated, reserved, max_reserved] byte counts (ints >= 0)",
                                     "the device index must be an int >= 0"),
}
"""One rule per record kind: the one validation both sides apply. A kind not in this table is
``unknown_kind``."""


def record_rule(kind: object) -> RecordRule | None:
    """The rule of ``kind``, or None for an unknown kind. A kind is found by equality, as a dict
    finds it: ``True`` and ``1.0`` are TIMING, ``6.0`` is PROFILE (the daemon's per-sender caches
    are dicts keyed by kind, so it could not tell them apart without a per-record check)."""
    try:
        return RECORD_RULES.get(kind)  # type: ignore[call-overload]
    except TypeError:  # unhashable
        return None


def record_problem(kind: object, name: object, value: object) -> str | None:
    """Why the record ``[kind, name, value]`` must be rejected (a drop reason), or None.
    Reasons: ``unknown_kind``, ``bad_name``, ``invalid_value``, ``out_of_range``,
    ``malformed_record`` (a profile over ``MAX_PROFILE_KEYS``). The name is
    judged before the value; a PROFILE's entries are judged apart (``profile_entry_problem``)."""
    rule = record_rule(kind)
    if rule is None:
        return "unknown_kind"
    return rule.name_problem(name) or rule.value_problem(value)


def profile_entry_kind(key: object) -> int:
    """The kind a PROFILE entry is aggregated as: TIMING for a key ending in ``_ms``, else GAUGE."""
    return _TIMING if type(key) is str and key.endswith("_ms") else _GAUGE


_TIMING: Final = int(RecordKind.TIMING)
_GAUGE: Final = int(RecordKind.GAUGE)


def profile_entry_problem(key: object, value: object) -> str | None:
    """Why one ``key: value`` entry of a PROFILE record must be skipped, or None: it is judged as
    a record of its kind (``profile_entry_kind``)."""
    return record_problem(profile_entry_kind(key), key, value)


class Hello(msgspec.Struct):
    """What a sender says about itself. Sent first and then every few seconds, so a daemon
    started after the trainer learns it too. Unknown keys are ignored by the daemon."""

    pid: int
    host: str
    role: str
    worker: str
    shim_version: str
    protocol_version: int = PROTOCOL_VERSION
    devices: list[int] = []
    thread: str = ""
    started_unix_s: float = 0.0
    wandb_run_id: str | None = None
    wandb_project: str | None = None
    wandb_entity: str | None = None
    wandb_mode: str | None = None
    wandb_primary: bool | None = None
    run_label: str | None = None
    """The launcher's name for the run (``trainer_shim.run_label``), None when none names it."""
    flops_per_token: float | None = None
    """Model FLOPs per trained token the trainer states (for the run ledger's MFU), or None."""
    closing: bool = False
    """True in the last message of a publisher that closes (``close()``, or at interpreter exit),
    sent after its last batch: the sender ends cleanly and sends nothing more."""


def encode_hello(encoder: msgspec.msgpack.Encoder, sender: int, seq: int, hello: Hello) -> bytes:
    """Encode a HELLO message. Raises ``TypeError`` only if ``hello`` holds unencodable values."""
    return encoder.encode([PROTOCOL_VERSION, MessageKind.HELLO, sender, seq, hello])


def encode_batch(
    encoder: msgspec.msgpack.Encoder,
    sender: int,
    seq: int,
    role: str,
    worker: str,
    step: int | None,
    records_total: int,
    dropped: dict[str, int],
    records: Sequence[object],
) -> bytes:
    """Encode a BATCH message. Raises ``TypeError`` if a record holds a value msgpack cannot
    carry and the encoder has no hook for it."""
    return encoder.encode(
        [PROTOCOL_VERSION, MessageKind.BATCH, sender, seq, role, worker, step, records_total,
         dropped, records]
    )


# -- the sender's tally ----------------------------------------------------------------------------
# Not a message: a small file per publisher in ``<socket path>.tallies/`` (``endpoint.tally_dir``),
# rewritten by the shim's flusher after each flush cycle and read by the daemon once the process is
# gone. It carries the same totals a batch does, so the daemon can reconcile what the sender made
# with what arrived even when the last frames never left the process. See docs/PROTOCOL.md.

TALLY_VERSION: Final = 1
TALLY_MAGIC: Final = b"DFL1"
TALLY_SLOT_OFFSETS: Final = (0, 1 << 20)
"""Two slots, written alternately: a process killed in the middle of a write leaves the other slot
intact. The second starts at 1 MiB (the file is sparse); a slot holds at most
``TALLY_MAX_PAYLOAD`` bytes."""
_TALLY_HEADER = struct.Struct("<4sIIQ")  # magic, payload length, crc32 of seq+payload, seq
TALLY_MAX_PAYLOAD: Final = (1 << 20) - _TALLY_HEADER.size
TALLY_SUFFIX: Final = ".tally"
"""A tally file's name ends so."""
DEPRECATED_TALLY_SUFFIX: Final = ".ledger"
"""A tally file's name as shims of the previous release write it (deprecated: still read by the
daemon for one release, ``parse_tally_file_name``)."""
CRASH_SUFFIX: Final = ".crash"
"""Beside a tally, ``<pid>-<start ticks>-<token>.crash``: the file the shim points
``faulthandler`` at. Empty while the process lives; a fatal signal (SIGSEGV, SIGABRT, SIGBUS,
SIGFPE, SIGILL) makes faulthandler write its report there (async-signal-safe, no Python runs)."""
EXIT_SUFFIX: Final = ".exit"
"""Beside a tally, ``<pid>-<start ticks>-<token>.exit``: the file the C library writes the
process's exit status into as it exits (``trainer_shim.exit_status``): ``EXIT_UNSET`` until then,
then the status given to ``exit(3)`` as a native 4-byte ``int`` in its first four bytes."""
EXIT_UNSET: Final = b"DFSX\0\0\0\0"
"""An exit-status file's content before the process exits through ``exit(3)``."""


class TallyEnd(enum.IntEnum):
    """How the tally's last write came about."""

    RUNNING = 0
    """Written after a flush cycle of a running process: what it made after this is unknown."""
    CLOSED = 1
    """Written by ``close()`` after the last flush: the process's final totals."""
    SIGTERM = 2
    """Written by the shim's signal handler just before the process died of the signal (SIGTERM,
    or SIGINT over ``SIG_DFL``; ``Tally.signal`` says which): final totals."""


class TallyChannel(msgspec.Struct, array_like=True):
    """One channel's totals: ``records_total`` and ``dropped`` as in a BATCH; ``pending``: records
    queued in the channel and not yet drained; ``at_join``: ``records_total`` when the sender last
    saw a subscriber join; ``subscribed``: whether one was connected at this write."""

    sender: int
    role: str
    worker: str
    records_total: int
    pending: int
    at_join: int
    subscribed: bool
    dropped: dict[str, int]


class Tally(msgspec.Struct, array_like=True):
    """A publisher's tally. ``start_ticks``: the process's start time in clock ticks since boot
    (``/proc/<pid>/stat`` field 22), which with the pid names the process even after the pid is
    reused. ``omitted``: channels left out because the slot was full (their totals are unknown)."""

    version: int
    pid: int
    start_ticks: int
    started_unix_s: float
    end: int
    flush_interval_s: float
    channels: list[TallyChannel]
    omitted: int = 0
    signal: int = 0
    """The terminating signal the shim saw before this write (SIGTERM or SIGINT; 0: none): with a
    final tally, the process was *terminated* by it (docs/RELIABILITY.md, "How a sender ended")."""
    detail: str = ""
    """What ended the process as far as the shim saw, in a few words: ``Type: first line of the
    message`` of the uncaught exception (``cause`` says what it means; a shim before ``cause``
    wrote the bare type, ``KeyboardInterrupt``, ``ValueError``), empty if none."""
    max_pending: int = 0
    """Records each channel may queue before the shim drops them (0: not told): the bound on what a
    process that died without a final tally made after its last flush, per channel."""
    cause: str = ""
    """What ended the process, one of ``exit_causes.CAUSES`` (empty: nothing the shim saw): set with
    ``detail``, which then reads ``Type: first line of the message`` (cut at 160 characters)."""
    gpu: int = -1
    """For ``cause`` ``cuda_oom``: the GPU index torch's message names (-1: none)."""
    thread: str = ""
    """Non-empty when ``cause`` and ``detail`` tell an exception that ended a thread (its name), not
    the process: the process's end is told from it only if the process then fails."""


def tally_file_name(pid: int, start_ticks: int, token: str) -> str:
    """``<pid>-<start ticks>-<token>.tally``: the daemon checks whether the process is gone from
    the name alone, without opening the file."""
    return f"{pid}-{start_ticks}-{token}{TALLY_SUFFIX}"


def parse_tally_file_name(name: str, suffix: str | None = None) -> tuple[int, int] | None:
    """``(pid, start_ticks)`` of a tally file name (``TALLY_SUFFIX``, or the deprecated
    ``DEPRECATED_TALLY_SUFFIX``), or of a crash file's with ``suffix=CRASH_SUFFIX``; None if it is
    not one."""
    if suffix is None:
        suffix = DEPRECATED_TALLY_SUFFIX if name.endswith(DEPRECATED_TALLY_SUFFIX) else TALLY_SUFFIX
    if not name.endswith(suffix):
        return None
    parts = name[: -len(suffix)].split("-")
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or not parts[2].isalnum():
        return None
    pid, ticks = int(parts[0]), int(parts[1])
    return (pid, ticks) if 0 < pid < 2**31 and ticks < 2**63 else None


def encode_tally_slot(seq: int, payload: bytes) -> bytes:
    """A slot: header then ``payload``. Raises ``ValueError`` if ``payload`` is over
    ``TALLY_MAX_PAYLOAD``."""
    if len(payload) > TALLY_MAX_PAYLOAD:
        raise ValueError("tally payload too large")
    seq_bytes = seq.to_bytes(8, "little")
    crc = zlib.crc32(seq_bytes + payload)
    return _TALLY_HEADER.pack(TALLY_MAGIC, len(payload), crc, seq) + payload


def read_tally_slots(read: Any) -> bytes | None:
    """The payload of the newest intact slot, or None. ``read(offset, n)`` returns up to ``n``
    bytes of the file at ``offset`` (``os.pread`` on an open descriptor)."""
    best: tuple[int, bytes] | None = None
    for offset in TALLY_SLOT_OFFSETS:
        head = read(offset, _TALLY_HEADER.size)
        if len(head) < _TALLY_HEADER.size:
            continue
        magic, length, crc, seq = _TALLY_HEADER.unpack(head)
        if magic != TALLY_MAGIC or length > TALLY_MAX_PAYLOAD:
            continue
        payload = read(offset + _TALLY_HEADER.size, length)
        if len(payload) != length or zlib.crc32(seq.to_bytes(8, "little") + payload) != crc:
            continue  # torn: the writer died in the middle of this slot
        if best is None or seq > best[0]:
            best = (seq, payload)
    return None if best is None else best[1]
