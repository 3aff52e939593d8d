"""Pytest fixtures for the fake NVML driver. Import the ones a test module uses::

    from fake_nvml.fixtures import fake_nvml, fake_nvml_library, nvml_source  # noqa: F401

In-process tests load the "full" variant into the test process: pynvml keeps the first
library it loads for the life of the process, so variants and "no library" run in a child
process (``run_child``). Without ``$FAKE_NVML_CONTROL`` the fake answers nvmlInit with
NVML_ERROR_LIBRARY_NOT_FOUND, so later tests in the same process see a host without NVML.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from fake_nvml.build import FakeNvmlUnavailable, Variant, build_fake_nvml
from fake_nvml.control import FakeNvml

TESTS_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = TESTS_DIR.parent
T = TypeVar("T")


def library_or_skip(variant: Variant = "full") -> Path:
    """Build the fake driver; skip the test if gcc or nvml.h is missing (fail under CI=true)."""
    try:
        return build_fake_nvml(variant)
    except FakeNvmlUnavailable as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"fake NVML driver cannot be built: {exc} (CI=true: install gcc and nvidia-nvml-dev)")
        pytest.skip(f"fake NVML driver cannot be built: {exc}")


@pytest.fixture(scope="session")
def fake_nvml_library() -> Path:
    """Path of the full fake ``libnvidia-ml.so.1``."""
    return library_or_skip("full")


@pytest.fixture
def fake_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_nvml_library: Path) -> FakeNvml:
    """A control file for this test (2 GPUs unless the test says otherwise), wired via the env."""
    control = FakeNvml(tmp_path / "nvml-control.txt", fake_nvml_library, {"devices": 2})
    monkeypatch.setenv("FAKE_NVML_CONTROL", str(control.path))
    return control


@pytest.fixture
def nvml_source(fake_nvml: FakeNvml) -> Iterator[Callable[..., Any]]:
    """Factory: ``nvml_source(**kwargs)`` starts an ``NvmlSource`` on the fake (interval 0.05 s).

    Every source is shut down at teardown, and the test waits for poller threads that were
    left in a hanging fake call, so they cannot spill into the next test.
    """
    from sidecar.sources.nvml import NvmlSource

    sources: list[NvmlSource] = []

    def make(**kwargs: Any) -> NvmlSource:
        kwargs.setdefault("interval_s", 0.05)
        kwargs.setdefault("library_path", str(fake_nvml.library))
        source = NvmlSource(**kwargs)
        sources.append(source)
        source.start()
        return source

    yield make
    for source in sources:
        source.shutdown(timeout_s=5.0)
    deadline = time.monotonic() + 10.0
    while any(t.name == "nvml-poller" and t.is_alive() for t in threading.enumerate()):
        assert time.monotonic() < deadline, "an NVML poller thread did not finish"
        time.sleep(0.02)


def wait_until(predicate: Callable[[], T], timeout_s: float = 5.0, what: str = "condition") -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


def run_child(env: dict[str, str], *args: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """Run ``fake_nvml.child`` in a fresh interpreter and return its JSON report."""
    child_env = {k: v for k, v in os.environ.items() if k not in ("FAKE_NVML_CONTROL", "LD_LIBRARY_PATH")}
    child_env.update(env)
    child_env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(TESTS_DIR)])
    result = subprocess.run([sys.executable, "-m", "fake_nvml.child", *args], cwd=REPO_ROOT, env=child_env,
                            capture_output=True, text=True, timeout=timeout_s, check=False)
    assert result.returncode == 0, f"child failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return json.loads(result.stdout)
