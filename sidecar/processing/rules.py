"""The user's mapping rules (``[[mapping]]`` tables): validated into ``Rule`` objects that the
mapping stage (``sidecar.processing.mapping``) tries first, and that the mapping settings
(``sidecar.processing.settings``) check at start-up and on reload."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.model.mapped import Mapped
from sidecar.model.meanings import MEANINGS, accepts
from sidecar.model.names import label_value
from sidecar.processing import regex_example
from sidecar.processing.units import implied
from trainer_shim.wire import MAX_NAME_BYTES

_CAPTURE_REF = re.compile(r"\$(\d+)|\$\{(\w+)\}")
TARGET_FIELDS = ("role", "worker", "name")
RULE_KEYS = frozenset({"match", "regex", "role", "worker", "name", "meaning", "phase", "unit"})
NO_MEANING = "none"
"""``phase = "none"`` (or ``meaning = "none"``): the names a rule matches mean nothing to the insight,
whatever a preset or the name reader makes of them."""


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
    unread: bool = False
    """``phase = "none"``: the names it matches have no meaning, whatever a preset or the name
    reader would make of them (a user overruling a read)."""
    unit: str = ""
    """``unit = "s"``: the unit of the values of a name that says none (the units grammar's
    spelling), as a framework preset states one: a ``publish()`` key or a gauge in seconds is a
    timing. ``""``: none (such a key is a timing in milliseconds, a ``timing()`` record's unit)."""

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
        how = f"mapping[{self.index}]" + (" (no phase)" if self.unread else "")
        return Mapped(out_role, out_worker, out_name, self.meaning, how)


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
        unread = meaning == NO_MEANING
        if unread:
            meaning = ""
        elif not isinstance(meaning, str) or (meaning and meaning not in MEANINGS):
            raise MappingError(f"{where} ({source}): unknown phase/meaning {meaning!r}; known: "
                               f"{', '.join(MEANINGS)}, or {NO_MEANING!r} (no meaning, whatever the name reads as)")
        fields = {f: table[f] for f in TARGET_FIELDS if f in table}
        for f, value in fields.items():
            if not isinstance(value, str) or not value:
                raise MappingError(f"{where} ({source}): {f} must be a non-empty string")
        if not meaning and not fields and not unread:
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
        unit = _unit(where, source, table.get("unit", ""), meaning)
        shown = f" -> {meaning}" if meaning else (f" -> {NO_MEANING}" if unread else "")
        rules.append(Rule(i + 1, source + shown + (f" (unit {unit})" if unit else ""), pattern, fields.get("role"),
                          fields.get("worker"), fields.get("name"), meaning, unread, unit))
    return tuple(rules)


def _unit(where: str, source: str, unit: object, meaning: str) -> str:
    """A rule's ``unit`` checked: a unit of the units grammar, given with a meaning.

    Raises ``MappingError`` naming the rule and what to fix."""
    if unit == "":
        return ""
    if not isinstance(unit, str):
        raise MappingError(f"{where} ({source}): unit must be a string (\"s\", \"ms\", \"%\", ...)")
    try:
        implied(unit, "")
    except ValueError:
        raise MappingError(f"{where} ({source}): unit {unit!r} is not in the units grammar (\"s\", \"ms\", "
                           "\"us\", \"min\", \"%\", \"MiB\", ...: docs/METRICS.md#units-read-from-the-name)") from None
    if not meaning:
        raise MappingError(f"{where} ({source}): a unit needs the phase or meaning its values are of")
    return unit


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
