"""What hostile clients cost the daemon: every flood of ``tests/soak/floods.py`` against one
daemon, RSS before / peak / after (the same code as ``tests/test_abuse_memory.py``).

    PYTHONPATH=. python bench/abuse_memory.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemon_harness import DaemonProc  # noqa: E402
from tests.soak.floods import run_all  # noqa: E402


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="dflash-abuse-") as tmp:
        d = DaemonProc(Path(tmp))
        try:
            results = run_all(d)
            dropped = {lab["reason"]: int(v) for lab, v in d.samples()["dflash_sidecar_messages_dropped_total"]}
        finally:
            d.stop()
    mb = 1e6
    print("| round | flood | frames | taken in (s) | RSS before | peak | after (MB) |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(f"| {r['round']} | {r['flood']} | {r['frames']:,} | {r['seconds']} | {r['rss_before'] / mb:.0f} | "
              f"{r['rss_peak'] / mb:.0f} | {r['rss_after'] / mb:.0f} |")
    print(f"\nmessages dropped by reason: {dropped}")
    return 0 if all(r["alive"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
