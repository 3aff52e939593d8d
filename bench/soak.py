"""The soak, long form: the same code as ``tests/test_soak_load.py`` with a longer load phase.

    PYTHONPATH=. python bench/soak.py --duration 600 [--out bench/soak-result.json]
    PYTHONPATH=. python bench/soak.py --exits [--exit-cases stall-exit terminate sigkill churn]

Prints every figure and the promises broken (exit status 1 if any). ``--exits`` runs instead the
cases where trainer processes really end (``tests/soak/exits.py``) at the sizes of the issue that
found them, against one daemon, and prints made / counted / unaccounted per case. Results are
recorded in ``bench/RESULTS_SOAK.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemon_harness import DaemonProc  # noqa: E402
from tests.soak import exits  # noqa: E402
from tests.soak.scenario import SoakConfig, failures, run_soak  # noqa: E402

EXIT_SIZES: dict[str, dict[str, float]] = {
    "stall-exit": {"records": 30_000, "stall_s": 10.0},
    "terminate": {"workers": 4, "records": 400_000},
    "sigkill": {"flushes": 40, "per_flush": 500, "tail": 250},
    "churn": {"processes": 500, "records": 100, "parallel": 4},
}
"""The issue's sizes: a 10 s stall, ``Pool(4)``, a kill after 20,000 records, 500 processes."""


def run_exits(cases: list[str], out: Path | None) -> int:
    results = []
    with tempfile.TemporaryDirectory(prefix="dflash-exits-") as tmp:
        d = DaemonProc(Path(tmp))
        try:
            for case in cases:
                r = exits.CASES[case](d, **EXIT_SIZES[case])  # type: ignore[operator]
                results.append(r)
                print(f"{r.case}: made {r.made:,}, counted {r.counted:,}, unaccounted {r.unaccounted:,}, "
                      f"unknown tail {r.unknown_tail:,}, {r.wall_s:.1f} s; {r.dropped}", flush=True)
        finally:
            d.stop()
    if out:
        out.write_text(json.dumps([vars(r) for r in results], indent=1))
    broken = [r.case for r in results if r.unaccounted != 0]
    print("FAILED: " + ", ".join(broken) if broken else "every exit case exact")
    return 1 if broken else 0


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
    p.add_argument("--exits", action="store_true", help="run the exit cases instead of the load soak")
    p.add_argument("--exit-cases", nargs="+", choices=sorted(exits.CASES), default=list(exits.CASES))
    args = p.parse_args()
    if args.exits:
        return run_exits(args.exit_cases, args.out)
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
