"""Flood figures (SPEC §7: peak RSS <= 600 MiB under any flood, backlog drained within 30 s):
N processes push frames at the size limit (4096 bloated records each, the slowest shape to
decode) as fast as ZeroMQ takes them, ``--mib`` MiB each; then one honest trainer publishes.
The flood processes are the ones ``tests/test_abuse_flood.py`` uses (``tests/soak/floods.py``).

    PYTHONPATH=. python bench/flood_rss.py [--flooders 4] [--mib 200]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemon_harness import DaemonProc, publish, wait_for  # noqa: E402
from tests.soak.floods import flood_process, frames_received  # noqa: E402
from tests.soak.procs import Sampler  # noqa: E402
from trainer_shim import wire  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flooders", type=int, default=4)
    p.add_argument("--mib", type=int, default=200, help="MiB each flooder sends")
    args = p.parse_args()
    n = args.mib * 2**20 // wire.MAX_MESSAGE_BYTES
    with tempfile.TemporaryDirectory(prefix="dflash-flood-") as tmp:
        d = DaemonProc(Path(tmp))
        try:
            before = frames_received(d)
            sampler = Sampler(d.proc.pid, period_s=0.02)
            start = time.monotonic()
            flooders = [flood_process(d.endpoint, "bloated", n) for _ in range(args.flooders)]
            for f in flooders:
                f.wait(600)
            sent_s = time.monotonic() - start
            wait_for(lambda: frames_received(d) >= before + args.flooders * n, timeout_s=300,
                     what="the backlog drained")
            drained_s = time.monotonic() - start
            samples = sampler.stop()
            res = publish(d.endpoint, "honest", "0", 300)
            wait_for(lambda: d.value("dflash_sidecar_records_accepted_total", role="honest") == res["records_total"],
                     what="the honest trainer's records")
            exact = d.value("dflash_sidecar_records_accepted_total", role="honest") == res["records_total"]
        finally:
            d.stop()
    peak = max(rss for _, rss, _ in samples)
    print(f"{args.flooders} flooders x {n} frames of {wire.MAX_MESSAGE_BYTES / 2**20:.0f} MiB: peak RSS "
          f"{peak / 2**20:.0f} MiB; flooders done after {sent_s:.1f} s, backlog drained {drained_s - sent_s:.1f} s "
          f"later ({args.flooders * n / drained_s:.0f} frames/s overall); honest trainer counted exactly: {exact}")
    return 0 if peak <= 600 * 2**20 and exact else 1


if __name__ == "__main__":
    sys.exit(main())
