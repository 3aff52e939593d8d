"""Metric names and label values: from whatever a trainer sends to what Prometheus accepts."""

from __future__ import annotations

import re

_INVALID = re.compile(r"[^a-zA-Z0-9_]+")
MAX_LABEL_CHARS = 64


def metric_token(name: str) -> str:
    """A trainer's metric name as a Prometheus name fragment: every run of characters outside
    ``[a-zA-Z0-9_]`` becomes one ``_``; leading/trailing ``_`` are dropped. May be empty."""
    return _INVALID.sub("_", name).strip("_")


def timing_token(name: str) -> str:
    """As ``metric_token``, without a trailing unit (``_ms``): the exporter appends ``_seconds``."""
    token = metric_token(name)
    for suffix in ("_ms", "_msec", "_millis"):
        if token.endswith(suffix) and len(token) > len(suffix):
            return token[: -len(suffix)]
    return token


def counter_token(name: str) -> str:
    """As ``metric_token``, without a trailing ``_total`` (the exporter appends it)."""
    token = metric_token(name)
    if token.endswith("_total") and len(token) > len("_total"):
        return token[: -len("_total")]
    return token


TRAINER_PREFIX = "dflash_trainer_"


def family_names(kind: int, token: str) -> tuple[str, ...]:
    """The Prometheus family names a trainer series of ``kind`` (a ``RecordKind`` value) and
    sanitized ``token`` is exported under (counters without their ``_total`` sample suffix).
    Two series may share a family only if they have the same kind and raw name."""
    base = TRAINER_PREFIX + token
    if kind == 1:  # TIMING
        return (base + "_seconds",)
    if kind == 4:  # CATEGORY
        return (base + "_samples", base + "_entropy")
    return (base,)  # COUNT (exported as base_total), GAUGE, SCALAR


def label_value(value: object) -> str | None:
    """A role/worker label value: a printable str of at most ``MAX_LABEL_CHARS`` characters
    (ints are accepted as their decimal form). None if unusable."""
    if value.__class__ is int:
        return str(value)
    if value.__class__ is not str or not value or len(value) > MAX_LABEL_CHARS or not value.isprintable():  # type: ignore[arg-type]
        return None
    return value  # type: ignore[return-value]
