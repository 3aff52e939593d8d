"""The units grammar: what unit a trainer's series name says its values are in.

One grammar for every name (a ``timing()``, a ``gauge()``, a key of a ``publish()`` dict), read
once per series by the mapping stage (``sidecar.processing.mapping``), never per record. A name
says its unit in one of three ways, tried in this order (case-insensitive):

1. a bracketed unit at its end: ``(ns) (us) (ms) (s) (sec) (min) (h) (%) (B) (KiB) (MiB) (GiB)
   (KB) (MB) (GB) (tps)`` (``time_metrics/end_to_end(s)``, ``memory/max_reserved(GiB)``);
2. a suffix after ``_`` (or ``/`` for ``/s``): ``_ns _us _ms _msec _millis _s _sec _secs _seconds
   _min _mins _minutes _h _hours``, ``_pct _percent _ratio _frac _fraction``, ``_bytes``,
   ``_per_s _per_sec _per_second /s``;
3. a throughput word as the whole name or its last word: ``tps`` (tokens per second),
   ``tflops`` (10^12 FLOP per second).

Each unit has a base unit, the one the series is exported in (Prometheus' base units), and the
factor from the unit to it: ``seconds``, ``ratio`` (0-1: a percent is divided by 100),
``bytes``, ``per_second``. A name with none of these, or with a bracketed unit the grammar does
not know (``(tokens)``), has no unit: the series keeps today's behaviour (a timing in
milliseconds, a gauge as sent) and ``explain`` says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SECONDS, RATIO, BYTES, PER_SECOND = "seconds", "ratio", "bytes", "per_second"
"""The base units a series is exported in."""

BASE_SUFFIX = {SECONDS: "_seconds", RATIO: "_ratio", BYTES: "_bytes", PER_SECOND: "_per_second"}
"""The exported name's suffix for each base unit (a timing's family adds ``_seconds`` itself)."""

_TIME = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "msec": 1e-3, "millis": 1e-3, "s": 1.0, "sec": 1.0,
         "secs": 1.0, "seconds": 1.0, "min": 60.0, "mins": 60.0, "minutes": 60.0, "h": 3600.0, "hours": 3600.0}
_SHARE = {"%": 0.01, "pct": 0.01, "percent": 0.01, "ratio": 1.0, "frac": 1.0, "fraction": 1.0}
_SIZE = {"b": 1.0, "bytes": 1.0, "kib": 2.0 ** 10, "mib": 2.0 ** 20, "gib": 2.0 ** 30, "kb": 1e3, "mb": 1e6,
         "gb": 1e9}

BRACKETED: dict[str, tuple[str, float, str]] = {
    **{u: (SECONDS, f, "") for u, f in _TIME.items() if u in ("ns", "us", "µs", "ms", "s", "sec", "min", "h")},
    "%": (RATIO, 0.01, ""), **{u: (BYTES, f, "") for u, f in _SIZE.items() if u != "bytes"},
    "tps": (PER_SECOND, 1.0, "tokens"),
}
"""A bracketed unit (lower case) -> (base unit, factor to it, what is counted per second)."""

SUFFIXES: dict[str, tuple[str, float, str]] = {
    **{u: (SECONDS, f, "") for u, f in _TIME.items() if u != "µs"},
    **{u: (RATIO, f, "") for u, f in _SHARE.items() if u != "%"},
    "bytes": (BYTES, 1.0, ""),
    "per_s": (PER_SECOND, 1.0, ""), "per_sec": (PER_SECOND, 1.0, ""), "per_second": (PER_SECOND, 1.0, ""),
}
"""A suffix after ``_`` (lower case) -> (base unit, factor to it, what is counted per second)."""

WORDS: dict[str, tuple[str, float, str]] = {
    "tps": (PER_SECOND, 1.0, "tokens"),
    "tflops": (PER_SECOND, 1e12, "flops"),
}
"""A throughput word (the whole name or its last ``_`` word) -> (base unit, factor, what per second)."""

_BRACKET = re.compile(r"^(.*?)[\s_]*\(\s*([^()]+?)\s*\)$")
_PER = ("s", "sec", "second")

@dataclass(frozen=True, slots=True)
class Unit:
    """The unit a name says. ``stem``: the name without it (``time_metrics/end_to_end``);
    ``written``: as written (``(s)``, ``_ms``, ``tflops``); ``base``: a base unit (``""``: not
    known); ``factor``: a value in the unit times this is in ``base``; ``per``: what a
    ``per_second`` unit counts (``tokens``, ``flops``; ``""``: not said)."""

    stem: str
    written: str = ""
    base: str = ""
    factor: float = 1.0
    per: str = ""

    @property
    def known(self) -> bool:
        return bool(self.base)

    def token_suffix(self) -> str:
        """The exported name's unit suffix (``_ratio``, ``_tokens_per_second``)."""
        if not self.base:
            return ""
        return (f"_{self.per}" if self.per else "") + BASE_SUFFIX[self.base]

    def describe(self) -> str:
        """For ``explain``: ``unit (s) -> seconds``, ``unit (tokens) not known: taken as sent``."""
        if not self.written:
            return ""
        if not self.base:
            return f"unit {self.written} not known: taken as sent"
        per = f"{self.per} " if self.per else ""
        times = "" if self.factor == 1.0 else f" x{self.factor:g}"
        return f"unit {self.written} -> {per}{self.base}{times}"


def read_unit(name: str) -> Unit:
    """The unit ``name`` says (``Unit(name)`` without one). Pure, a few string operations (no
    backtracking regex): the mapping stage calls it once per new series, never per record."""
    if name.endswith(")"):
        m = _BRACKET.match(name)
        if m is not None and m.group(1):
            found = BRACKETED.get(m.group(2).lower())
            written = f"({m.group(2)})"
            return Unit(m.group(1), written) if found is None else Unit(m.group(1), written, *found)
    lower = name.lower()
    if lower.endswith("/s") and len(name) > 2:
        return Unit(name[:-2], "/s", PER_SECOND, 1.0, "")
    head, sep, last = lower.rpartition("_")
    if not sep or not head:
        word = WORDS.get(lower)
        return Unit("", name, *word) if word is not None else Unit(name)
    if last in _PER and head.endswith(("_per", "/per", ".per")) and len(head) > 4:  # examples/per_sec: a rate
        return Unit(name[:len(head) - 4], name[len(head) - 4:], *SUFFIXES["per_" + last])
    found = SUFFIXES.get(last) or WORDS.get(last)
    if found is None:
        return Unit(name)
    return Unit(name[:len(head)], name[len(head):] if last not in WORDS else name[len(head) + 1:], *found)


def implied(written: str, stem: str) -> Unit:
    """A unit a framework's preset states for a name that carries none (``data_time`` in
    mmengine: seconds): ``written`` in the grammar's spelling (``s``, ``%``, ``tflops``)."""
    key = written.lower()
    found = BRACKETED.get(key) or SUFFIXES.get(key) or WORDS.get(key)
    if found is None:
        raise ValueError(f"unit {written!r} is not in the units grammar")
    return Unit(stem, f"{written} (preset)", *found)
