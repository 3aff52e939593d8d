"""Coverage-guided fuzzing of decode -> accounting -> aggregation, CI form: ``bench/fuzz_decode.py``
(atheris/libFuzzer) for a fixed number of inputs. The long form runs it for minutes; the number of
inputs tried is recorded in ``bench/RESULTS_SOAK.md``. Complements the hypothesis test in
``test_fuzz.py``, which draws frames from a grammar rather than following coverage."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemon_harness import ROOT, env

RUNS = 100_000


@pytest.mark.timeout(300)
def test_coverage_guided_fuzzing_finds_no_crash(tmp_path: Path) -> None:
    try:
        import atheris  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("atheris is required in CI (test extra) but cannot be imported")
        pytest.skip("atheris not installed (pip install -e '.[test]')")
    corpus = tmp_path / "corpus"
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "fuzz_decode.py"), str(corpus),
                          f"-atheris_runs={RUNS}", "-seed=8", "-max_len=4096"],
                         capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=280)
    tail = out.stderr[-3000:]
    assert out.returncode == 0, tail
    done = re.search(r"Done (\d+) (?:runs )?in (\d+) second", out.stderr)
    assert done and int(done.group(1)) >= RUNS - 1, tail
    assert not list(tmp_path.glob("crash-*"))
    cov = re.findall(r"cov: (\d+)", out.stderr)
    assert cov and int(cov[-1]) > 150, tail  # it reached well into decode, accounting and aggregation
