"""The mapping stage: a trainer's own series names -> role, worker and meaning.

Between decode and aggregation, each new series name (per sender, kind and name; never per
record: the aggregator caches the result with the series) is resolved in this order:

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sidecar.model.mapped import Mapped
from sidecar.model.meanings import MEANINGS, accepts
from sidecar.model.names import counter_token, label_value, metric_token
from sidecar.model.settings import RoleSettings
from sidecar.model.window import CATEGORY, COUNT, GAUGE, PROFILE, SCALAR, TIMING
from sidecar.processing import presets, regex_example
from sidecar.processing.presets import PRESETS
from sidecar.processing.settings import MappingSettings
from sidecar.processing.units import SECONDS, Unit, read_unit
from trainer_shim.wire import MAX_NAME_BYTES

__all__ = ["PRESETS", "Mapper", "MappingError", "Rule", "map_names", "parse_rules", "preset_table"]
_SEP = re.compile(r"[./]")
_CAPTURE_REF = re.compile(r"\$(\d+)|\$\{(\w+)\}")
TARGET_FIELDS = ("role", "worker", "name")
RULE_KEYS = frozenset({"match", "regex", "role", "worker", "name", "meaning", "phase"})


class MappingError(ValueError):
    """An invalid user mapping rule; the message names the rule and what to fix."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One user rule, validated. ``pattern`` matches the whole name as sent."""

    index: int
    source: str
    """The rule as written, for messages and ``explain`` (``match = "..." -> phase = "..."``)."""
    pattern: re.Pattern[str]
    role: str | None = None
    worker: str | None = None
    name: str | None = None
    meaning: str = ""

    def apply(self, kind: int, raw: str, role: str, worker: str, unit: str = "") -> Mapped | None:
        """The rule's mapping of ``raw`` sent as ``kind`` (its name read as base ``unit``), or None."""
        if self.meaning and not accepts(self.meaning, kind, unit):
            return None
        m = self.pattern.fullmatch(raw)
        if m is None:
            return None
        out_role = label_value(_expand(self.role, m)) if self.role is not None else role
        out_worker = label_value(_expand(self.worker, m)) if self.worker is not None else worker
        out_name = _expand(self.name, m) if self.name is not None else raw
        if out_role is None or out_worker is None or not out_name:
            return None
        return Mapped(out_role, out_worker, out_name, self.meaning, f"mapping[{self.index}]")


def _expand(template: str, m: re.Match[str]) -> str:
    return _CAPTURE_REF.sub(lambda r: m.group(int(r[1]) if r[1] else r[2]) or "", template)


def glob_regex(glob: str) -> str:
    """A glob as a regex: ``*`` matches one or more characters within a segment (not ``.`` or
    ``/``) and captures it (``$1``, ``$2``... in order); ``**`` matches across segments and
    captures too; everything else is literal."""
    out = []
    i = 0
    while i < len(glob):
        if glob.startswith("**", i):
            out.append("(.+)")
            i += 2
        elif glob[i] == "*":
            out.append("([^./]+)")
            i += 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return "".join(out)


def parse_rules(tables: Sequence[Mapping[str, Any]]) -> tuple[Rule, ...]:
    """Validate the ``[[mapping]]`` tables. Raises ``MappingError`` for an unknown key, a missing
    or doubled pattern, a bad regex, a pattern that can never match a trainer name, a pattern
    an earlier rule already takes, a capture that no field uses (or a field that names a capture
    the pattern lacks), or an unknown meaning."""
    rules: list[Rule] = []
    seen: dict[str, int] = {}
    for i, table in enumerate(tables):
        where = f"mapping rule {i + 1}"
        if not isinstance(table, Mapping):
            raise MappingError(f"{where}: expected a table ([[mapping]]), got {table!r}")
        unknown = sorted(set(table) - RULE_KEYS)
        if unknown:
            raise MappingError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(RULE_KEYS))}")
        if ("match" in table) == ("regex" in table):
            raise MappingError(f"{where}: give exactly one of match = \"<glob>\" or regex = \"<regex>\"")
        text = table.get("match", table.get("regex"))
        if not isinstance(text, str) or not text:
            raise MappingError(f"{where}: the pattern must be a non-empty string")
        source = f"{'match' if 'match' in table else 'regex'} = {text!r}"
        regex = glob_regex(text) if "match" in table else text
        try:
            pattern = re.compile(regex)
        except re.error as exc:
            raise MappingError(f"{where} ({source}): not a valid regex: {exc}") from None
        meaning = table.get("meaning", table.get("phase", ""))
        if "meaning" in table and "phase" in table:
            raise MappingError(f"{where}: give phase or meaning, not both")
        if not isinstance(meaning, str) or (meaning and meaning not in MEANINGS):
            raise MappingError(f"{where} ({source}): unknown phase/meaning {meaning!r}; known: "
                               f"{', '.join(MEANINGS)}")
        fields = {f: table[f] for f in TARGET_FIELDS if f in table}
        for f, value in fields.items():
            if not isinstance(value, str) or not value:
                raise MappingError(f"{where} ({source}): {f} must be a non-empty string")
        if not meaning and not fields:
            raise MappingError(f"{where} ({source}): maps to nothing; give phase/meaning, role, worker or name")
        _check_captures(where, source, pattern, fields)
        example = regex_example.example(pattern)
        if example is False:
            raise MappingError(f"{where} ({source}): can never match any name (the pattern contradicts itself)")
        if isinstance(example, str) and not _is_name(example):
            raise MappingError(f"{where} ({source}): can never match: the names it would match are not valid "
                               f"trainer names (1 to {MAX_NAME_BYTES} bytes of printable characters)")
        if regex in seen:
            raise MappingError(f"{where} ({source}): can never match: rule {seen[regex]} has the same pattern "
                               "and is tried first")
        seen[regex] = i + 1
        rules.append(Rule(i + 1, source + (f" -> {meaning}" if meaning else ""), pattern, fields.get("role"),
                          fields.get("worker"), fields.get("name"), meaning))
    return tuple(rules)


