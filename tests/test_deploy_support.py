"""Shared helpers of the deploy tests (and the tests of those helpers).

The other ``test_deploy_*`` modules import it as ``tests.test_deploy_support``. Outside tools
(``promtool``, ``systemd-analyze``, ...) are looked up with ``require_tool``: missing on a
developer's box the test is skipped with the package to install; missing under ``CI=true`` the
test fails.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
PROMETHEUS_DIR = DEPLOY / "prometheus"
RULE_FILES = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
METRIC_NAMES_FILE = DEPLOY / "metric_names.txt"
DASHBOARD = DEPLOY / "grafana" / "dflash-sidecar.json"

SAMPLE_SUFFIXES = {"summary": ("", "_count", "_sum"), "histogram": ("_bucket", "_count", "_sum"),
                   "counter": ("",), "gauge": ("",), "untyped": ("",)}
"""Sample names of a family, by type, as suffixes of the name in its ``# TYPE`` line."""


# -- tools ---------------------------------------------------------------------------------------

def in_ci(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get("CI", "").lower() == "true"


def require_tool(name: str, package: str) -> str:
    """The path of ``name``; skips the test when it is missing, or fails it under ``CI=true``."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (Debian package: {package})"
        if in_ci():
            pytest.fail(f"{message}; CI must install it")
        pytest.skip(message)
    return path


def run(cmd: list[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` capturing text output (stdout and stderr kept apart)."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def python_env() -> dict[str, str]:
    """Environment for a subprocess that must import this checkout's ``sidecar``/``trainer_shim``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("DFLASH_SIDECAR_ENDPOINT", None)
    return env


def start_daemon(args: list[str], log: Path, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``python -m sidecar ARGS`` from this checkout, stdout/stderr to ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "sidecar", *args], stdout=out, stderr=subprocess.STDOUT,
                                env={**python_env(), **(extra_env or {})}, cwd=log.parent)


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


def http_get(url: str, timeout: float = 2.0) -> str | None:
    """The body of ``url``, or None while it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.read().decode()
    except OSError:
        return None


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


# -- tests of the helpers ------------------------------------------------------------------------

@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (host, role) (rate(dflash_sidecar_records_accepted_total{role="x", job=~"a|b"}[5m]))',
     {"dflash_sidecar_records_accepted_total"}),
    ("host:x:rate5m / (host:x:rate5m + host:y:rate5m)", {"host:x:rate5m", "host:y:rate5m"}),
    ("a == 0 and b > 0 and on (host) group_left(role) c > 0.5e-3", {"a", "b", "c"}),
    ("sum(a) by (host) > bool 1 unless ignoring(gpu) b offset 5m", {"a", "b"}),
    ('max by (host) (avg_over_time(q[$__rate_interval])) < 0.1 and on (host) min(g{host=~"$host"}) < 1e-12',
     {"q", "g"}),
    ('time() - max by (host, role, worker) (last_seen)', {"last_seen"}),
    ('label_replace(up{job="x"}, "node", "$1", "instance", "(.*):.*")', {"up"}),
    ('changes(s[1h]) + abs(t - 0.0625) < bool 1e-12', {"s", "t"}),
])
def test_promql_metric_names(expr: str, names: set[str]) -> None:
    assert promql_metric_names(expr) == names


def test_promql_metric_names_refuses_name_matchers() -> None:
    with pytest.raises(ValueError):
        promql_metric_names('{__name__=~"dflash_.+"}')


def test_metric_names_file_is_well_formed() -> None:
    names = load_metric_names()
    assert all(source in {"daemon", "trainer", "nvml", "insight", "wandb", "prometheus"}
               for _, source in names.values())
    for name, (kind, _) in names.items():
        assert re.fullmatch(r"[a-z_:][a-z0-9_:]*", name), name
        assert name == "up" or name.startswith("dflash_"), f"{name}: not a dflash_ name"
        assert (kind == "counter") == name.endswith("_total"), f"{name}: counters and only counters end in _total"


def test_require_tool_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must install it"):
        require_tool("no-such-tool-dflash", "nothing")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="Debian package: nothing"):
        require_tool("no-such-tool-dflash", "nothing")
