"""The verdict conformance matrix: real frameworks (``tests/matrix_loops.py``) publishing through
the real shim to a real daemon on the fake NVML driver, each under the conditions a user meets,
switched while it runs; the daemon's console verdict of every window is scored against the
injected condition. ``tests/test_verdict_matrix.py`` runs it in CI, ``bench/bench_verdict.py
--matrix`` at length.

One daemon and one trainer (two ranks for ``plain`` and ``ddp``) per framework; the conditions of
a row run one after another in the same trainer (``ROWS``), each for ``windows`` windows, the
fake GPU reading 97 % utilization in ``saturated`` and 30 % otherwise. A cell is the windows
that opened after every rank acknowledged its condition and closed before the next was written
(by the log's clock), less the first of them (hysteresis may hold the previous verdict one
window): a loaded CPU that reads the change late, or logs a window late, moves the cell, it does
not put the last condition's windows in it. Every window of the run, from the trainer's start to after its
exit, is also checked for ``host-bound`` where the condition is not host overhead: only the
``host`` cell and the two windows after it may say it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tests.daemon_harness import DaemonProc, env, free_port
from tests.verdict_demo import LINE

EXPECTED = {"input": "input-bound", "host": "host-bound", "comm": "communication-bound", "straggler": "straggler",
            "saturated": "compute-bound", "unmapped": "unexplained-idle", "spin": "communication-bound"}
"""Injected condition -> the verdict it must get. ``unmapped``: the step is fully timed, one
phase under a name no rule, preset or read maps (``t_update_ms``: a learner's update, no phase),
the GPU 30 % busy and nothing waiting: ``unexplained-idle`` (no false health: 70 % idle that no
wait explains), the name in the evidence (never ``host-bound``). ``spin`` (2-rank rows): a slow collective on a GPU
NVML reads 97 % busy without GPM (NCCL's kernels spin while a rank waits): ``communication-bound``,
the trainer's ``comm_wait`` deciding. (With GPM SM activity beside it: ``loop-ddp-gpm`` of
``tests/verdict_demo.py``; the daemon reads GPM only where the GPU has it from its start.)"""

ROWS: dict[str, tuple[str, ...]] = {
    "plain": ("unmapped", "input", "host", "saturated", "comm", "straggler", "spin"),
    "snapshot": ("unmapped", "input", "host", "saturated", "comm", "straggler"),
    "hf": ("unmapped", "input", "host", "saturated"),
    "lightning": ("unmapped", "input", "host", "saturated"),
    "compile": ("unmapped", "input", "host", "saturated"),
    "ddp": ("unmapped", "input", "host", "saturated", "comm", "straggler", "spin"),
}
"""Framework -> its conditions, in run order. ``comm`` and ``straggler`` are cells of the rows
that run 2 ranks on gloo (``RANKS``): ``hf``, ``lightning`` and ``compile`` run one process,
which has no collective to wait on and no peer to lag behind. Lightning's ``host`` is a user's
callback after the sidecar's, working at each batch end (between the batches, where the
callback's data wait, the time inside the loop's fetch, does not reach)."""
RANKS = {"plain": 2, "snapshot": 2, "ddp": 2}
WINDOW_SCALE = {"hf": 2.0}
"""Rows whose steps are long (the Trainer's, its effects scaled up in ``tests/matrix_loops.py``)
run windows this many times longer, so each window still holds a few steps."""


@dataclass
class RowResult:
    framework: str
    cells: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    """Condition -> (verdict, evidence) of each scored window."""
    stray_host: list[tuple[int, str, str]] = field(default_factory=list)
    """(window index, where, evidence) of ``host-bound`` windows outside host overhead."""
    windows: list[tuple[str, str]] = field(default_factory=list)
    """Every window of the run: (verdict, evidence)."""
    idle_after_exit: bool = False
    log_tail: str = ""
    wall_s: float = 0.0
    """Seconds the row took, from the daemon's start to the trainer's exit and the daemon's stop."""


def _set_gpu(control: object, busy: int) -> None:
    """The fake GPU ``busy`` percent by NVML utilization; no GPM, no clock event."""
    control.gpu("*", utilization_gpu=busy, gpm_supported=0, clock_reasons=0)  # type: ignore[attr-defined]


def _gpu_for(condition: str) -> int:
    """The fake GPU's utilization for ``condition``: 97 % where it is saturated or spins in a
    collective, else 30 %."""
    return 97 if condition in ("saturated", "spin") else 30


def _write(path: Path, state: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(path)


STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")
"""The daemon log's ``asctime`` (local time, milliseconds after the comma)."""


def _stamped(d: DaemonProc) -> list[tuple[float, float, str, str]]:
    """(wall-clock seconds the line was logged, window seconds, verdict, evidence and
    ``confidence=C``) of each console window line; a window is logged as it closes."""
    out = []
    for line in d.log().splitlines():
        m, stamp = LINE.search(line), STAMP.match(line)
        if m and stamp:
            logged = time.mktime(time.strptime(stamp[1], "%Y-%m-%d %H:%M:%S")) + int(stamp[2]) / 1000
            out.append((logged, float(m["dur"]), m["verdict"],
                        (m["evidence"] or "") + (f" confidence={m['confidence']}" if m["confidence"] else "")))
    return out


def _lines(d: DaemonProc) -> list[tuple[float, str, str]]:
    """(window seconds, verdict, evidence and ``confidence=C``) of each console window line."""
    return [(dur, v, e) for _, dur, v, e in _stamped(d)]


def _switch(control: Path, cond: str, procs: list[subprocess.Popen[bytes]], timeout_s: float = 60.0) -> float:
    """Writes ``cond`` and waits until every rank has read it (``tests/matrix_loops.py`` acks);
    returns the wall-clock time from which all of them run it.

    Raises:
        RuntimeError: a rank exited or did not read it within ``timeout_s``.
    """
    _write(control, {"condition": cond})
    acks = [control.with_name(f"{control.name}.ack{rank}") for rank in range(len(procs))]
    deadline = time.monotonic() + timeout_s
    while not all(a.exists() and a.read_text() == cond for a in acks):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError(f"{control.parent.name}: a rank did not take up {cond!r}")
        time.sleep(0.02)
    return time.time()


def _cell(stamped: list[tuple[float, float, str, str]], start: float, end: float,
          interval_s: float) -> list[tuple[str, str]]:
    """The scored windows of a condition every rank ran from ``start`` until ``end`` (wall clock,
    the next condition's first change): the whole windows between them, less the first
    (hysteresis may hold the last verdict one window) and any cut short. A window's start is read
    as its log line's time less its length, later than it was by however late the line came: a
    window counts from half a window after ``start``, so a line up to that late cannot bring in
    one that began before it."""
    whole = [(v, e) for logged, dur, v, e in stamped
             if logged - dur >= start + 0.5 * interval_s and logged <= end and dur >= 0.5 * interval_s]
    return whole[1:]


def _stray_host(stamped: list[tuple[float, float, str, str]], host: list[tuple[float, float]],
                interval_s: float) -> list[tuple[int, str, str]]:
    """(index, "run", evidence) of each ``host-bound`` window outside host overhead: ``host`` holds
    (when the host condition was written, when every rank had left it), and a window logged after
    the first that began up to a window and a half after the second (hysteresis holds it one) is
    inside it."""
    return [(i, "run", e) for i, (logged, dur, v, e) in enumerate(stamped) if v == "host-bound"
            and not any(on <= logged and logged - dur <= off + 1.5 * interval_s for on, off in host)]


def run_row(framework: str, workdir: Path, windows: int = 7, interval_s: float = 0.5,
            startup_timeout_s: float = 120.0) -> RowResult:
    """Run one framework through its conditions; see the module docstring."""
    from tests.fake_nvml.build import build_fake_nvml
    from tests.fake_nvml.control import FakeNvml

    started = time.monotonic()
    row_dir = workdir / framework
    row_dir.mkdir(parents=True, exist_ok=True)
    interval_s *= WINDOW_SCALE.get(framework, 1.0)
    library = build_fake_nvml("full")
    nvml = FakeNvml(row_dir / "nvml-control.txt", library, {"devices": 1})
    _set_gpu(nvml, _gpu_for("base"))
    control = row_dir / "control.json"
    conditions = ROWS[framework]
    _write(control, {"condition": conditions[0]})
    d = DaemonProc(row_dir, "--nvml-interval", "0.25", "--gpu-group", "trainer=0", interval=interval_s, gpu=True,
                   extra_env={"LD_LIBRARY_PATH": str(library.parent), "FAKE_NVML_CONTROL": str(nvml.path)})
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "tests.matrix_loops", framework, d.endpoint, str(control),
                               str(rank), str(RANKS.get(framework, 1)), str(port)],
                              env=env(MATRIX_OUT=str(row_dir / "out")), cwd=row_dir,
                              stdout=subprocess.DEVNULL, stderr=open(row_dir / f"trainer{rank}.log", "wb"))
             for rank in range(RANKS.get(framework, 1))]
    result = RowResult(framework)
    try:
        deadline = time.monotonic() + startup_timeout_s
        # started once every rank has finished a few steps (imports, model build and compile done)
        while (d.value("dflash_trainer_batches_total") or 0) < 10 * RANKS.get(framework, 1):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{framework}: no verdict from the trainer; trainer log:\n"
                                   + (row_dir / "trainer0.log").read_text(errors="replace")[-3000:])
            time.sleep(0.2)
        time.sleep(2 * interval_s)  # the first steps' own costs (loader start, gloo's first collectives) pass
        marks: list[tuple[str, float, float]] = []  # condition, when it was written, all ranks run it from
        for cond in conditions:
            written = time.time()
            _set_gpu(nvml, _gpu_for(cond))
            marks.append((cond, written, _switch(control, cond, procs)))
            time.sleep(windows * interval_s)
        end_time = time.time()
        _write(control, {"stop": True})
        for p in procs:
            p.wait(60)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (not _lines(d) or _lines(d)[-1][1] != "idle"):
            time.sleep(0.25)
        stamped = _stamped(d)
        result.idle_after_exit = bool(stamped) and stamped[-1][2] == "idle"
        result.windows = [(v, e) for _, _, v, e in stamped]
        nexts = [(written, ran) for _, written, ran in marks[1:]] + [(end_time, end_time)]
        for (cond, _, start), (end, _) in zip(marks, nexts, strict=True):
            result.cells[cond] = _cell(stamped, start, end, interval_s)
        host = [(written, left) for (cond, written, _), (_, left) in zip(marks, nexts, strict=True) if cond == "host"]
        result.stray_host = _stray_host(stamped, host, interval_s)
        result.log_tail = "\n".join(d.log().splitlines()[-15:])
    finally:
        _write(control, {"stop": True})
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        d.stop()
    result.wall_s = time.monotonic() - started
    return result


def run_matrix(frameworks: list[str] | None = None, windows: int = 7, interval_s: float = 0.5,
               parallel: int = 3) -> dict[str, RowResult]:
    """Framework -> its row, ``parallel`` rows at a time."""
    names = frameworks or list(ROWS)
    with tempfile.TemporaryDirectory(prefix="dflash-matrix-") as workdir:
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            rows = pool.map(lambda f: run_row(f, Path(workdir), windows, interval_s), names)
            return dict(zip(names, rows, strict=True))


def accuracy(cell: list[tuple[str, str]], condition: str) -> float:
    return sum(1 for v, _ in cell if v == EXPECTED[condition]) / len(cell) if cell else 0.0


def counts(cell: list[tuple[str, str]]) -> Counter[str]:
    return Counter(v for v, _ in cell)


if __name__ == "__main__":  # a quick look: python -m tests.verdict_matrix hf
    for name, row in run_matrix(sys.argv[1:] or None, parallel=int(os.environ.get("PARALLEL", "3"))).items():
        print(name, {c: dict(counts(cell)) for c, cell in row.cells.items()}, "stray host:", row.stray_host,
              "idle after exit:", row.idle_after_exit)
