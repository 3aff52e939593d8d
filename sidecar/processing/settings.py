"""The mapping stage's settings (``sidecar.model.settings``): the user's own name rules.

The rules are parsed by ``rules.parse_rules``, imported only when a config has rules: the rules
load the wire format, and ``--version`` must work without it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from sidecar.model.settings import setting

if TYPE_CHECKING:
    from sidecar.processing.rules import Rule


def rules(raw: Any) -> tuple[Rule, ...]:
    """``[[mapping]]`` tables -> rules. Raises ``ValueError`` (``MappingError``) saying what to fix."""
    from sidecar.processing.rules import parse_rules

    return parse_rules(raw if isinstance(raw, list) else [raw])


@dataclass(frozen=True)
class MappingSettings:
    """The user's series-name rules, tried before the built-in presets."""

    TITLE: ClassVar[str] = "mapping"
    """The options' group in ``--help`` and the docs."""

    mapping: tuple[Rule, ...] = setting(
        (), kind="tables", check=rules, reloadable=True,
        help="Your own series names -> role, worker and phase (docs/SHIM.md, 'Your own names'): [[mapping]] "
             "tables, each with a glob (match) or a regex (regex) and what it gives: phase (or meaning), role, "
             "worker, name (captures as $1, ${name}). Checked at start-up and on reload.")
