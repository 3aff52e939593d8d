"""The training frameworks' own metric names, as built-in presets (no config needed).

Each row was read from the framework's sources at the version named: the keys it hands its
loggers (TensorBoard, W&B, its own JSON), matched like the other presets on the name without
its unit, after ``sidecar.model.names.metric_token`` (``time_metrics/data_loading(s)`` ->
``time_metrics_data_loading``) and case-insensitively. A row's ``unit`` is the one the framework
uses for a name that says none (mmengine's ``data_time`` is in seconds); a name that says its own
unit must agree with it (a percent of a phase excepted: that is the phase's share of the step).
A unit stated by a row applies to a ``publish()`` dict key and a ``gauge()``; a ``timing()`` record
whose name says no unit is in milliseconds, as its API says. docs/METRICS.md prints this table.

The rows are data, kept in ``frameworks.toml`` beside this module (one table per framework, a
comment above it naming the files read) and checked as they load.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from typing import NamedTuple

from sidecar.model.meanings import MEANINGS
from sidecar.processing.units import implied


class FrameworkRow(NamedTuple):
    """One framework name group: who emits it, at which version, what it means, its unit."""

    preset: str
    version: str
    meaning: str
    unit: str
    """The unit the framework uses when the name says none (grammar spelling: ``s``, ``%``,
    ``MiB``, ``tflops``), ``""``: none stated."""
    names: tuple[str, ...]
    """As the framework spells them (docs); matched by their ``metric_token``, lower case."""


SOURCE = "frameworks.toml"
"""The table, beside this module: one TOML table per framework (its ``version`` and its
``meanings``, each ``{unit, names}``), in the order the rows are tried."""


def load(text: str, source: str = SOURCE) -> tuple[FrameworkRow, ...]:
    """The rows of a frameworks table written as ``frameworks.toml`` is, in file order.

    Raises ``ValueError`` naming ``source`` and the framework (and row) for: TOML that does not
    parse; no framework; a framework without a string ``version``, with a key other than
    ``version`` and ``meanings``, or without a row; a meaning ``model.meanings`` lacks; a row key
    other than ``unit`` and ``names``; a unit that is no string or that the grammar does not know
    (``units.implied``); ``names`` that is no list of non-empty strings, or empty."""
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{source}: {e}") from e
    if not table:
        raise ValueError(f"{source}: no framework")
    rows: list[FrameworkRow] = []
    for preset, framework in table.items():
        where = f"{source} [{preset}]"
        if (not isinstance(framework, dict) or set(framework) != {"version", "meanings"}
                or not isinstance(framework["version"], str) or not isinstance(framework["meanings"], dict)
                or not framework["meanings"]):
            raise ValueError(f"{where}: a framework has exactly a version (a string) and meanings (a table "
                             "of at least one row)")
        for meaning, row in framework["meanings"].items():
            rows.append(_row(f"{where} {meaning}", preset, framework["version"], meaning, row))
    return tuple(rows)


def _row(where: str, preset: str, version: str, meaning: str, row: object) -> FrameworkRow:
    if meaning not in MEANINGS:
        raise ValueError(f"{where}: not a meaning of sidecar.model.meanings")
    names, unit = (row.get("names"), row.get("unit", "")) if isinstance(row, dict) else (None, None)
    if (not isinstance(row, dict) or not set(row) <= {"unit", "names"} or not isinstance(unit, str)
            or not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names)):
        raise ValueError(f"{where}: a row is {{ unit = \"...\", names = [\"...\", ...] }} (the unit optional, "
                         "at least one name, every name a non-empty string)")
    if unit:
        try:
            implied(unit, meaning)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from e
    return FrameworkRow(preset, version, meaning, unit, tuple(names))


FRAMEWORKS: tuple[FrameworkRow, ...] = load(resources.files(__package__).joinpath(SOURCE).read_text("utf-8"))
"""Read in order: the first row that fits a name, kind and unit decides (detectron2's rows, the
same names as mmengine's, are listed for the docs; ``explain`` names the first)."""


def doc_table() -> list[str]:
    """docs/METRICS.md's framework table, one row per framework and meaning (a test keeps the two
    equal)."""
    lines = ["| framework | version read | its keys | maps to |", "| --- | --- | --- | --- |"]
    for r in FRAMEWORKS:
        keys = ", ".join(f"`{n}`" for n in r.names)
        unit = f", unit `{r.unit}` when the name says none" if r.unit else ""
        lines.append(f"| {r.preset} | {r.version} | {keys} | `{r.meaning}`{unit} |")
    return lines
