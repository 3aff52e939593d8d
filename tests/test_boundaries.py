"""The layout's rules, one test each, read from the import statements (an AST walk, not a grep):
model underneath; sources -> processing -> aggregation -> exporters; the core wires and runs them;
the CLI on top, imported by nothing; one door per outside library."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("sidecar", "trainer_shim")


def modules(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@cache
def imported(path: Path) -> frozenset[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved), including
    ``importlib.import_module("name")`` with a literal name and imports inside functions."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # "from pkg import module"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value)
    return frozenset(names)


def importers(library: str, *folders: str) -> list[str]:
    return [rel(p) for p in modules(*folders)
            if any(name == library or name.startswith(library + ".") for name in imported(p))]


def test_the_shim_never_imports_the_daemon() -> None:
    assert importers("sidecar", "trainer_shim") == []


def test_exporters_never_import_sources() -> None:
    assert importers("sidecar.sources", "sidecar/exporters") == []


def test_model_imports_nothing_else_from_sidecar() -> None:
    offenders = {rel(p): sorted(n for n in imported(p) if n.startswith("sidecar") and not n.startswith("sidecar.model"))
                 for p in modules("sidecar/model")}
    assert {k: v for k, v in offenders.items() if v} == {}


@pytest.mark.parametrize("library, door", [
    ("pynvml", ["sidecar/sources/nvml_driver.py"]),
    ("wandb", ["sidecar/exporters/wandb/exporter.py"]),
    ("zmq", ["sidecar/sources/receiver.py", "trainer_shim/transport.py"]),  # the receiver and the shim's transport
])
def test_each_outside_library_has_one_door(library: str, door: list[str]) -> None:
    assert importers(library, *PRODUCT) == door


def test_pynvml_stays_behind_its_door_in_bench_too() -> None:
    assert importers("pynvml", "bench") == []


def _exits_or_parses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
            if name in ("parse_args", "parse_known_args", "parse_intermixed_args") or (
                    name == "exit" and owner in ("sys", "")) or (name == "_exit" and owner == "os") or (
                    name in ("quit", "SystemExit") and not owner):
                found.append(f"{rel(path)}:{node.lineno} {owner + '.' if owner else ''}{name}")
        elif isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id == "SystemExit":
                found.append(f"{rel(path)}:{node.lineno} raise SystemExit")
    return found


def test_only_the_cli_parses_arguments_or_exits() -> None:
    """One module parses arguments and turns statuses into exits: the CLI's ``main`` (with
    ``python -m sidecar``); every command returns its status to it."""
    cli = {"sidecar/cli/main.py", "sidecar/__main__.py"}
    found = [f for p in modules(*PRODUCT) if rel(p) not in cli for f in _exits_or_parses(p)]
    assert found == []
    assert _exits_or_parses(ROOT / "sidecar" / "cli" / "main.py")  # the check sees what it looks for


@pytest.mark.parametrize("module", ["sidecar.exporters.prometheus.exporter", "sidecar.exporters.wandb.exporter",
                                    "sidecar.exporters.console", "sidecar.aggregation.insight", "sidecar.model.window"])
def test_stages_load_no_transport_and_no_outside_service(module: str) -> None:
    """Importing an exporter or the insight loads neither ZeroMQ (the receiver's) nor wandb nor pynvml."""
    code = f"import sys, {module}; print(sorted(m for m in ('zmq', 'wandb', 'pynvml') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, check=True)
    assert out.stdout.strip() == "[]", out


def test_tests_never_load_bench_code() -> None:
    """Benchmarks may reuse the tests' support modules (the fake NVML driver, the daemon harness,
    the soak scenario); tests never depend on a benchmark, by import or by loading its file."""
    bench_modules = {p.stem for p in modules("bench")}
    offenders = []
    for path in modules("tests"):
        names = imported(path)
        tree = ast.parse(path.read_text(), str(path))
        loads = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                 and n.func.attr in ("spec_from_file_location", "run_path")]
        if loads or any(n.split(".")[0] in bench_modules | {"bench"} for n in names):
            offenders.append(rel(path))
    assert offenders == []


