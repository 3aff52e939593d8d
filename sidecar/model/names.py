"""Metric names and label values: from whatever a trainer sends to what Prometheus accepts."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from sidecar.model.window import ALLOCATOR, CATEGORY, COUNT, GAUGE, PROFILE, SCALAR, TIMING

_INVALID = re.compile(r"[^a-zA-Z0-9_]+")
MAX_LABEL_CHARS = 64
_SEGMENT_GRAMMAR = re.compile(r"\([^()]*\)|\[[^\[\]]*\]|([/.:|@,;=]+)")
"""A bracketed group, or a run of separators (group 1): one scan, linear in the name's length."""


def split_segments(name: str) -> list[str]:
    """``name`` cut at its separators (``/ . : | @ , ; =``) into segments (``train/perf.data_ms``:
    ``train``, ``perf``, ``data_ms``): the last is the name proper, the others its namespace (the name
    reader's first move, and the window's rules that compare names of one namespace). Inside
    brackets a ``/`` is a ratio of units, no separator (``LoadDataTime(secs/batch)``, ``Speed
    (samples/sec)``); an unclosed bracket is no bracket. Empty segments are kept."""
    out, start = [], 0
    for m in _SEGMENT_GRAMMAR.finditer(name):
        if m.group(1) is not None:
            out.append(name[start:m.start()])
            start = m.end()
    out.append(name[start:])
    return out


def phrases(words: Sequence[str]) -> set[str]:
    """``words`` and their neighbour pairs and triples joined by ``_`` (``all_reduce``,
    ``fwd_bwd_step``): how a name's words spell the phrases of a vocabulary."""
    out = set(words)
    out.update(f"{a}_{b}" for a, b in zip(words, words[1:], strict=False))
    out.update(f"{a}_{b}_{c}" for a, b, c in zip(words, words[1:], words[2:], strict=False))
    return out


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


class TrainerFamily(NamedTuple):
    """One Prometheus family a record kind is exported under."""

    name: str
    """The family's name as ``prometheus_client`` keys it (a counter without ``_total``); ``{}``
    stands for the series' sanitized token (fixed names: the daemon's own PROFILE and ALLOCATOR
    families)."""
    type: str
    """Its exposition TYPE: ``summary``, ``counter`` or ``gauge``."""
    help: str
    """Its HELP; ``{}`` stands for the token."""
    labels: tuple[str, ...]
    """Its label names in the order the collector builds them (the page sorts them)."""
    samples: tuple[str, ...] = ()
    """Suffixes its sample names add to ``name`` (a summary's ``_count``/``_sum``, a counter's
    ``_total``): a name no other series may claim."""

    def exposed(self, token: str = "") -> str:
        """The name its HELP, TYPE and samples carry (a counter's gains ``_total``)."""
        name = self.name.format(token)
        if self.type == "counter":  # as prometheus_client's CounterMetricFamily spells it
            return (name[:-6] if name.endswith("_total") else name) + "_total"
        return name


ALLOCATOR_FIELDS = ("allocated", "reserved", "max_reserved")
"""An ALLOCATOR record's values, in order: one family each."""

_RW = ("host", "role", "worker")
TRAINER_FAMILIES: dict[int, tuple[TrainerFamily, ...]] = {
    TIMING: (TrainerFamily(TRAINER_PREFIX + "{}_seconds", "summary",
                           "Trainer timing '{}' (seconds); quantiles over the last window.", _RW, ("_count", "_sum")),),
    COUNT: (TrainerFamily(TRAINER_PREFIX + "{}", "counter",
                          "Trainer counter '{}' (cumulative since the daemon started).", _RW, ("_total",)),),
    GAUGE: (TrainerFamily(TRAINER_PREFIX + "{}", "gauge", "Trainer gauge '{}' (last value).", _RW),),
    SCALAR: (TrainerFamily(TRAINER_PREFIX + "{}", "gauge", "Trainer GPU scalar '{}' (last value).", _RW),),
    CATEGORY: (TrainerFamily(TRAINER_PREFIX + "{}_samples", "counter", "Samples of category '{}' per key.",
                             _RW + ("key",), ("_total",)),
               TrainerFamily(TRAINER_PREFIX + "{}_entropy", "gauge",
                             "Shannon entropy (bits) of category '{}' over the last window.", _RW)),
    PROFILE: (TrainerFamily(TRAINER_PREFIX + "step", "gauge", "Latest trainer step published.", _RW),),
    ALLOCATOR: tuple(TrainerFamily(f"dflash_cuda_allocator_{field}_bytes", "gauge",
                                   f"CUDA caching allocator: {field.replace('_', ' ')} (bytes, host-side counter).",
                                   ("host", "gpu", "role", "worker")) for field in ALLOCATOR_FIELDS),
}
"""Record kind -> the families it is exported under, in the order the page renders them: the one
table both Prometheus renderings (``collector.trainer_families`` and ``exposition.render_trainer``),
the aggregator's name claims and the generated family lists (docs/METRICS.md,
deploy/metric_names.txt) read. A PROFILE's entries are TIMING and GAUGE series; its own family is
the step."""


def family_names(kind: int, token: str) -> tuple[str, ...]:
    """The Prometheus family names a trainer series of ``kind`` (a ``RecordKind`` value) and
    sanitized ``token`` is exported under (counters without their ``_total`` sample suffix).
    Two series may share a family only if they have the same kind and raw name."""
    return tuple(family.name.format(token) for family in TRAINER_FAMILIES[kind])


def claimed_names(kind: int, token: str) -> tuple[str, ...]:
    """Every name a series' families and samples occupy in the exposition. Two series of
    different kinds or raw names must claim disjoint sets, or the page would carry a family (or
    sample) name twice and Prometheus would reject the whole scrape."""
    families = TRAINER_FAMILIES[kind]
    names = tuple(family.name.format(token) for family in families)
    return names + tuple(name + suffix for name, family in zip(names, families) for suffix in family.samples)


def label_value(value: object) -> str | None:
    """A role/worker label value: a printable str of at most ``MAX_LABEL_CHARS`` characters
    (ints are accepted as their decimal form). None if unusable."""
    if value.__class__ is int:
        return str(value)
    if value.__class__ is not str or not value or len(value) > MAX_LABEL_CHARS or not value.isprintable():  # type: ignore[arg-type]
        return None
    return value  # type: ignore[return-value]