def _check_captures(where: str, source: str, pattern: re.Pattern[str], fields: Mapping[str, str]) -> None:
    used: set[int | str] = set()
    for value in fields.values():
        for found in _CAPTURE_REF.finditer(value):
            used.add(int(found[1]) if found[1] else found[2])
    names = pattern.groupindex
    for ref in used:
        if isinstance(ref, int) and not 1 <= ref <= pattern.groups:
            raise MappingError(f"{where} ({source}): ${ref} names a capture the pattern does not have "
                               f"(it has {pattern.groups})")
        if isinstance(ref, str) and ref not in names:
            raise MappingError(f"{where} ({source}): ${{{ref}}} names a capture the pattern does not have")
    for g in range(1, pattern.groups + 1):
        by_name = [n for n, idx in names.items() if idx == g]
        if g not in used and not any(n in used for n in by_name):
            label = f"${{{by_name[0]}}}" if by_name else f"${g}"
            raise MappingError(f"{where} ({source}): capture {label} is not used by role, worker or name; "
                               "use it or make the group non-capturing ((?:...) in a regex)")


def _is_name(example: str) -> bool:
    return 0 < len(example.encode("utf-8", "surrogatepass")) <= MAX_NAME_BYTES and example.isprintable()


WORKER_HEADS = frozenset({"rank", "worker"})
"""Key heads that name a worker of the channel's role: ``rank.3.data_wait_ms``."""


@dataclass
class Mapper:
    """Resolves names; immutable after construction except for the per-rule hit counts."""

    rules: tuple[Rule, ...] = ()
    known_roles: frozenset[str] = frozenset({RoleSettings.target_role, RoleSettings.drafter_role})
    """Heads of a series key that count as a role (``target.0.forward_ms``): the configured role names
    (``insight_target_role``, ``insight_drafter_role``; by default their declared defaults)."""
    hits: dict[int, int] = field(default_factory=dict)
    """Rule index -> series it has mapped (``explain`` names rules that never matched)."""

    @classmethod
    def from_settings(cls, mapping: MappingSettings, roles: RoleSettings) -> Mapper:
        """From the validated ``mapping`` rules and the role names (both in ``sidecar.config.Config``)."""
        return cls(tuple(mapping.mapping), frozenset({roles.target_role, roles.drafter_role}))

    def resolve(self, kind: int, raw: str, role: str, worker: str) -> Mapped:
        """The mapping of one series name (``raw`` as sent) from a channel labelled (role, worker).
        ``kind`` PROFILE: a ``publish()`` dict key, kept as a timing when its name (or its
        framework) says a time unit, else as a gauge (``Mapped.kind``)."""
        if kind == PROFILE:
            found = self._resolve(TIMING, raw, role, worker, entry=True)
            if found is None or not found[0].meaning:
                # a gauge meaning (a user's rule for a key in seconds) wins over an unmapped timing
                as_gauge = self._resolve(GAUGE, raw, role, worker, entry=True)
                if found is None or (as_gauge is not None and as_gauge[0].meaning):
                    found = as_gauge
        else:
            found = self._resolve(kind, raw, role, worker, entry=False)
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
        if not meaning:
            found = presets.find(kind, name, unit, entry)
            if found is not None:
                meaning, unit = found.meaning, found.unit
                how = f"{how} + preset {found.preset}" if how else f"preset {found.preset}"
        elif kind == TIMING and unit.base != SECONDS:
            if entry and unit.known:
                return None  # a dict key in another unit (a percent: a share) is no timing
            unit = Unit(name, unit.written)  # a rule's timing without a time unit: milliseconds
        if entry and kind == TIMING and unit.base != SECONDS and not (meaning and by_rule is not None):
            return None
        return _mapped(kind, role, worker, name, meaning, how, unit), by_rule

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


def map_names(mapper: Mapper, names: Iterable[tuple[int, str]], role: str,
              worker: str) -> dict[tuple[int, str], Mapped]:
    """The mapping stage for one batch: each (kind, name) of a sender labelled (role, worker) -> its
    ``Mapped`` (names already checked by ``trainer_shim.wire.name_problem``)."""
    return {(kind, name): mapper.resolve(kind, name, role, worker) for kind, name in names}