def test_no_test_module_doubles_as_a_library() -> None:
    users = [rel(p) for p in modules("tests", "bench")
             if any(n.split(".")[-1].startswith("test_") and n.startswith("tests.") for n in imported(p))]
    assert users == []


def test_aggregation_never_imports_sources_or_exporters() -> None:
    assert importers("sidecar.sources", "sidecar/aggregation") == []
    assert importers("sidecar.exporters", "sidecar/aggregation") == []


def test_every_folder_of_code_is_a_package_the_build_finds() -> None:
    """A folder without ``__init__.py`` imports as a namespace package from a checkout but is left
    out of the wheel (``setuptools.packages.find``): the installed daemon would miss it."""
    from setuptools import find_packages

    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in modules(*PRODUCT)}
    assert folders - set(find_packages(str(ROOT), include=["trainer_shim*", "sidecar*"])) == set()


STAGES = ("sources", "processing", "aggregation", "exporters")
"""In the order a record goes through them; ``sidecar.core.pipeline`` wires them, in that order."""
SHARED_HELPERS = ("sidecar.model",)
"""What a stage may import from the daemon besides its own package."""
PACKAGES = ("model", *STAGES, "core", "cli")
"""``sidecar``'s packages, lowest first: the types, the stages, the core that wires and runs them
(lifecycle, ingest thread, pipeline, configuration), every command."""
TOP_LEVEL = ("__init__.py", "__main__.py")
"""The only modules at ``sidecar``'s top level: the package and ``python -m sidecar``."""


def test_the_top_level_holds_the_entry_point_and_the_packages_only() -> None:
    entries = {p.name for p in (ROOT / "sidecar").iterdir() if p.name != "__pycache__"}
    assert entries == {*TOP_LEVEL, *PACKAGES}
    assert all((ROOT / "sidecar" / package / "__init__.py").is_file() for package in PACKAGES)


def test_nothing_but_the_entry_point_imports_the_cli() -> None:
    """The commands sit on top: the core, the stages and the shim never import one."""
    outside = [rel(p) for p in modules(*PRODUCT) if not rel(p).startswith("sidecar/cli/")]
    assert [f for f in outside if f in importers("sidecar.cli", *PRODUCT)] == ["sidecar/__main__.py"]


def test_only_the_core_and_the_cli_import_the_core() -> None:
    assert importers("sidecar.core", "sidecar/model", *(f"sidecar/{stage}" for stage in STAGES)) == []


def _sidecar_imports(path: Path) -> set[str]:
    return {n for n in imported(path) if n == "sidecar" or n.startswith("sidecar.")}


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_never_calls_another_stage_only_the_pipeline_wires_them(stage: str) -> None:
    """No stage imports another: not a later one (a callback forward) and not an earlier one (a
    record going back, e.g. aggregation calling the mapping stage). They meet in ``sidecar.model``
    types, passed along by ``sidecar.core.pipeline``."""
    own = f"sidecar.{stage}"
    offenders = {rel(p): sorted(n for n in _sidecar_imports(p)
                                if n != "sidecar" and not n.startswith((own + ".", *SHARED_HELPERS)) and n != own)
                 for p in modules(f"sidecar/{stage}")}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_aggregation_never_imports_processing() -> None:
    assert importers("sidecar.processing", "sidecar/aggregation") == []


def test_the_pipeline_is_where_the_stages_meet() -> None:
    """The check above sees imports of stages: the pipeline's own are found."""
    found = {n.split(".")[1] for n in _sidecar_imports(ROOT / "sidecar" / "core" / "pipeline.py") if n.count(".") >= 1}
    assert set(STAGES) - {"exporters"} <= found  # exporters are handed in as listeners


