"""Settings: each component declares its own (``sidecar.model.settings``); this module gathers
them into ``Config`` and generates the flags, the TOML keys, the sample config and the validation.

Precedence: built-in default < config file (``--config``) < command-line flag. Everything is
validated at start-up (and on SIGHUP reload); ``ConfigError`` says what to fix.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import textwrap
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from sidecar.aggregation.settings import GpuGroupSettings, InsightSettings, LedgerSettings, WindowSettings
from sidecar.core.capture_watch import CaptureSettings
from sidecar.exporters.prometheus.settings import PrometheusSettings
from sidecar.exporters.wandb.settings import WandbSettings
from sidecar.model.settings import Setting, declared, one_of, setting
from sidecar.processing.settings import MappingSettings
from sidecar.sources.settings import NvmlSettings, ReceiverSettings

T = TypeVar("T")


class ConfigError(ValueError):
    """An invalid option or config file; the message names the option and what to fix."""


@dataclass(frozen=True)
class DaemonSettings:
    """The daemon's own."""

    TITLE: ClassVar[str] = "daemon"
    """The options' group in ``--help`` and the docs."""

    log_level: str = setting("info", check=one_of("debug", "info", "warning", "error"), reloadable=True,
                             metavar="LEVEL", help="debug, info, warning or error.")


@dataclass(frozen=True)
class Config(ReceiverSettings, WindowSettings, NvmlSettings, GpuGroupSettings, PrometheusSettings,
             WandbSettings, DaemonSettings, InsightSettings, MappingSettings, LedgerSettings, CaptureSettings):
    """Validated settings: every component's section at once, so each component takes it as its own
    settings (``Config`` is an ``InsightSettings``, a ``WandbSettings``, ...). The fields, defaults
    and meanings are the sections' (``SETTINGS``)."""

    config_file: str | None = None
    """The TOML file these came from (not a setting: ``--config``)."""


SECTIONS: tuple[type, ...] = Config.__bases__
"""Every component's settings, in the order of the flags, the sample config and the docs."""
SETTINGS: tuple[Setting, ...] = tuple(s for section in SECTIONS for s in declared(section))
"""Every setting, as declared by its component."""
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
RELOADABLE: frozenset[str] = frozenset(s.name for s in SETTINGS if s.reloadable)
"""The settings a SIGHUP reload applies at once; a change to any other needs a restart."""


def section(cls: type[T], config: Config) -> T:
    """``config``'s values of section ``cls`` as a ``cls`` of its own (e.g. to compare two)."""
    return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})  # type: ignore[arg-type]


