"""Shared helpers of the deploy tests (their own tests: ``tests/test_deploy_support.py``).

The ``test_deploy_*`` modules import it as ``tests.deploy_support``. Outside tools
(``promtool``, ``systemd-analyze``, ...) are looked up with ``require_tool``
(``tests.daemon_harness``): missing on a developer's box the test is skipped with the package to
install; missing under ``CI=true`` the test fails. Daemons start through the one launcher
(``tests.launcher.spawn_sidecar``), pages are read with its ``http_get``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from tests.daemon_harness import in_ci, require_tool
from tests.launcher import env, free_port, http_get, spawn_sidecar

__all__ = ["env", "free_port", "http_get", "in_ci", "require_tool", "spawn_sidecar"]  # re-exported for the deploy tests

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
PROMETHEUS_DIR = DEPLOY / "prometheus"
RULE_FILES = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
METRIC_NAMES_FILE = DEPLOY / "metric_names.txt"
DASHBOARD = DEPLOY / "grafana" / "dflash-sidecar.json"
UNITS = ("dflash-sidecar.service", "dflash-sidecar@.service")
"""The shipped systemd units (deploy/systemd)."""

SAMPLE_SUFFIXES = {"summary": ("", "_count", "_sum"), "histogram": ("_bucket", "_count", "_sum"),
                   "counter": ("",), "gauge": ("",), "untyped": ("",)}
"""Sample names of a family, by type, as suffixes of the name in its ``# TYPE`` line."""


# -- the wheel -----------------------------------------------------------------------------------


# -- tools ---------------------------------------------------------------------------------------

def run(cmd: list[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` capturing text output (stdout and stderr kept apart)."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)


def copy_project(src: Path) -> Path:
    """A copy of what a build of this checkout reads, in ``src`` (created); returns ``src``."""
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "dflash_sidecar_tap.pth"):
        shutil.copy(REPO / name, src)
    for package in ("sidecar", "trainer_shim"):
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    readme = REPO / "README.md"
    (src / "README.md").write_text(readme.read_text() if readme.exists() else "dflash-sidecar\n")
    return src


def build_project_wheel(dest: Path) -> Path:
    """A wheel of this checkout in ``dest``, built offline from a copy (the checkout stays
    untouched; setuptools without build isolation, dependencies left out)."""
    try:
        import setuptools  # noqa: F401  - the build backend, used without build isolation
    except ImportError:
        if in_ci():
            pytest.fail("setuptools is needed to build the wheel of this checkout")
        pytest.skip("setuptools is not installed")
    src = copy_project(dest / "src")
    result = run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                  "--wheel-dir", str(dest), str(src)], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    [built] = dest.glob("dflash_sidecar-*.whl")
    return built


def verify(systemd_analyze: str, *paths: Path) -> str:
    """What ``systemd-analyze verify`` says about ``paths`` (empty: nothing), with a non-zero exit noted."""
    result = run([systemd_analyze, "verify", *map(str, paths)], cwd=paths[0].parent)
    return (result.stdout + result.stderr).strip() + ("" if result.returncode == 0 else f"\n(exit {result.returncode})")


def stop(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process, then SIGKILL whatever is still there after 5 s."""
    procs = [p for p in procs if p.poll() is None]
    for p in procs:
        p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


# -- metric names --------------------------------------------------------------------------------

def load_metric_names(path: Path = METRIC_NAMES_FILE) -> dict[str, tuple[str, str]]:
    """``deploy/metric_names.txt`` as {family name: (type, source)}."""
    names: dict[str, tuple[str, str]] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        assert len(fields) == 3, f"{path}:{number}: expected 'name type source', got {line!r}"
        name, kind, source = fields
        assert kind in SAMPLE_SUFFIXES, f"{path}:{number}: unknown type {kind}"
        assert name not in names, f"{path}:{number}: {name} listed twice"
        names[name] = (kind, source)
    return names


def sample_names(families: Mapping[str, tuple[str, str]]) -> set[str]:
    """Every sample name the families can produce (a summary's ``_count`` and ``_sum`` too)."""
    return {name + suffix for name, (kind, _) in families.items() for suffix in SAMPLE_SUFFIXES[kind]}


def recorded_names(rule_files: Iterable[Path] = RULE_FILES) -> set[str]:
    import yaml

    names = set()
    for path in rule_files:
        for group in yaml.safe_load(path.read_text())["groups"]:
            names.update(rule["record"] for rule in group["rules"] if "record" in rule)
    return names


def known_series_names() -> set[str]:
    """What a PromQL expression in deploy/ may read: exported samples and recorded series."""
    return sample_names(load_metric_names()) | recorded_names()


def exposition_families(text: str) -> dict[str, str]:
    """{family name: type} from the ``# TYPE`` lines of a Prometheus text exposition."""
    return {m.group(1): m.group(2) for m in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE)}


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_NUMBER = re.compile(r"(?<![\w:])(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)")
_DURATION = re.compile(r"(?<![\w:])\d+(?:ms|s|m|h|d|w|y)(?![\w:])")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
             "offset", "atan2", "inf", "nan"}
GRAFANA_VARIABLE = re.compile(r"\$(?:\{[^}]*\}|\w+)")


def promql_metric_names(expr: str) -> set[str]:
    """The metric names an expression reads (a light tokenizer, enough for deploy/'s own PromQL).
    Raises ``ValueError`` for selectors it cannot check (``{__name__=...}``)."""
    if "__name__" in expr:
        raise ValueError(f"name matchers are not checkable, spell the metric out: {expr}")
    s = GRAFANA_VARIABLE.sub("5m", expr)
    s = _STRING.sub('""', s)
    s = re.sub(r"\{[^{}]*\}", " ", s)          # label matchers
    s = re.sub(r"\[[^\[\]]*\]", " ", s)        # ranges and subqueries
    s = re.sub(r"@\s*\S+", " ", s)             # @ modifiers
    s = re.sub(r"\boffset\s+-?\S+", " ", s)
    previous = None
    while previous != s:                       # label lists, possibly after an aggregation's body
        previous, s = s, _LABEL_LIST.sub(" ", s)
    s = _DURATION.sub(" ", s)
    s = _NUMBER.sub(" ", s)
    names = set()
    for m in _IDENT.finditer(s):
        word = m.group(0)
        if word.lower() in _KEYWORDS or s[m.end():].lstrip().startswith("("):
            continue  # a keyword or a function/aggregation call
        names.add(word)
    return names
