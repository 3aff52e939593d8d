"""``dflash-sidecar demo --bottleneck``: each word names the verdict it makes, the same in both
pipelines (``input`` the data loader, ``host`` host overhead in the plain loop); the DFlash
pipeline's old ``host`` (slow data loading) stays an alias of ``input`` for one release."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.cli import demo
from sidecar.cli.demo_loops import GENERIC_BOTTLENECKS
from tests.daemon_harness import env, free_port


def test_dflash_words_are_the_verdicts_and_host_is_an_alias(caplog: pytest.LogCaptureFixture) -> None:
    assert demo.dflash_bottleneck("input") == "input" and not caplog.records
    assert demo.PipelineTimings.for_bottleneck("input").data_ms > demo.PipelineTimings().data_ms
    with caplog.at_level(logging.WARNING, logger="sidecar"):
        assert demo.dflash_bottleneck("host") == "input"
    assert "--bottleneck host is now --bottleneck input" in caplog.text and "0.4" in caplog.text
    assert demo.dflash_bottleneck("comm") is None  # a plain loop's word only
    assert "host" not in demo.BOTTLENECKS and {"input", "host"} <= set(GENERIC_BOTTLENECKS)


def test_the_old_word_runs_the_data_loader_bottleneck(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "sidecar", "demo", "--bottleneck", "host", "--duration", "1",
                          "--no-gpu-metrics", "--interval", "0.5", "--endpoint", f"ipc://{tmp_path}/demo.sock",
                          "--prometheus-addr", f"127.0.0.1:{free_port()}"],
                         check=False, capture_output=True, text=True, timeout=120,
                         env=env(XDG_STATE_HOME=str(tmp_path)))
    assert out.returncode == 0, out.stderr
    assert "--bottleneck host is now --bottleneck input for the DFlash pipeline" in out.stderr, out.stderr
    assert "bottleneck=input" in out.stderr, out.stderr
