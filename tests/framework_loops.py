"""A trainer that publishes a framework's own metrics dict (``tests/framework_fixtures.py``)
through the real shim, no config: ``python -m tests.framework_loops FRAMEWORK ENDPOINT CONTROL``.

Each step sleeps its data loading share and then the rest of ``STEP_S``; every ``LOG_FREQ``
steps it calls ``telemetry.publish(step, metrics)`` with the framework's dict of the means since
the last one, as the frameworks log. ``CONTROL`` is JSON the test rewrites: ``{"data": 0.7}``
(the data loading share) or ``{"stop": true}``."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

STEP_S = 0.05
LOG_FREQ = 2


def main(framework: str, endpoint: str, control: str) -> int:
    from tests.framework_fixtures import FIXTURES
    from trainer_shim import telemetry

    telemetry.configure(endpoint=endpoint, role="trainer", worker="0", flush_interval_s=0.05)
    fixture = FIXTURES[framework]
    state: dict[str, object] = {"data": 0.7}
    step = 0
    started = time.perf_counter()
    data_s = 0.0
    while True:
        try:
            state = json.loads(Path(control).read_text())
        except (OSError, ValueError):
            pass
        if state.get("stop"):
            break
        share = float(state.get("data", 0.7))  # type: ignore[arg-type]
        t0 = time.perf_counter()
        time.sleep(STEP_S * share)
        data_s += time.perf_counter() - t0
        time.sleep(STEP_S * (1.0 - share))
        step += 1
        if step % LOG_FREQ == 0:
            now = time.perf_counter()
            step_s = (now - started) / LOG_FREQ
            telemetry.publish(step, fixture(step_s, min(1.0, data_s / (now - started)), step))
            started, data_s = now, 0.0
    telemetry.flush(1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
