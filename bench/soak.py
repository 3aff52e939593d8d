"""The soak, long form: the same code as ``tests/test_soak_load.py`` with a longer load phase.

    PYTHONPATH=. python bench/soak.py --duration 600 [--out bench/soak-result.json]

Prints every figure and the promises broken (exit status 1 if any). Results are recorded in
``bench/RESULTS_SOAK.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.soak.scenario import SoakConfig, failures, run_soak  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=600.0, help="load phase in seconds (default 600)")
    p.add_argument("--rate", type=float, default=60_000.0, help="records/s over all publishers")
    p.add_argument("--publishers", type=int, default=3)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--kills", type=int, default=None,
                   help="SIGKILL restarts (default: one per 60 s of load, at least 3)")
    p.add_argument("--terms", type=int, default=None, help="SIGTERM restarts (default: kills // 2, at least 1)")
    p.add_argument("--no-wandb", action="store_true")
    p.add_argument("--stall", type=float, default=30.0, help="seconds the W&B service stays SIGSTOPped (default 30)")
    p.add_argument("--out", type=Path, default=None, help="write the full result as JSON here")
    args = p.parse_args()
    kills = args.kills if args.kills is not None else max(3, int(args.duration // 60))
    terms = args.terms if args.terms is not None else max(1, kills // 2)
    ends = []
    for i in range(kills + terms):  # interleave: kill, term, kill, kill, term, ...
        ends.append("sigterm" if terms and (i % 3 == 1 or kills == 0) else "sigkill")
        if ends[-1] == "sigterm":
            terms -= 1
        else:
            kills -= 1
    cfg = SoakConfig(duration_s=args.duration, rate=args.rate, publishers=args.publishers, threads=args.threads,
                     ends=tuple(ends), wandb=not args.no_wandb, steady_fraction=0.5,
                     stall_s=args.stall)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dflash-soak-") as tmp:
        result = run_soak(Path(tmp), cfg, log=lambda m: print(m, flush=True))
    result["wall_s"] = time.monotonic() - started
    broken = failures(result)
    result["failures"] = broken
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("lives", "publishers")}, indent=1))
    for life in result["lives"]:
        rss = life["rss_bytes"]
        print(f"life {life['index']} ({life['end']}): {life['checked_calls']:,} calls checked, exact={life['exact']}, "
              f"losses {life['losses']}, RSS {min(rss, default=0) / 2**20:.1f}-{max(rss, default=0) / 2**20:.1f} MiB, "
              f"CPU {life['cpu_s']:.1f}s, faults {life['faults']}")
    print("FAILED: " + "; ".join(broken) if broken else "all promises kept")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
