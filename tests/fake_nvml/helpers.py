"""Helpers for tests that use the fake NVML driver (plain functions; fixtures are in ``fixtures.py``)."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests import waiting

from .build import FakeNvmlUnavailable, Variant, build_fake_nvml

TESTS_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = TESTS_DIR.parent
T = TypeVar("T")


def real_nvml_present() -> bool:
    """Whether this host has a real NVML library (``libnvidia-ml.so.1``) that would be loaded
    before the fake one."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def library_or_skip(variant: Variant = "full") -> Path:
    """Build the fake driver; skip the test if gcc or nvml.h is missing (fail under CI=true)."""
    try:
        return build_fake_nvml(variant)
    except FakeNvmlUnavailable as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"fake NVML driver cannot be built: {exc} (CI=true: install gcc and nvidia-nvml-dev)")
        pytest.skip(f"fake NVML driver cannot be built: {exc}")


def wait_until(predicate: Callable[[], T], timeout_s: float = 5.0, what: str = "condition") -> T:
    """``tests.waiting.wait_until`` polling every 10 ms."""
    return waiting.wait_until(predicate, timeout_s, 0.01, what)


def run_child(env: dict[str, str], *args: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """Run ``tests.fake_nvml.child`` in a fresh interpreter and return its JSON report."""
    child_env = {k: v for k, v in os.environ.items() if k not in ("FAKE_NVML_CONTROL", "LD_LIBRARY_PATH")}
    child_env.update(env)
    child_env["PYTHONPATH"] = str(REPO_ROOT)
    result = subprocess.run([sys.executable, "-m", "tests.fake_nvml.child", *args], cwd=REPO_ROOT, env=child_env,
                            capture_output=True, text=True, timeout=timeout_s, check=False)
    assert result.returncode == 0, f"child failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return json.loads(result.stdout)


class _Collector:
    def __init__(self, build: Callable[[], list[Any]]) -> None:
        self._build = build

    def collect(self) -> Any:
        yield from self._build()


def registry_of(build: Callable[[], list[Any]]) -> Any:
    """A fresh ``CollectorRegistry`` whose one collector yields ``build()``'s metric families."""
    from prometheus_client.core import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(build))
    return registry


def promtool_check(exposition: bytes) -> None:
    """``promtool check metrics`` reports nothing on ``exposition`` (skipped without promtool,
    failed under CI=true)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("promtool is not installed (CI=true)")
        pytest.skip("promtool is not installed")
    result = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, check=False)
    assert result.returncode == 0 and not result.stdout and not result.stderr, (
        result.stdout.decode() + result.stderr.decode())
