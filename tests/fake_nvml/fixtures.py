"""Pytest fixtures for the fake NVML driver. A test module enables them with::

    pytest_plugins = ["tests.fake_nvml.fixtures"]

In-process tests load the "full" variant into the test process: pynvml keeps the first
library it loads for the life of the process, so variants and "no library" run in a child
process (``helpers.run_child``). Without ``$FAKE_NVML_CONTROL`` the fake answers
nvmlInit with NVML_ERROR_LIBRARY_NOT_FOUND, so later tests in the same process see a host
without NVML.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .control import FakeNvml
from .helpers import library_or_skip


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

    Unless the test says otherwise, the slow groups' periods are the interval and the budget a
    whole core: the cost-aware poller then reads every value every poll, so a test of values
    sees each change at the next poll (tests/test_nvml_cadence.py tests the cadences).

    Every source is shut down at teardown, and the test waits for poller threads that were
    left in a hanging fake call, so they cannot spill into the next test.
    """
    from sidecar.sources.nvml import NvmlSource
    from sidecar.sources.nvml_cadence import SLOW_PERIODS_S

    sources: list[NvmlSource] = []

    def make(**kwargs: Any) -> NvmlSource:
        kwargs.setdefault("interval_s", 0.05)
        kwargs.setdefault("slow_periods_s", dict.fromkeys(SLOW_PERIODS_S, kwargs["interval_s"]))
        kwargs.setdefault("cpu_budget", 1.0)
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
