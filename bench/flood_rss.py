"""Flood figures (SPEC §7: peak RSS <= 600 MiB under any flood, backlog drained within 30 s):
N processes push frames at the size limit as fast as ZeroMQ takes them, ``--mib`` MiB each,
while one honest trainer publishes at 5,000 records/s through the real shim; then the honest
trainer's accounting is compared with the daemon's. Kinds: ``bloated`` (4096 bloated records a
frame, the slowest shape to decode), ``keys`` (about 60,000 new profile keys a frame, the
costliest to aggregate). The flood processes are the ones ``tests/test_abuse_flood.py`` uses
(``tests/soak/floods.py``).

    PYTHONPATH=. python bench/flood_rss.py [--flooders 16] [--mib 100] [--kind bloated|keys]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemon_harness import DaemonProc, wait_for  # noqa: E402
from tests.soak.floods import flood_process, frames_received  # noqa: E402
from tests.soak.procs import PublisherProc, Sampler, label_accounting  # noqa: E402
from trainer_shim import wire  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flooders", type=int, default=4)
    p.add_argument("--mib", type=int, default=200, help="MiB each flooder sends")
    p.add_argument("--kind", choices=("bloated", "keys"), default="bloated")
    args = p.parse_args()
    n = args.mib * 2**20 // wire.MAX_MESSAGE_BYTES
    with tempfile.TemporaryDirectory(prefix="dflash-flood-") as tmp:
        d = DaemonProc(Path(tmp))
        honest = PublisherProc(Path(tmp), {"endpoint": d.endpoint, "role": "honest", "name": "t", "threads": 1,
                                           "rate": 5000, "flush_interval_s": 0.1})
        try:
            before = frames_received(d)
            sampler = Sampler(d.proc.pid, period_s=0.02)
            start = time.monotonic()
            flooders = [flood_process(d.endpoint, args.kind, n) for _ in range(args.flooders)]
            for f in flooders:
                f.wait(600)
            sent_s = time.monotonic() - start
            wait_for(lambda: frames_received(d) >= before + args.flooders * n, timeout_s=300,
                     what="the backlog drained")
            drained_s = time.monotonic() - start
            channel = honest.stop()["channels"]["t-0"]
            samples = sampler.stop()
            alive = d.proc.poll() is None
            made = channel["records_total"]
            try:
                wait_for(lambda: label_accounting(d.samples()).get(("honest", "t-0"), {}).get("accepted") == made,
                         timeout_s=30, what="the honest trainer's records")
            except AssertionError:
                pass  # reported below
            entry = label_accounting(d.samples()).get(("honest", "t-0"), {"accepted": 0, "dropped": {}})
            exact = entry["accepted"] == made and not entry["dropped"] and not sum(channel["dropped"].values())
            refused = d.value("dflash_sidecar_messages_dropped_total", reason="over_share") or 0
        finally:
            honest.kill()
            d.stop()
    peak = max(rss for _, rss, _ in samples)
    print(f"{args.flooders} flooders x {n} '{args.kind}' frames of {wire.MAX_MESSAGE_BYTES / 2**20:.0f} MiB: peak "
          f"RSS {peak / 2**20:.0f} MiB; flooders done after {sent_s:.1f} s, backlog drained {drained_s - sent_s:.1f} s "
          f"later; {refused:.0f} frames dropped unread (over_share); daemon alive: {alive}; honest trainer (5,000 "
          f"records/s during the flood): {entry['accepted']:,} of {made:,} counted, exact: {exact} (daemon's drops "
          f"{entry['dropped']}, shim's {channel['dropped']})")
    return 0 if peak <= 600 * 2**20 and exact and alive else 1


if __name__ == "__main__":
    sys.exit(main())
