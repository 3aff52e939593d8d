"""The mapping stage: a trainer's own series names -> role, worker and meaning.

Each new series name (per sender, kind and name; never per record: the aggregator keeps each
sender's names with their series, and asks again only after dropping them; the pipeline hands
the names it asks for to ``Mapper.map_names``) is resolved in this order, and the answer kept in
the mapper's own cache (``Mapper.resolve``):

1. the user's rules (``[[mapping]]`` tables in the TOML config), first match wins: a glob or a
   regex over the name as sent, whose captures may fill ``role``, ``worker`` and ``name``;
2. the key grammar: ``<role>.<name>``, ``<role>.<worker>.<name>`` (``.`` or ``/`` as separator),
   where ``<role>`` is a known role (the insight's target and drafter roles) or any role followed
   by a numeric worker (``rank.3.data_wait_ms``); a role or worker in the key overrides the
   channel's;
3. the built-in presets (``PRESETS``: the DFlash trainer's names and a generic training loop's),
   matched on the remaining name without its unit (``model_forward_ms`` -> ``model_forward``).

A name nothing maps keeps the channel's role and worker and has no meaning ("unmapped"): it is
still exported as sent, the insight just does not read it. ``dflash-sidecar explain`` lists every
series with what it mapped to. The vocabulary of meanings is ``sidecar.model.meanings``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from sidecar.model.mapped import READ, Mapped, NameKey
from sidecar.model.meanings import MEANINGS
from sidecar.model.names import counter_token, metric_token
from sidecar.model.settings import RoleSettings
from sidecar.model.window import CATEGORY, COUNT, GAUGE, PROFILE, SCALAR, TIMING
from sidecar.processing import presets
from sidecar.processing.presets import PRESETS
from sidecar.processing.reader import (
    AMBIGUOUS_CERTAINTY,
    Reading,
    ambiguity,
    counts_items,
    read_name,
    read_rate,
    read_share,
    stem,
)
from sidecar.processing.rules import MappingError, Rule, parse_rules
from sidecar.processing.settings import MappingSettings
from sidecar.processing.units import PER_SECOND, RATIO, SECONDS, Unit, implied, read_unit

__all__ = ["PRESETS", "Mapper", "MappingError", "Rule", "parse_rules", "preset_table"]
_SEP = re.compile(r"[./]")


WORKER_HEADS = frozenset({"rank", "worker"})
"""Key heads that name a worker of the channel's role: ``rank.3.data_wait_ms``."""

MAX_CACHED_NAMES = 4096
"""Names a mapper keeps the answer for (emptied when full: a flood of new names is bounded by
the aggregator's budget per window; a name asked again is mapped again, with the same answer)."""


