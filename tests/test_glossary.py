"""docs/ARCHITECTURE.md's glossary and the code name the same things: each word's code name exists,
the value its meaning states is the code's, and no stage declares a liveness cut-off of its own."""

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
    module, _, name = f"sidecar.{code}".rpartition(".")
    return getattr(importlib.import_module(module), name)


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
