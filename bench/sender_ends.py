"""Issue 33's case at the daemon's defaults: a forked child counting at 4,000 calls/s, SIGKILLed after
3 s. Per round: seconds from the kill to the daemon's log line and to the first scrape that shows
one ``unclean`` end for the role, what the child made, what the daemon counts for its role
(accepted + every drop reason) and the stated bound on what is unknown.

    PYTHONPATH=. python bench/sender_ends.py --rounds 5

The daemon runs with its default window (10 s) and ``sender_gone_after`` (5 s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemon_harness import DaemonProc  # noqa: E402
from tests.soak import ends  # noqa: E402


def one_round(d: DaemonProc, role: str) -> dict[str, float]:
    """Run the case once under ``role``; the timings and counts."""
    p = ends.start(d, "", role, ends.FORKED_COUNTER)
    r = ends.finish(p, role)
    killed = float(r.out["killed_unix_s"])
    told_scrape = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if ends.ends_of(d, role) == {"unclean": 1}:
            told_scrape = time.time() - killed
            break
        time.sleep(0.05)
    line = f"sender ended: {role}/0 pid {r.out['pid']} unclean"
    told_log = None
    for entry in d.log().splitlines():
        if line in entry:
            told_log = entry
            break
    time.sleep(2.5)
    counted, dropped = ends.losses(d, role)
    unknown = d.value("dflash_sidecar_sender_last_exit_unknown_records", role=role) or 0
    return {"told_scrape_s": told_scrape if told_scrape is not None else float("nan"), "log_line": bool(told_log),
            "made": r.made, "counted": counted, "unknown_bound": unknown, "made_minus_counted": r.made - counted,
            "ended_unclean": dropped.get("ended_unclean", 0), "ends": ends.ends_of(d, role)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        d = DaemonProc(Path(tmp), interval=None)
        try:
            results = [one_round(d, f"forked{i}") for i in range(args.rounds)]
        finally:
            d.stop()
    for r in results:
        print(json.dumps(r))
    told = [r["told_scrape_s"] for r in results]
    print(f"told (scrape) median {statistics.median(told):.1f} s, max {max(told):.1f} s; "
          f"made - counted median {statistics.median(r['made_minus_counted'] for r in results):.0f}, "
          f"max {max(r['made_minus_counted'] for r in results):.0f}; "
          f"load average {load[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
