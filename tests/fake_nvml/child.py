"""Run an ``NvmlSource`` in a fresh process and print what it saw as one JSON object.

For tests that need a process where NVML was never loaded (no library, the old-driver
variant through ``LD_LIBRARY_PATH``). Usage::

    python -m tests.fake_nvml.child [--library PATH] [--polls N] [--trainer JSON]
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import logging
import sys
import time
from typing import Any

from sidecar.sources.nvml import NvmlSource, probe_nvml
from sidecar.sources.nvml_cadence import SLOW_PERIODS_S


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[dict[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append({"logger": record.name, "level": record.levelname, "message": record.getMessage()})


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--library", default=None)
    parser.add_argument("--polls", type=int, default=4)
    parser.add_argument("--trainer", default="{}", help='JSON {"pid": ["role", "worker"]}')
    args = parser.parse_args()
    records = _Records()
    logging.getLogger().addHandler(records)
    logging.getLogger().setLevel(logging.DEBUG)

    probe = probe_nvml(args.library, timeout_s=5.0)
    # every value every poll through the cost-aware code, as the fixture's sources (fixtures.py)
    source = NvmlSource(interval_s=0.05, library_path=args.library, cpu_budget=1.0,
                        slow_periods_s=dict.fromkeys(SLOW_PERIODS_S, 0.05))
    source.set_trainer_processes({int(pid): (r, w) for pid, (r, w) in json.loads(args.trainer).items()})
    source.start()
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        status = source.status()
        if status.polls_total >= args.polls or status.state.value == "unavailable":
            break
        time.sleep(0.01)
    time.sleep(0.2)  # a permanently unavailable source must stay quiet: no further log lines
    report = {"probe": list(probe), "status": _plain(source.status()), "snapshot": _plain(source.latest())}
    source.shutdown()
    report["log"] = records.lines
    json.dump(report, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
