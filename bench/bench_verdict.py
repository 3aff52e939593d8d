"""Bottleneck-verdict accuracy: drive ``dflash-sidecar demo`` in every scenario and compare the
per-window verdict (read from the console line) with the injected bottleneck; with ``--matrix``,
the conformance matrix of real frameworks (``tests/verdict_matrix.py``) instead.

    python bench/bench_verdict.py --duration 120            # writes bench/RESULTS_VERDICT.md
    python bench/bench_verdict.py --duration 8 --no-write   # a quick look
    python bench/bench_verdict.py --duration 60 --cpu-hogs 2 --append   # under CPU contention
    python bench/bench_verdict.py --matrix --windows 16 --append        # the frameworks' matrix

The matrix: plain loop (every occurrence, 2 ranks on gloo; snapshots), Hugging Face ``Trainer``,
Lightning, a ``torch.compile``d model, 2-rank DistributedDataParallel on gloo, each under input-,
host-, communication-bound, straggler, GPU-saturated (fake NVML 97 %) and unmapped-phase
conditions switched while it runs (``--windows`` windows each, the first two not scored); it also
counts ``host-bound`` windows anywhere outside host overhead (first and last windows included).

Scenarios (``tests/verdict_demo.py`` ``SCENARIOS``): the DFlash demo with per-worker channels
(``none`` ... ``throttled``); the same pipeline published seed-style, one profile dict per interval
from a monitor thread (``seed-*``); a plain single-role training loop publishing every occurrence
(``loop-*``) or per-batch-mean snapshots (``snap-*``); ``throttled``, ``loop-throttled`` and
``loop-compute`` on the fake NVML driver, the others with NVML off. Each scenario runs in its own
process, ``--parallel`` at a time. The first ``--warmup`` windows and the partial window flushed
at shutdown are not scored. ``tests/test_insight_demo.py`` and ``tests/test_naming_verdicts.py``
run the short form of this; all drive the demo with ``tests/verdict_demo.py``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.verdict_demo import EXPECTED, accuracy, confusion, evaluate  # noqa: E402

VERDICTS = ("balanced", "target-bound", "drafter-bound", "queue-starved", "host-bound", "throttled", "straggler",
            "input-bound", "communication-bound", "compute-bound", "idle", "unknown")


def _hog(stop: multiprocessing.synchronize.Event) -> None:
    while not stop.is_set():
        sum(range(10_000))


def with_cpu_hogs(n: int, fn):  # type: ignore[no-untyped-def]
    """Run ``fn()`` while ``n`` processes spin on the CPU (contention like a busy training host)."""
    stop = multiprocessing.Event()
    hogs = [multiprocessing.Process(target=_hog, args=(stop,), daemon=True) for _ in range(n)]
    for h in hogs:
        h.start()
    try:
        return fn()
    finally:
        stop.set()
        for h in hogs:
            h.join(5)


def evidence_ranges(windows: list[tuple[float, str, str]]) -> dict[str, tuple[float, float, float]]:
    """Evidence name -> (min, median, max) over the windows."""
    values: dict[str, list[float]] = {}
    for _, _, text in windows:
        for key, _, value in (part.partition("=") for part in text.split()):
            try:
                number = float(value.rstrip(","))
            except ValueError:
                continue
            values.setdefault(key, []).append(number)
    return {k: (min(v), sorted(v)[len(v) // 2], max(v)) for k, v in values.items()}


def markdown(results: dict[str, list[tuple[float, str, str]]], command: str, elapsed_s: float,
             title: str = "# Bottleneck verdict: confusion matrix") -> str:
    matrix = confusion(results)
    cols = [v for v in VERDICTS if any(m[v] for m in matrix.values()) or v in EXPECTED.values()]
    lines = [title, "",
             f"Command: `{command}`", "",
             f"Machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.platform()}; "
             f"{time.strftime('%Y-%m-%d')}; wall time {elapsed_s:.0f} s; load average at the end "
             f"{os.getloadavg()[0]:.2f} (scenarios run side by side, "
             "`--parallel` at a time, so the machine is loaded on purpose).", "",
             "Rows: scenario (`tests/verdict_demo.py` `SCENARIOS`: the DFlash demo with per-worker channels; "
             "`seed-*` the same pipeline published as one profile dict per interval from a monitor thread; "
             "`loop-*` a plain 2-rank training loop, every timing() occurrence; `snap-*` the same loop publishing "
             "per-batch means every 0.5 s; 1 s windows; NVML off except `throttled`, `loop-throttled` and "
             "`loop-compute`, on the fake driver). Columns: "
             "the verdict of each window after the warm-up ones; the partial window flushed at "
             "shutdown is not scored.", "",
             "| injected \\ verdict | " + " | ".join(cols) + " | windows | correct |",
             "| --- | " + " | ".join("---:" for _ in cols) + " | ---: | ---: |"]
    for b, counts in matrix.items():
        lines.append(f"| {b} (expect {EXPECTED[b]}) | " + " | ".join(str(counts[c]) for c in cols)
                     + f" | {sum(counts.values())} | {accuracy(counts, b):.1%} |")
    total = sum(sum(c.values()) for c in matrix.values())
    right = sum(c[EXPECTED[b]] for b, c in matrix.items())
    lines += ["", f"Overall: {right}/{total} windows correct ({right / total if total else 0:.1%}).", ""]
    lines += ["Evidence over the scored windows (min / median / max): how far each deciding number stays "
              "from its threshold (defaults: wait signals 0.15, cause shares 0.25, straggler score 0.7).", "",
              "| injected | evidence |", "| --- | --- |"]
    for b, windows in results.items():
        ranges = evidence_ranges(windows)
        lines.append(f"| {b} | " + "; ".join(f"{k} {lo:.2f} / {mid:.2f} / {hi:.2f}"
                                             for k, (lo, mid, hi) in ranges.items()) + " |")
    lines.append("")
    wrong = [(b, w) for b, windows in results.items() for w in windows if w[1] != EXPECTED[b]]
    if wrong:
        lines += ["Misjudged windows (injected: verdict (evidence)):", ""]
        lines += [f"- {b}: {v} ({e})" for b, (_, v, e) in wrong[:20]]
        lines.append("")
    return "\n".join(lines)


def matrix_markdown(rows: dict, command: str, elapsed_s: float, windows: int, interval_s: float,  # type: ignore[type-arg]
                    load: str, title: str) -> str:
    """The conformance matrix: one row per (framework, condition) with its verdict counts."""
    from tests import verdict_matrix as vm

    cols = [v for v in VERDICTS if any(vm.counts(c)[v] for r in rows.values() for c in r.cells.values())
            or v in vm.EXPECTED.values()]
    lines = [title, "", f"Command: `{command}`", "",
             f"Machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.platform()}; "
             f"{time.strftime('%Y-%m-%d')}; wall time {elapsed_s:.0f} s; load average before / after: {load}. "
             f"{interval_s:g} s windows (hf: twice that, `WINDOW_SCALE`), {windows} per condition, the first "
             "two of each not scored; three "
             "frameworks side by side on a machine shared with other work, so timings are noisy.", "",
             "Rows: framework / injected condition (`tests/verdict_matrix.py` `ROWS`, trainers in "
             "`tests/matrix_loops.py`). Columns: the verdict of each scored window. `stray host-bound`: windows "
             "of the whole run (start and exit included) that said host-bound outside the host condition.", "",
             "| framework / condition (expect) | " + " | ".join(cols) + " | windows | correct |",
             "| --- | " + " | ".join("---:" for _ in cols) + " | ---: | ---: |"]
    total = right = 0
    for framework, row in rows.items():
        for condition, cell in row.cells.items():
            c = vm.counts(cell)
            total += len(cell)
            right += c[vm.EXPECTED[condition]]
            share = vm.accuracy(cell, condition)
            lines.append(f"| {framework} / {condition} ({vm.EXPECTED[condition]}) | "
                         + " | ".join(str(c[v]) for v in cols) + f" | {len(cell)} | {share:.1%} |")
    lines += ["", f"Overall: {right}/{total} windows correct ({right / total if total else 0:.1%}).", "",
              "Per cell, the evidence of its scored windows (min / median / max; the deciding number first; "
              "thresholds: data wait 0.25, comm wait 0.25, host gap 0.3, GPU busy 0.85, straggler score 0.7) "
              "and its confidence:", "",
              "| framework / condition | evidence | confidence |", "| --- | --- | --- |"]
    for framework, row in rows.items():
        for condition, cell in row.cells.items():
            ranges = evidence_ranges([(0.0, v, e) for v, e in cell])
            conf = ranges.pop("confidence", None)
            lines.append(f"| {framework} / {condition} | "
                         + "; ".join(f"{k} {lo:.2f} / {mid:.2f} / {hi:.2f}" for k, (lo, mid, hi) in ranges.items())
                         + f" | {'%.2f / %.2f / %.2f' % conf if conf else '-'} |")
    lines += ["", "| framework | stray host-bound windows | idle after the trainer exited | row wall time |",
              "| --- | ---: | --- | ---: |"]
    for framework, row in rows.items():
        lines.append(f"| {framework} | {len(row.stray_host)} of {len(row.windows)} | "
                     f"{'yes' if row.idle_after_exit else 'no'} | {row.wall_s:.0f} s |")
    wrong = [(f, c, v, e) for f, r in rows.items() for c, cell in r.cells.items() for v, e in cell
             if v != vm.EXPECTED[c]]
    if wrong:
        lines += ["", "Misjudged windows (framework / condition: verdict (evidence)):", ""]
        lines += [f"- {f} / {c}: {v} ({e})" for f, c, v, e in wrong[:20]]
    return "\n".join(lines) + "\n"


def run_matrix_bench(ns: argparse.Namespace) -> int:
    from tests import verdict_matrix as vm

    load_before = "%.2f" % os.getloadavg()[0]
    start = time.monotonic()
    interval = ns.interval or 0.5
    rows = vm.run_matrix(ns.framework or None, windows=ns.windows, interval_s=interval, parallel=ns.parallel or 3)
    command = "python " + " ".join(["bench/bench_verdict.py", *sys.argv[1:]])
    load = f"{load_before} / {os.getloadavg()[0]:.2f}"
    text = matrix_markdown(rows, command, time.monotonic() - start, ns.windows, interval, load,
                           "## Conformance matrix: real frameworks" if ns.append else
                           "# Bottleneck verdict: conformance matrix of real frameworks")
    print(text)
    if not ns.no_write:
        if ns.append and Path(ns.out).exists():
            text = Path(ns.out).read_text() + "\n" + text
        Path(ns.out).write_text(text)
    ok = all(vm.accuracy(c, cond) >= 0.95 and len(c) > 0 for r in rows.values() for cond, c in r.cells.items())
    return 0 if ok and not any(r.stray_host for r in rows.values()) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds per bottleneck")
    parser.add_argument("--interval", type=float, default=None, help="window seconds (default 1; --matrix 0.5)")
    parser.add_argument("--warmup", type=int, default=1, help="windows not scored at the start")
    parser.add_argument("--serial", action="store_true", help="one bottleneck at a time")
    parser.add_argument("--bottleneck", "--scenario", dest="bottleneck", action="append", choices=list(EXPECTED),
                        help="default: all")
    parser.add_argument("--parallel", type=int, default=None, help="scenarios at a time (default: all)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "RESULTS_VERDICT.md"))
    parser.add_argument("--cpu-hogs", type=int, default=0, help="processes spinning on the CPU meanwhile")
    parser.add_argument("--append", action="store_true", help="append to --out instead of replacing it")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--matrix", action="store_true", help="the real frameworks' conformance matrix instead")
    parser.add_argument("--windows", type=int, default=12, help="--matrix: windows per condition")
    parser.add_argument("--framework", action="append", help="--matrix: one framework (default: all)")
    ns = parser.parse_args()
    if ns.matrix:
        return run_matrix_bench(ns)
    ns.interval = ns.interval or 1.0
    start = time.monotonic()
    results = with_cpu_hogs(ns.cpu_hogs, lambda: evaluate(ns.bottleneck or list(EXPECTED), ns.duration,
                                                          ns.interval, ns.warmup, ns.serial, ns.parallel))
    command = "python " + " ".join(["bench/bench_verdict.py", *sys.argv[1:]])
    title = "# Bottleneck verdict: confusion matrix" if not ns.append else (
        f"## With {ns.cpu_hogs} CPU-spinning processes" if ns.cpu_hogs else "## Another run")
    text = markdown(results, command, time.monotonic() - start, title)
    print(text)
    if not ns.no_write:
        if ns.append and Path(ns.out).exists():
            text = Path(ns.out).read_text() + "\n" + text
        Path(ns.out).write_text(text)
    matrix = confusion(results)
    right = sum(c[EXPECTED[b]] for b, c in matrix.items())
    total = sum(sum(c.values()) for c in matrix.values())
    ok = total > 0 and right / total >= 0.98 and all(accuracy(c, b) >= 0.95 for b, c in matrix.items())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
