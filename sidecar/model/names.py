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
    """As ``metric_token``, without trailing ``_total``s (the exporter appends one)."""
    token = metric_token(name)
    while token.endswith("_total") and len(token) > len("_total"):
        token = token[: -len("_total")]
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


_SAMPLE_SUFFIXES = {1: ("_count", "_sum"), 2: ("_total",), 4: ("_total",)}
"""Sample names a family adds to its own name, by kind: summary (TIMING), counter (COUNT), and
the counter of a CATEGORY (its first family)."""


def claimed_names(kind: int, token: str) -> tuple[str, ...]:
    """Every name a series' families and samples occupy in the exposition. Two series of
    different kinds or raw names must claim disjoint sets, or the page would carry a family (or
    sample) name twice and Prometheus would reject the whole scrape."""
    families = family_names(kind, token)
    extra = tuple(families[0] + suffix for suffix in _SAMPLE_SUFFIXES.get(kind, ()))
    return families + extra


def label_value(value: object) -> str | None:
    """A role/worker label value: a printable str of at most ``MAX_LABEL_CHARS`` characters
    (ints are accepted as their decimal form). None if unusable."""
    if value.__class__ is int:
        return str(value)
    if value.__class__ is not str or not value or len(value) > MAX_LABEL_CHARS or not value.isprintable():  # type: ignore[arg-type]
        return None
    return value  # type: ignore[return-value]