@dataclass
class Mapper:
    """Resolves names; immutable after construction except for the per-rule hit counts."""

    rules: tuple[Rule, ...] = ()
    known_roles: frozenset[str] = frozenset({RoleSettings.target_role, RoleSettings.drafter_role})
    """Heads of a series key that count as a role (``target.0.forward_ms``): the configured role names
    (``insight_target_role``, ``insight_drafter_role``; by default their declared defaults)."""
    hits: dict[int, int] = field(default_factory=dict)
    """Rule index -> names it has mapped (``explain`` names rules that never matched)."""
    _cache: dict[tuple[int, str, str, str], Mapped] = field(default_factory=dict, repr=False, compare=False)
    """(kind, name as sent, role, worker) -> its mapping: the aggregator asks again for the names
    of a sender whose series table it dropped (series expired or evicted)."""

    @classmethod
    def from_settings(cls, mapping: MappingSettings, roles: RoleSettings) -> Mapper:
        """From the validated ``mapping`` rules and the role names (both in ``sidecar.core.config.Config``)."""
        return cls(tuple(mapping.mapping), frozenset({roles.target_role, roles.drafter_role}))

    def resolve(self, kind: int, raw: str, role: str, worker: str) -> Mapped:
        """The mapping of one series name (``raw`` as sent) from a channel labelled (role, worker).
        ``kind`` PROFILE: a ``publish()`` dict key, kept as a timing when its name (or its
        framework) says a time unit, else as a gauge (``Mapped.kind``). Deterministic: the answer
        is cached (``MAX_CACHED_NAMES``)."""
        key = (kind, raw, role, worker)
        mapped = self._cache.get(key)
        if mapped is None:
            cache = self._cache
            if len(cache) >= MAX_CACHED_NAMES:
                cache.clear()
            mapped = cache[key] = self._map(kind, raw, role, worker)
        return mapped

    def maps_like(self, other: Mapper) -> bool:
        """Whether ``other`` maps every name as this one does (the same rules and role names)."""
        return (self.rules, self.known_roles) == (other.rules, other.known_roles)

    def map_names(self, names: Iterable[NameKey], role: str, worker: str) -> dict[NameKey, Mapped]:
        """The mapping stage's step in a batch: each (kind, name) ``resolve``d for a sender labelled
        (role, worker), in order (``model.mapped.PendingBatch.unmapped``: the names the aggregator
        asked for)."""
        return {key: self.resolve(key[0], key[1], role, worker) for key in names}

    def _map(self, kind: int, raw: str, role: str, worker: str) -> Mapped:
        """``resolve``, uncached: the rules, the key grammar, the presets."""
        if kind == PROFILE:
            mapped = self._entry(raw, role, worker)
            return replace(mapped, axis=True) if counts_items(raw) else mapped
        found = self._resolve(kind, raw, role, worker, entry=False)
        if kind == GAUGE and found is not None and not found[0].meaning:
            # a gauge whose name is a phase's duration (read, a preset's, a rule's) is that timing, as
            # the same name as a publish() key is: the two paths agree
            as_timing = self._resolve(TIMING, raw, role, worker, entry=True)
            if as_timing is not None and as_timing[0].meaning:
                found = as_timing
        return self._count(found)

    def _entry(self, raw: str, role: str, worker: str) -> Mapped:
        """A ``publish()`` dict key: a timing where its name says a time unit (its own or its
        framework's) or a phase is read from it, else a gauge."""
        found = self._resolve(TIMING, raw, role, worker, entry=True)
        if found is None or not found[0].meaning:
            # a gauge meaning (a user's rule for a key in seconds) wins over an unmapped timing
            as_gauge = self._resolve(GAUGE, raw, role, worker, entry=True)
            if found is None or (as_gauge is not None and as_gauge[0].meaning):
                found = as_gauge
        return self._count(found)

    def _count(self, found: tuple[Mapped, int | None] | None) -> Mapped:
        """The mapping found, its rule's hit counted."""
        assert found is not None  # only a dict key's timing form can be refused
        mapped, rule = found
        if rule is not None:
            self.hits[rule] = self.hits.get(rule, 0) + 1
        return mapped

    def _resolve(self, kind: int, raw: str, role: str, worker: str,
                 entry: bool) -> tuple[Mapped, int | None] | None:
        """``raw`` as a record of ``kind``: (its mapping, the user rule that matched); None for a
        dict key (``entry``) that cannot be a timing (no time unit, its own or its framework's)."""
        by_rule: int | None = None
        hit = None
        sent_unit = read_unit(raw).base if self.rules else ""
        for rule in self.rules:
            hit = rule.apply(kind, raw, role, worker, sent_unit)
            if hit is not None:
                by_rule = rule.index
                break
        if hit is not None:
            role, worker, name, meaning, how = hit.role, hit.worker, hit.name, hit.meaning, hit.rule
        else:
            role, worker, name, how = self._key_grammar(raw, role, worker)
            meaning = ""
        unit = read_unit(name)
        stated = self.rules[by_rule - 1].unit if by_rule is not None else ""
        if stated and not unit.known and (entry or kind != TIMING):  # a timing() record is in ms, as its API says
            unit = replace(implied(stated, unit.stem), written=f"{stated} (your rule)")
        reading: Reading | None = None
        if not meaning and not (by_rule is not None and self.rules[by_rule - 1].unread):
            found = presets.find(kind, name, unit, entry)
            if found is not None and kind in (GAUGE, SCALAR) and ((unit.written and not unit.known)
                                                                 or unit.base == PER_SECOND):
                said = read_rate(name)
                if said and found.meaning != said:
                    found = None  # a rate the name says (step/s, (samples/s)) is no step number or TFLOP/s
            if found is not None:
                meaning, unit = found.meaning, found.unit
                how = f"{how} + preset {found.preset}" if how else f"preset {found.preset}"
                if kind == TIMING and (other := ambiguity(name)) is not None:  # a bare time: which framework?
                    reading = Reading(meaning, unit, how, AMBIGUOUS_CERTAINTY, other[1])
                    how = f"{how} (ambiguous: {other[1]})"
            elif kind == TIMING and unit.base in ("", SECONDS):
                reading = read_name(name, record=not entry)
                meaning, unit, how = _use_reading(reading, unit, how)
            elif kind in (GAUGE, SCALAR) and unit.base in ("", PER_SECOND) and (rate := read_rate(name)):
                meaning, how = rate, f"{how} + {READ} (a rate)" if how else f"{READ} (a rate)"
            elif (kind in (GAUGE, SCALAR) and unit.base == RATIO and unit.factor < 1.0
                  and (share := read_share(unit.stem))):
                said = f"{READ} (a share of the step)"
                meaning, how = share, f"{how} + {said}" if how else said
        elif kind == TIMING and unit.base != SECONDS:
            if entry and unit.known:
                return None  # a dict key in another unit (a percent: a share) is no timing
            unit = Unit(name, unit.written)  # a rule's timing without a time unit: milliseconds
        if entry and kind == TIMING and unit.base != SECONDS and not (meaning and by_rule is not None):
            return None
        mapped = _mapped(kind, role, worker, name, meaning, how, unit)
        if kind == TIMING:
            mapped = replace(mapped, stem=stem(name))
        if by_rule is not None and self.rules[by_rule - 1].unread:
            mapped = replace(mapped, outside=True)  # the user says it is no phase: not unattributed either
        if reading is not None and (reading.meaning or reading.outside or reading.sibling):
            mapped = replace(mapped, certainty=reading.certainty, sibling=reading.sibling, outside=reading.outside)
        return mapped, by_rule

    def _key_grammar(self, raw: str, role: str, worker: str) -> tuple[str, str, str, str]:
        """(role, worker, name, how) from a key that names its role or worker, else as sent."""
        parts = _SEP.split(raw)
        if len(parts) >= 2 and all(parts):
            # A head counts as a role only if it is one the insight knows or the channel's own
            # (``layer.3.forward_ms`` is a per-layer name, not role "layer", worker 3); ``rank``
            # and ``worker`` heads name a worker of the channel's role.
            numbered = len(parts) >= 3 and parts[1].isascii() and parts[1].isdigit()
            rest = raw[len(parts[0]) + len(parts[1]) + 2:]
            if numbered and (parts[0] in self.known_roles or parts[0] == role):
                return parts[0], parts[1], rest, "key grammar"
            if numbered and parts[0] in WORKER_HEADS:
                return role, parts[1], rest, "key grammar"
            if parts[0] in self.known_roles:
                return parts[0], worker, raw[len(parts[0]) + 1:], "key grammar"
        return role, worker, raw, ""

    def unused_rules(self) -> list[Rule]:
        return [r for r in self.rules if not self.hits.get(r.index)]