def test_the_prometheus_exporter_takes_no_callbacks_beyond_the_live_state() -> None:
    """Everything a scrape reads besides the window comes through ``ScrapeState``: neither the
    exporter nor the state it renders takes a function from the daemon (``http``, the server's own
    counters, is set by the exporter's own server)."""
    import typing

    from sidecar.exporters.prometheus.collector import ExportState
    from sidecar.exporters.prometheus.exporter import PrometheusExporter

    def callables(hints: dict[str, object]) -> set[str]:
        return {name for name, hint in hints.items() if "Callable" in str(hint) or "callable" in str(hint)}

    assert callables(typing.get_type_hints(PrometheusExporter.__init__)) == set()
    assert callables(typing.get_type_hints(ExportState)) == {"http"}
    assert "scrape_state" in typing.get_type_hints(PrometheusExporter.__init__)


def test_the_daemon_keeps_only_the_lifecycle() -> None:
    from sidecar.core.daemon import Daemon

    public = {name for name in vars(Daemon) if not name.startswith("_") and callable(vars(Daemon)[name])}
    assert public == {"start", "run", "stop", "reload", "shutdown"}
    assert not {name for name in vars(Daemon) if "window" in name or "hello" in name}


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def import_cycles(*folders: str) -> list[list[str]]:
    """Each group of modules that import one another in a circle (directly or through others),
    counting every import: at module level, inside a function, under ``TYPE_CHECKING``."""
    paths = {_module_name(p): p for p in modules(*folders)}
    graph = {m: sorted(n for n in imported(p) if n in paths and n != m) for m, p in paths.items()}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str) -> None:  # Tarjan's strongly connected components
        order[m] = low[m] = len(order)
        stack.append(m)
        for n in graph[m]:
            if n not in order:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], order[n])
        if low[m] == order[m]:
            group = [stack.pop()]
            while group[-1] != m:
                group.append(stack.pop())
            if len(group) > 1:
                cycles.append(sorted(group))

    for m in graph:
        if m not in order:
            visit(m)
    return sorted(cycles)


def test_no_import_cycles() -> None:
    assert import_cycles(*PRODUCT) == []


