"""docs/ARCHITECTURE.md's glossary and the code name the same things: each word's code name exists,
the value its meaning states is the code's, no stage declares a liveness cut-off of its own, and
"ledger" names the run ledger alone (never the tallies, their folder or their drop reason)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from sidecar.model import liveness

ROOT = Path(__file__).resolve().parent.parent


def glossary() -> dict[str, tuple[str, str]]:
    """word -> (meaning, code name), from the glossary's table."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("## Glossary", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([a-z ]+) \| (.+) \| `([\w.]+)` \|$", section, re.M)
    return {word: (meaning, code) for word, meaning, code in rows}


def resolve(code: str) -> object:
    """The object ``code`` names: under ``sidecar.`` (or ``trainer_shim.`` where it says so), a
    module's attribute, or an attribute of one (a class's method or field)."""
    parts = (code if code.startswith("trainer_shim.") else f"sidecar.{code}").split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            value = getattr(value, name)
        return value
    raise AssertionError(f"{code}: no such module")


def test_each_word_names_code_that_exists_and_states_its_value() -> None:
    words = glossary()
    assert words, "the glossary's table was not found"
    for word, (meaning, code) in words.items():
        value = resolve(code)
        if isinstance(value, float):
            assert f"{value:g} s" in meaning, (word, value, meaning)


def test_every_liveness_cut_off_is_in_the_glossary() -> None:
    cut_offs = {f"model.liveness.{n}" for n in vars(liveness) if n.isupper() and n.endswith("_S")}
    assert cut_offs == {code for _, code in glossary().values() if code.startswith("model.liveness.")}


def test_no_stage_declares_a_liveness_cut_off_of_its_own() -> None:
    """A module-level constant named like the policy's words (``*LIVE*``, ``*GONE*``, ``SENDER_TTL*``,
    ``*SENDING*``, ``*FORGET*``; a label pair's own time to live aside) lives in ``model/liveness.py`` only."""
    words = re.compile(r"LIVE|GONE|SENDER_TTL|SENDING|FORGET|EXIT_GRACE")
    found = []
    for path in sorted((ROOT / "sidecar").rglob("*.py")):
        if path.name == "liveness.py":
            continue
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            found += [f"{path.relative_to(ROOT)}:{t.id}" for t in targets
                      if isinstance(t, ast.Name) and t.id.isupper() and words.search(t.id)]
    assert found == []


TALLY_MODULES = ("sidecar/sources/tallies.py", "sidecar/aggregation/senders.py", "sidecar/core/ingest.py",
                 "sidecar/core/capture_request.py", "sidecar/cli/trace.py")
"""The daemon's modules that handle tallies; with the whole shim, they hold no run ledger."""


def _identifiers(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def test_ledger_means_the_run_ledger_alone() -> None:
    """No identifier of the shim or of the daemon's tally modules says "ledger"; no product code
    holds the old drop reason ``ledger_refused``; the old folder and file name ``.ledger`` only as
    the value of a constant named ``DEPRECATED_*`` (read for one release)."""
    paths = sorted((ROOT / "trainer_shim").rglob("*.py")) + [ROOT / m for m in TALLY_MODULES]
    found = [f"{p.relative_to(ROOT)}:{n}" for p in paths for n in sorted(_identifiers(ast.parse(p.read_text())))
             if "ledger" in n.lower()]
    for path in sorted((ROOT / "sidecar").rglob("*.py")) + sorted((ROOT / "trainer_shim").rglob("*.py")):
        tree = ast.parse(path.read_text())
        deprecated = {id(node.value) for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign))
                      and any(isinstance(t, ast.Name) and t.id.startswith("DEPRECATED_")
                              for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))}
        strings = [node for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]
        found += [f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}" for node in strings
                  if "ledger_refused" in node.value
                  or (node.value.startswith(".ledger") and id(node) not in deprecated)]
    assert found == []


def test_the_glossary_has_the_central_words() -> None:
    assert {"tally", "tally folder", "run ledger", "window", "report", "reconcile", "count", "charge", "book",
            "sender id", "sender view"} <= set(glossary())
