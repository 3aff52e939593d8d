"""The frame and window paths have no side doors (issue 35): the ingest loop and the pipeline
probe nothing with getattr, the daemon wires nothing by an exporter's name, and the window stages'
order is declared beside the pipeline, not assembled by the daemon."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIDECAR = ROOT / "sidecar"


def _module(file_name: str) -> Path:
    """The one module of that file name under ``sidecar/``, wherever the layout puts it."""
    found = sorted(SIDECAR.rglob(file_name))
    assert len(found) == 1, found
    return found[0]


def _calls(path: Path, name: str) -> list[int]:
    """Lines of ``path`` that call the builtin ``name``."""
    tree = ast.parse(path.read_text())
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name]


def _strings(path: Path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_ingest_and_the_pipeline_probe_nothing() -> None:
    for module in ("ingest.py", "pipeline.py", "daemon.py"):
        assert _calls(_module(module), "getattr") == [], module
        assert _calls(_module(module), "hasattr") == [], module


def test_the_daemon_wires_no_exporter_by_name_and_no_stage_order() -> None:
    daemon = _module("daemon.py")
    assert "wandb" not in _strings(daemon)
    assert "WindowStage" not in daemon.read_text()  # the order is pipeline.window_stages'
