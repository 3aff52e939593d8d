"""How a component declares its settings: one dataclass field per setting, its metadata the rest.

A component's settings are a frozen dataclass; each field made by ``setting(...)`` is one option
of the daemon: the field's default is the option's default, the metadata (``Spec``) its help,
validator, bounds and whether a SIGHUP reload applies it (``reloadable``). ``sidecar.core.config`` gathers the
components' dataclasses into ``Config`` and generates from these declarations the command-line
flags, the TOML keys, the sample config, the validation messages, the reload diff and the docs'
option tables; nothing else names a setting's default, bound or help.

A section's key prefix (``KEY_PREFIX``, a class attribute, default none) goes before each field
name to make the TOML key and the flag (``insight_`` + ``starved_ratio``), so a component keeps
short field names while the keys say whose they are. ``TITLE`` (a class attribute) names the
section's group of options in ``--help``. A section whose settings must agree with each other
defines ``check_settings(self) -> Mapping[str, Any]``: it raises ``ValueError`` with the message
to show, or returns corrections (field -> value, e.g. a default computed from the others).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

KINDS = ("value", "list", "switch", "tables")
"""``value``: one value; ``list``: flag repeatable, TOML array (``check`` sees each item);
``switch``: a boolean (``--no-<flag>`` turns off one whose default is on, ``--<flag>`` turns on one
whose default is off); ``tables``: TOML array of tables only, no flag (``check`` sees the list)."""


@dataclass(frozen=True)
class Spec:
    """What a setting is, beside its default (the dataclass field's)."""

    help: str
    check: Callable[[Any], Any] = str
    """Turns one raw value (a flag's string, a TOML value; a list's item) into the field's value.
    Raises ``ValueError`` or ``TypeError`` saying what is expected."""
    kind: str = "value"
    reloadable: bool = False
    """A SIGHUP reload applies a change at once; otherwise the change waits for a restart."""
    bounds: tuple[float, float] | None = None
    """Inclusive (lowest, highest) of a numeric setting, checked after ``check``."""
    unit: str = ""
    """What the bounds count (``seconds``), for messages and help."""
    metavar: str | None = None
    """The value's placeholder in ``--help`` and the docs (``S``, ``HOST:PORT``)."""
    example: str | None = None
    """Shown in the sample config instead of the default (for defaults computed or empty);
    ``default_note`` then says what the default is."""
    default_note: str | None = None
    off_help: str | None = None
    """For a switch on by default: what its ``--no-`` flag does, as ``--help`` shows it (``help``
    says what the setting does, as the config file and the docs show it)."""
    summary: str | None = None
    """One line for the short option lists (``dflash-sidecar --help``, the README's table);
    settings without one appear only in the full lists."""


def setting(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
            help: str, **spec: Any) -> Any:
    """A dataclass field that is a setting: ``default`` (or ``default_factory``) plus ``Spec(help, **spec)``.
    Raises ``TypeError`` for an unknown ``Spec`` argument, ``ValueError`` for an unknown kind."""
    declared = Spec(help, **spec)
    if declared.kind not in KINDS:
        raise ValueError(f"unknown setting kind {declared.kind!r}")
    return dataclasses.field(default=default, default_factory=default_factory, metadata={"setting": declared})


def _num(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


class OutOfRange(ValueError):
    """Raised by a check (or ``bounds``) for a value of the right type that the setting does not
    accept, saying what it must be (``must be ...``): ``Setting.parse`` puts the key before that,
    so the message names the setting without the check knowing its name."""


@dataclass(frozen=True, kw_only=True)
class Setting(Spec):
    """One declared setting as the rest of the program sees it: its declaration (``Spec``'s
    fields, ``metavar`` filled in) and where it lives."""

    name: str
    """The TOML key (``KEY_PREFIX`` + field name); the flag is ``--`` + name with dashes."""
    attr: str
    """The field of the section (and of ``sidecar.core.config.Config``) that holds the value."""
    section: type
    default: Any
    """The declared default; ``None`` also for one computed at start-up (``default_factory``)."""
    metavar: str
    """The declared placeholder, else the key in capitals."""

    @property
    def flag(self) -> str:
        """The command-line flag (``--no-`` form for a switch that is on by default); ``""`` for tables."""
        if self.kind == "tables":
            return ""
        dashed = self.name.replace("_", "-")
        return f"--no-{dashed}" if self.kind == "switch" and self.default is True else f"--{dashed}"

    def value(self, config: Any) -> Any:
        """This setting's value in ``config`` (a section or ``Config``)."""
        return getattr(config, self.attr)

    def parse(self, raw: Any) -> Any:
        """One raw value (a list's item) through ``check``, then ``bounds``. Raises ``TypeError``
        or ``ValueError`` saying what is expected; for a value out of range, naming the key."""
        try:
            value = self.check(raw)
            if self.bounds is not None:
                low, high = self.bounds
                if not low <= value <= high:  # also refuses NaN
                    unit = f" {self.unit}" if self.unit else ""
                    raise OutOfRange(f"must be between {_num(low)} and {_num(high)}{unit}")
        except OutOfRange as exc:
            raise ValueError(f"{self.name} {exc}") from None
        return value

    def default_text(self, quote: str = "") -> str:
        """The default as the help and the docs say it: ``default_note``, ``unset``, ``on``/``off``
        for a switch, else the value (each item of a list) between ``quote``s."""
        if self.default_note is not None:
            return self.default_note
        if self.default is None or self.default == ():
            return "unset"
        if isinstance(self.default, bool):
            return "on" if self.default else "off"
        if isinstance(self.default, tuple):
            return ", ".join(f"{quote}{v}{quote}" for v in self.default)
        return f"{quote}{_num(self.default) if isinstance(self.default, (int, float)) else self.default}{quote}"

    @property
    def flag_help(self) -> str:
        """What ``--help`` says of the flag: what it does, the accepted range and the default."""
        if self.kind == "switch" and self.default is True and self.off_help:
            text = f"{self.off_help} Default: on; this flag turns it off."
        elif "unset:" in self.help.lower() or "default" in self.help.lower():  # the help says it in words
            text = self.full_help
        else:
            text = f"{self.full_help} Default: {self.default_text()}."
        return text.replace("%", "%%")  # argparse formats help with %

    @property
    def full_help(self) -> str:
        """``help`` plus the accepted range, if any."""
        if self.bounds is None:
            return self.help
        unit = f" {self.unit}" if self.unit else ""
        return f"{self.help} Range: {_num(self.bounds[0])} to {_num(self.bounds[1])}{unit}."


def declared(section: type) -> tuple[Setting, ...]:
    """The settings a section dataclass declares, in field order (fields without a ``Spec`` are
    not settings). Raises ``TypeError`` if ``section`` is not a dataclass."""
    prefix = str(vars(section).get("KEY_PREFIX", ""))
    out = []
    for f in dataclasses.fields(section):
        spec = f.metadata.get("setting")
        if isinstance(spec, Spec):
            default = None if f.default is dataclasses.MISSING else f.default
            declaration = {field.name: getattr(spec, field.name) for field in dataclasses.fields(Spec)}
            declaration["metavar"] = spec.metavar or (prefix + f.name).upper()
            out.append(Setting(**declaration, name=prefix + f.name, attr=f.name, section=section, default=default))
    return tuple(out)


# -- validators shared by several components (each raises ValueError saying what is expected) ----

def ratio(raw: Any) -> float:
    """A check for a ratio between 0 and 1."""
    if isinstance(raw, bool):
        raise ValueError("expected a number")
    value = float(raw)
    if not 0.0 <= value <= 1.0:  # NaN fails too
        raise OutOfRange("must be a ratio between 0 and 1")
    return value


def one_of(*choices: str) -> Callable[[Any], str]:
    """A check for one of ``choices`` (case-insensitive; returned lower-case)."""
    def check(raw: Any) -> str:
        value = str(raw).lower()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value
    return check



# -- settings that more than one stage reads --------------------------------------------------

@dataclass(frozen=True)
class RoleSettings:
    """The DFlash role names: the mapping stage knows them as roles, the verdict reads the queue
    between them (``sidecar.aggregation.settings.InsightSettings`` extends this)."""

    KEY_PREFIX: ClassVar[str] = "insight_"

    target_role: str = setting("target", reloadable=True, help="Role name of the target workers (those that fill the "
                               "hidden-state queue).")
    drafter_role: str = setting("drafter", reloadable=True, help="Role name of the drafter workers (those that drain "
                                "the hidden-state queue).")