def _top_level_imports(path: Path) -> set[str]:
    """The modules ``path`` imports when it is loaded (its module-level statements only)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
    return names


def test_what_the_pth_file_loads_is_the_standard_library_only() -> None:
    """``tap_import`` is loaded at every interpreter start where ``DFLASH_SIDECAR_TAP`` is set: it
    and its import hook load the standard library and each other only (the taps themselves are
    imported once a tapped library is, inside a function)."""
    hook, env = "trainer_shim.integrations.post_import", "trainer_shim.integrations.tap_import"
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    loaded = {m: {n for n in _top_level_imports(ROOT / (m.replace(".", "/") + ".py"))
                  if n.split(".")[0] not in allowed} for m in (hook, env)}
    assert loaded == {hook: set(), env: {hook}}


def test_no_listener_is_found_by_its_name(tmp_path: Path) -> None:
    """A listener's ``name`` is for the logs: the daemon wires every provider the scrape state
    reads by its own parameter. Every listener renamed, a scrape renders the same families (the
    W&B exporter's statistics included)."""
    from sidecar.core.config import Config
    from sidecar.core.daemon import Daemon
    from sidecar.exporters.prometheus.collector import SidecarCollector

    daemon = Daemon(Config(state_dir=str(tmp_path), wandb_run="r", gpu_metrics=False), host="box")

    def families() -> list[str]:
        return sorted(family.name for family in SidecarCollector(daemon.prometheus.state).collect())

    before = families()
    assert "dflash_sidecar_wandb_queue_depth" in before  # the check sees what it looks for
    for i, listener in enumerate(daemon.pipeline.listeners):
        listener.name = f"renamed {i}"
    assert families() == before


def test_ingest_and_admin_read_no_stage_past_the_pipeline() -> None:
    """The ingest loop decides when, the admin side serves the latest window: neither reaches
    through the pipeline into a stage's state (``pipeline.aggregator.latest_step``, the GPUs'
    ``facts()``); they call the pipeline and read what the window hands on."""
    stages = {"aggregator", "registry", "gpus", "_gpus", "ends", "mapper"}
    found = []
    for name in ("ingest.py", "admin.py"):
        path = ROOT / "sidecar" / "core" / name
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            through = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                and node.value.attr in stages
            called = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("facts", "latest_step")
            if through or called:
                found.append(f"{rel(path)}:{node.lineno}")
    assert found == []


MAX_FUNCTION_LINES = 60
LONG_FUNCTIONS_TO_SPLIT: set[str] = set()
"""Functions over ``MAX_FUNCTION_LINES`` lines left to split; nothing may join this list."""


def long_functions(*folders: str) -> dict[str, int]:
    """``path:function`` -> lines, for each function (or method) over ``MAX_FUNCTION_LINES`` lines,
    decorators excluded, docstring and nested functions included."""
    found = {}
    for path in modules(*folders):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found[f"{rel(path)}:{node.name}"] = lines
    return found


def test_no_function_over_60_lines() -> None:
    assert set(long_functions(*PRODUCT)) == LONG_FUNCTIONS_TO_SPLIT


ANY_CEILING = 451
"""``Any`` in the product code (each use of the name, imports aside): 542 before the ledger's fold
was typed and the publisher split, 453 after. Lower it as code is typed; never raise it."""


def any_in(source: str) -> int:
    """Each ``Any`` ``source`` names (``Any`` or ``typing.Any``; the import itself is no use)."""
    return sum(1 for node in ast.walk(ast.parse(source))
               if (isinstance(node, ast.Name) and node.id == "Any")
               or (isinstance(node, ast.Attribute) and node.attr == "Any"))


def test_any_stays_where_a_foreign_type_is_unknown_and_its_count_only_falls() -> None:
    assert sum(any_in(p.read_text()) for p in modules(*PRODUCT)) <= ANY_CEILING


def test_the_any_count_sees_both_spellings_and_not_the_import() -> None:
    assert any_in("import typing\nfrom typing import Any\nx: Any = 1\ny: typing.Any = 2\n") == 2


ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"


def _named_in_architecture() -> list[str]:
    return re.findall(r"`([^`\s]+)`", ARCHITECTURE.read_text())


def test_every_path_the_architecture_names_exists() -> None:
    """A path in ``docs/ARCHITECTURE.md`` is under ``sidecar/`` (or the repository's root)."""
    paths = [n for n in _named_in_architecture() if "/" in n and n.endswith((".py", "/"))]
    assert paths  # the check sees what it looks for
    assert [n for n in paths if not (ROOT / "sidecar" / n).exists() and not (ROOT / n).exists()] == []


def test_every_module_the_architecture_names_exists() -> None:
    """``package.module.Name`` (under ``sidecar``): the module imports and has the name."""
    dotted = [n for n in _named_in_architecture() if re.fullmatch(rf"(?:{'|'.join(PACKAGES)})(?:\.\w+)+", n)]
    assert dotted
    missing = []
    for name in dotted:
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):  # the longest prefix that is a module, then attributes
            try:
                found: object = importlib.import_module(".".join(["sidecar", *parts[:cut]]))
            except ModuleNotFoundError:
                continue
            for attr in parts[cut:]:
                found = getattr(found, attr, None)
            break
        if found is None:
            missing.append(name)
    assert missing == []


def test_the_architecture_maps_every_package_and_every_module_of_the_core_and_the_cli() -> None:
    named = set(_named_in_architecture())
    assert {f"{package}/" for package in PACKAGES} - named == set()
    modules_of = [f"{package}/{p.name}" for package in ("core", "cli")
                  for p in (ROOT / "sidecar" / package).glob("*.py") if p.name != "__init__.py"]
    assert set(modules_of) - named == set()


STAGE_OBJECTS = {"registry": "aggregation", "aggregator": "aggregation", "ends": "aggregation",
                 "mapper": "processing", "receiver": "sources", "tallies": "sources"}