def _use_reading(reading: Reading, unit: Unit, how: str) -> tuple[str, Unit, str]:
    """(meaning, unit, how) of a timing no rule or preset knows, from what its name reads as: the
    phase read, in the unit written anywhere in the name (``elapsed_time_ms_forward``), or in
    seconds where none is written and a phase is read (``batch_time``). A duration the name puts
    outside the step (an epoch's, an evaluation's) says why (``explain`` shows it)."""
    if not reading.meaning:
        why = f"outside the step by its name ({reading.why})" if reading.outside else ""
        return "", reading.unit if not unit.known and reading.duration else unit, \
            f"{how} + {why}" if how and why else how or why
    read = f"{READ} ({reading.why}" + (f"; {reading.ambiguous}" if reading.ambiguous else "") + ")"
    return reading.meaning, unit if unit.known else reading.unit, f"{how} + {read}" if how else read


def _mapped(kind: int, role: str, worker: str, name: str, meaning: str, how: str, unit: Unit) -> Mapped:
    """The series ``name`` of ``kind`` read in ``unit``: its exported token and the scale from the
    values as sent (a timing series holds milliseconds, any other its base unit)."""
    scale = 1.0
    if kind == TIMING and unit.base == SECONDS:
        token, scale, base = metric_token(unit.stem), unit.factor * 1000.0, SECONDS
    elif kind in (GAUGE, SCALAR) and unit.known:
        token, scale, base = (metric_token(unit.stem) + unit.token_suffix()).strip("_"), unit.factor, unit.base
    else:
        token, base = (counter_token if kind == COUNT else metric_token)(name), SECONDS if kind == TIMING else ""
    if abs(scale - 1.0) < 1e-12:
        scale = 1.0  # milliseconds stay as sent: no per-record multiply
    if kind in (COUNT, CATEGORY) or not unit.written or (unit.base == SECONDS and kind == TIMING and scale == 1.0):
        note = ""
    elif kind == TIMING and unit.base != SECONDS:
        note = f"unit {unit.written} is no time: taken as milliseconds"
    else:
        note = unit.describe()
    rule = f"{how}; {note}" if how and note else (how or note)
    return Mapped(role, worker, name, meaning, rule, kind, token, scale, base)


def preset_table() -> Iterable[tuple[str, str, str, str]]:
    """(preset, meaning, class, names) rows, for docs and ``explain``."""
    for preset, meaning, names in PRESETS:
        yield preset, meaning, MEANINGS[meaning][0], ", ".join(names)
