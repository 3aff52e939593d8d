"""The docs' option tables, generated from the settings' declarations (``sidecar.model.settings``).

``python -m sidecar.cli.options_doc`` rewrites the marked blocks of README.md (the main run options,
as ``dflash-sidecar --help`` lists them, and the exit statuses) and docs/DEPLOY.md (every setting: key, flag, default,
whether SIGHUP applies it); ``tests/test_options_doc.py`` fails while either is out of date.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sidecar.cli.exit_status import STATUSES
from sidecar.core import config as config_mod

ROOT = Path(__file__).resolve().parents[2]
BEGIN = "<!-- {name}: generated from the settings' declarations by `python -m sidecar.cli.options_doc`; do not edit -->"
END = "<!-- /{name} -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def summary_table() -> str:
    """The README's table: the main run options."""
    rows = ["| command / option | what it does |", "| --- | --- |"]
    rows += [f"| `{_cell(flag)}` | {_cell(what)} |" for flag, what in config_mod.summary()]
    return "\n".join(rows)


def settings_table() -> str:
    """DEPLOY.md's table: every setting."""
    rows = ["| setting (TOML key) | flag | default | on SIGHUP | what it does |", "| --- | --- | --- | --- | --- |"]
    for s in config_mod.SETTINGS:
        flag = f"`{s.flag}`" if s.flag else "(file only)"
        default = _cell(s.default_text("`"))
        rows.append(f"| `{s.name}` | {_cell(flag)} | {default} | {'applied' if s.reloadable else 'restart'} "
                    f"| {_cell(s.full_help)} |")
    return "\n".join(rows)


def exit_status_table() -> str:
    """The README's table of exit statuses (``sidecar.cli.exit_status``)."""
    rows = ["| status | means | when |", "| --- | --- | --- |"]
    rows += [f"| {status} | {_cell(means)} | {_cell(when)} |" for status, means, when in STATUSES]
    return "\n".join(rows)


BLOCKS: dict[str, tuple[str, str, Callable[[], str]]] = {
    "options": ("README.md", "options", summary_table),
    "exit-status": ("README.md", "exit-status", exit_status_table),
    "settings": ("docs/DEPLOY.md", "settings", settings_table),
}


def render(text: str, name: str, body: str) -> str:
    """``text`` with the block ``name`` replaced by ``body``. Raises ``ValueError`` if the markers are missing."""
    begin, end = BEGIN.format(name=name), END.format(name=name)
    head, found, rest = text.partition(begin)
    _, found_end, tail = rest.partition(end)
    if not found or not found_end:
        raise ValueError(f"no {begin!r} ... {end!r} block")
    return f"{head}{begin}\n{body}\n{end}{tail}"


def stale(root: Path = ROOT) -> list[str]:
    """The files whose generated blocks differ from the declarations."""
    out = []
    for path, name, make in BLOCKS.values():
        text = (root / path).read_text()
        if render(text, name, make()) != text:
            out.append(path)
    return out


def write(root: Path = ROOT) -> list[str]:
    """Rewrite the stale blocks; returns the files rewritten."""
    late = stale(root)
    for path, name, make in BLOCKS.values():
        if path in late:
            file = root / path
            file.write_text(render(file.read_text(), name, make()))
    return late


if __name__ == "__main__":
    print("\n".join(f"rewrote {path}" for path in write()) or "option tables are current")
