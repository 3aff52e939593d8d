"""The docs' option tables and ``dflash-sidecar --help`` come from the settings' declarations."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from sidecar.cli import options_doc
from sidecar.cli.main import build_parser
from sidecar.core import config

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_and_deploy_tables_are_current() -> None:
    assert options_doc.stale() == [], "regenerate with: python -m sidecar.cli.options_doc"


def test_the_readme_lists_what_top_level_help_lists() -> None:
    readme = (ROOT / "README.md").read_text()
    top = build_parser().format_help()
    for flag, what in config.summary():
        assert f"| `{flag.replace('|', chr(92) + '|')}` |" in readme and flag in top, flag
        assert what.split()[0] in top
    deploy = (ROOT / "docs" / "DEPLOY.md").read_text()
    for s in config.SETTINGS:  # every setting, with its liveness, in DEPLOY.md's table
        assert f"| `{s.name}` |" in deploy and ("applied" if s.reloadable else "restart") in deploy.split(
            f"| `{s.name}` |", 1)[1].split("\n", 1)[0], s.name


def test_a_changed_declaration_makes_the_docs_stale(tmp_path: Path, monkeypatch) -> None:
    for path in ("README.md", "docs/DEPLOY.md"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    assert options_doc.stale(tmp_path) == []
    interval = config.BY_NAME["interval"]
    changed = dataclasses.replace(interval, reloadable=False, summary="aggregation window, default 5 s")
    monkeypatch.setattr(config, "SETTINGS", tuple(changed if s is interval else s for s in config.SETTINGS))
    assert options_doc.stale(tmp_path) == ["README.md", "docs/DEPLOY.md"]
    assert options_doc.write(tmp_path) == ["README.md", "docs/DEPLOY.md"] and options_doc.stale(tmp_path) == []
    assert "aggregation window, default 5 s" in (tmp_path / "README.md").read_text()