def changed(old: Config, new: Config) -> set[str]:
    """The names of the settings whose values differ between ``old`` and ``new``."""
    return {s.name for s in SETTINGS if s.value(old) != s.value(new)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every setting as a flag, one argument group per component. Defaults are suppressed so
    ``load`` can tell what was given; each flag's ``dest`` is its setting's name."""
    parser.add_argument("--config", dest="config_file", metavar="FILE", default=argparse.SUPPRESS,
                        help=CONFIG_HELP)
    for cls in SECTIONS:
        group = parser.add_argument_group(f"{getattr(cls, 'TITLE', cls.__name__)} options")
        for s in declared(cls):
            if s.kind == "tables":
                continue
            common: dict[str, Any] = {"dest": s.name, "default": argparse.SUPPRESS, "help": s.flag_help}
            if s.kind == "switch":
                group.add_argument(s.flag, action="store_false" if s.default else "store_true", **common)
            else:
                group.add_argument(s.flag, action="append" if s.kind == "list" else "store", metavar=s.metavar,
                                   **common)


CONFIG_HELP = "TOML config with every setting; flags override it; SIGHUP reloads it"
SUMMARY_HEAD = "run options (the main ones; 'dflash-sidecar run --help' lists all, with their ranges):"


def summary() -> list[tuple[str, str]]:
    """(option as typed, what it does) for the main run options: the settings whose declaration
    has a ``summary``, then ``--config``. ``dflash-sidecar --help`` and the README's table show these."""
    rows = [(f"{s.flag} {s.metavar}" if s.kind in ("value", "list") else s.flag, s.summary)
            for s in SETTINGS if s.summary]
    rows.append(("--config FILE", CONFIG_HELP))
    return [(flag, str(what)) for flag, what in rows]


def summary_help() -> str:
    """The main run options as the top-level ``--help`` lists them."""
    width = max(len(flag) for flag, _ in summary()) + 4
    lines = [SUMMARY_HEAD]
    for flag, what in summary():
        wrapped = textwrap.wrap(what, 100 - width) or [""]
        lines.append(f"  {flag.ljust(width - 2)}{wrapped[0]}")
        lines += [" " * width + more for more in wrapped[1:]]
    return "\n".join(lines)


def given(flags: Mapping[str, Any]) -> dict[str, Any]:
    """The settings (and ``config_file``) among parsed flags, by setting name (``vars(namespace)``)."""
    return {k: v for k, v in flags.items() if k in BY_NAME or k == "config_file"}


def load(cli: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> Config:
    """Build a validated ``Config`` from settings given by name (parsed flags; the config file
    that ``config_file`` names fills in the rest). Raises ``ConfigError``."""
    values: dict[str, Any] = {}
    path = cli.get("config_file")
    if path:
        values.update(read_file(path))
    values.update({k: v for k, v in cli.items() if k != "config_file"})
    return _validate(values, path)


def read_file(path: str) -> dict[str, Any]:
    """The settings in a TOML file. Raises ``ConfigError`` for an unreadable file, bad TOML or
    an unknown key."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    known = list(BY_NAME)
    unknown = sorted(set(data) - set(known))
    if unknown:
        described = []
        for key in unknown:
            close = difflib.get_close_matches(key, known, n=1)
            described.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ConfigError(f"config file {path}: unknown setting(s) {', '.join(described)}; "
                          f"known: {', '.join(sorted(known))}")
    return data


def _validate(values: Mapping[str, Any], path: str | None) -> Config:
    out: dict[str, Any] = {"config_file": path}
    for name, raw in values.items():
        s = BY_NAME.get(name)
        if s is None:
            raise ConfigError(f"unknown setting {name!r}")
        where = f"{s.flag}" + (f" (or '{s.name}' in {path})" if path else "")
        if s.kind == "tables":
            where = f"[[{s.name}]] in {path}"
        out[s.attr] = _checked(s, raw, where)
    try:
        config = Config(**out)
        for cls in SECTIONS:
            check = vars(cls).get("check_settings")
            if check is not None:
                config = dataclasses.replace(config, **check(config))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return config


def _checked(s: Setting, raw: Any, where: str) -> Any:
    """``raw`` through ``s``'s declaration. Raises ``ConfigError`` naming ``where`` and the value."""
    try:
        if s.kind == "tables":
            return s.check(raw)
        if s.kind == "list":
            return tuple(_checked_one(s, item, where) for item in (raw if isinstance(raw, list) else [raw]))
        if s.kind == "switch":
            if not isinstance(raw, bool):
                raise ValueError("expected true or false")
            return raw
        if raw is None or (raw == "" and s.default is None):
            return None  # TOML has no null: "" leaves an optional setting unset
        return _checked_one(s, raw, where)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        shown = f"{where}: {exc}" if s.kind == "tables" else f"{where}: {raw!r}: {exc}"
        raise ConfigError(f"invalid {shown}") from None


def _checked_one(s: Setting, raw: Any, where: str) -> Any:
    if isinstance(raw, bool) and s.bounds is not None:
        raise ValueError("expected a number")  # TOML true would read as 1
    try:
        return s.parse(raw)
    except (TypeError, ValueError) as exc:
        if s.kind == "list":
            raise ConfigError(f"invalid {where}: {raw!r}: {exc}") from None
        raise


def sample_toml() -> str:
    """A config file listing every setting with its help, commented out: each line carries the
    default (marked ``# default``) or an example to adapt (marked ``# example; default: ...``).
    Uncommented as it is, every line is valid (``""`` leaves an optional setting unset)."""
    lines = ["# dflash-sidecar configuration: every setting; flags override this file.",
             "# Each line shows the default ('# default') or, where the default is computed or empty,",
             "# an example to adapt ('# example'). Every line is valid uncommented as it is.", ""]
    for s in SETTINGS:
        lines.append(f"# {s.full_help}" + (" Reloadable: applied on SIGHUP." if s.reloadable else ""))
        if s.kind == "tables":
            lines += [f"# {s.name} = []  # default: none", "## e.g.:", "## [[mapping]]",
                      '## match = "loader.*.fetch_ms"', '## worker = "$1"', '## phase = "data_wait"', ""]
            continue
        if s.example is not None:
            mark = f"example; default: {s.default_note}"
            value = s.example
        else:
            mark = "default: unset" if s.default is None else "default"
            value = s.default
        lines.append(f"# {s.name} = {_toml_value(value, s)}  # {mark}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any, s: Setting) -> str:
    if s.kind == "list":
        items = [value] if isinstance(value, str) else list(value or [])
        return "[" + ", ".join(f'"{v}"' for v in items) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return '""'
    if isinstance(value, (int, float)):
        return repr(value)
    return f'"{value}"'
