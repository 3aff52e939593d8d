"""Pytest fixtures shared by the shim's process-level tests: a short working directory, an ipc
endpoint in it, and real receiver processes stopped at teardown. A test module enables them with
``pytest_plugins = ["tests.shim_fixtures"]``."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.shim_helpers import ReceiverProcess


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A short directory: ipc paths must stay under ~100 bytes."""
    with tempfile.TemporaryDirectory(prefix="dfs-", dir="/tmp") as d:
        yield Path(d)


@pytest.fixture
def ep(workdir: Path) -> str:
    return f"ipc://{workdir}/sidecar.sock"


@pytest.fixture
def receivers(workdir: Path) -> Iterator[Callable[..., ReceiverProcess]]:
    """Factory: ``receivers(endpoint, stalled=False, name=None)`` starts a receiver process."""
    started: list[ReceiverProcess] = []

    def start(endpoint: str, stalled: bool = False, name: str | None = None) -> ReceiverProcess:
        rx = ReceiverProcess(endpoint, workdir / f"{name or len(started)}.frames", stalled=stalled)
        started.append(rx)
        return rx

    yield start
    for rx in started:
        rx.stop()
