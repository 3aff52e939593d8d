"""Test-session hygiene shared by every module."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

_EXPORTED = ("DFLASH_SIDECAR_ENDPOINT", "DFLASH_ROLE")

# A test run started in the background by a shell without job control (``cmd &`` in a script, a
# nohup'd CI step) inherits SIGINT ignored, and every child would too: Python then installs no
# KeyboardInterrupt handler, so the tests that stop a process with SIGINT (`top`, a trainer's
# Ctrl-C) or check what the shim leaves of Python's own handler would wait or read SIG_IGN.
# Children get the disposition a terminal gives them.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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
