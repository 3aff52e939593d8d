"""The docs' Markdown tables are whole tables: every run of table lines starts with a header and
its separator, and each row has the header's cells (a row pasted under the wrong heading, such
as METRICS.md's self-telemetry rows under "Live senders", shows as a table without a header)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEPARATOR = re.compile(r"^\|(\s*:?-{3,}:?\s*\|)+\s*$")


def cells(line: str) -> int:
    """Cells of a table line; pipes inside code spans or escaped (``\\|``) are not separators."""
    plain = re.sub(r"`[^`]*`", "", line.replace("\\|", ""))
    return plain.strip().strip("|").count("|") + 1


def tables(text: str) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of each run of lines starting with ``|`` outside code blocks."""
    out: list[tuple[int, list[str]]] = []
    fenced, previous = False, False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        row = not fenced and line.startswith("|")
        if row and not previous:
            out.append((number, []))
        if row:
            out[-1][1].append(line)
        previous = row
    return out


def test_every_table_has_a_header_and_rows_of_its_width() -> None:
    problems = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, lines in tables(doc.read_text()):
            if len(lines) < 2 or not SEPARATOR.match(lines[1]):
                problems.append(f"{doc.name}:{number}: table lines without a header and separator")
                continue
            width = cells(lines[0])
            problems += [f"{doc.name}:{number + i}: {cells(line)} cells, the header has {width}"
                         for i, line in enumerate(lines) if cells(line) != width]
    assert problems == []