"""The stages' objects the core holds (as ``self.<name>`` or a local of that name)."""
FOREIGN_PRIVATE = {"sidecar/cli/main.py": {"_actions"}}
"""Private names of an outside library read where it has no public way (argparse's actions)."""
STAGE_FIELDS_CORE_READS = {("receiver", "backlog"), ("receiver", "endpoints")}
"""Data (not a call) the core reads of a stage's object: what the receiver says of its queue and
its endpoints. Everything else a stage hands the core is a call's return value."""


def _defined_names(tree: ast.AST) -> set[str]:
    """Names a module defines: its functions, classes and their attributes (``self.x = ...``,
    class-level fields), its top-level names: what a ``_private`` access may name there."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
    return names


def private_reaches(*folders: str) -> list[str]:
    """``x._name`` (one underscore) where ``x`` is not ``self``/``cls`` and the module defines no
    ``_name``: a reach into another module's private state (or a private helper of another
    module's object)."""
    found = []
    for path in modules(*folders):
        tree = ast.parse(path.read_text(), str(path))
        own = _defined_names(tree) | FOREIGN_PRIVATE.get(rel(path), set())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            name = node.attr
            if not name.startswith("_") or name.startswith("__") or name in own:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            found.append(f"{rel(path)}:{node.lineno} .{name}")
    return found


def _stage_root(node: ast.expr) -> str | None:
    """The stage object an expression starts from: ``self.registry`` or a local ``registry``."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr if node.attr in STAGE_OBJECTS else None
    if isinstance(node, ast.Name):
        return node.id if node.id in STAGE_OBJECTS else None
    return None


def core_reaches(*folders: str) -> list[str]:
    """In the core: a stage object's attribute read as data rather than called (``registry.totals``,
    ``receiver.peers``, ``receiver.shares.charge(...)``), beyond ``STAGE_FIELDS_CORE_READS``; and
    any write to an attribute of an object other than ``self`` (``self.tallies.malformed = 0``)."""
    found = []
    for path in modules(*folders):
        tree = ast.parse(path.read_text(), str(path))
        called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            where = f"{rel(path)}:{node.lineno}"
            if isinstance(node.ctx, ast.Store | ast.Del):
                if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                    found.append(f"{where} writes {ast.unparse(node)}")
                continue
            root = _stage_root(node.value)
            if root is not None and id(node) not in called and (root, node.attr) not in STAGE_FIELDS_CORE_READS:
                found.append(f"{where} reads {ast.unparse(node)}")
    return found


def test_no_module_reaches_into_another_modules_private_state() -> None:
    """A stage hands what the next needs as a value or a public call: nothing reads or calls
    another module's ``_private`` names."""
    assert private_reaches("sidecar") == []


def test_the_core_calls_the_stages_and_writes_only_its_own_state() -> None:
    """The pipeline and the ingest loop take what a stage hands back (a call's value); they read
    no stage's fields (beyond the receiver's ``backlog`` and ``endpoints``) and write into no
    other object."""
    assert core_reaches("sidecar/core") == []


def test_the_reach_checks_see_what_they_look_for(tmp_path: Path) -> None:
    """The old side doors, written out: each check finds them."""
    global ROOT
    core = tmp_path / "sidecar" / "core"
    core.mkdir(parents=True)
    (core / "old.py").write_text(
        "def run(self, frames, state):\n"
        "    peers = self.receiver.peers\n"
        "    self.receiver.shares.charge(peers[0], 0.1, 10)\n"
        "    self.tallies.malformed = 0\n"
        "    registry = self.registry\n"
        "    return registry.totals, self.aggregator.profile_entries_rejected, state.table._owner\n")
    saved, ROOT = ROOT, tmp_path
    try:
        assert len(core_reaches("sidecar/core")) == 5
        assert private_reaches("sidecar") == ["sidecar/core/old.py:6 ._owner"]
    finally:
        ROOT = saved
