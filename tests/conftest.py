"""Test-session hygiene shared by every module."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

_EXPORTED = ("DFLASH_SIDECAR_ENDPOINT", "DFLASH_ROLE")


@pytest.fixture(autouse=True)
def _restore_exported_environment() -> Iterator[None]:
    """``telemetry.configure()`` writes its endpoint and role into ``os.environ`` for the
    trainer's children; a test's endpoint must not leak into the daemons and scripts that later
    tests start with ``os.environ``."""
    saved = {k: os.environ.get(k) for k in _EXPORTED}
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
