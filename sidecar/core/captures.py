"""The kept profiler captures: the state folder's ``traces/`` (docs/METRICS.md, "Captures").

Each capture is two files, ``<stamp>-<pid>.trace.json.gz`` (the Chrome trace, open it in Perfetto
or ``chrome://tracing``) and ``<stamp>-<pid>.capture.json`` (who was captured, when, the run, and
the breakdown, ``sidecar.model.trace``). The folder is bounded in number and in bytes: the oldest
captures are removed first. ``dflash-sidecar trace`` writes here; ``explain``, ``report`` and the
exporters read.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.model.trace import CaptureView, TraceBreakdown

FOLDER = "traces"
KEEP_DEFAULT = 20
"""Captures kept at most (the oldest go first)."""
MAX_MB_DEFAULT = 1024.0
"""Bytes of trace files kept at most (MiB; the oldest go first, the newest always stays)."""
_META = ".capture.json"
_TRACE = ".trace.json.gz"


@dataclass(frozen=True)
class Capture:
    """One kept capture."""

    path: Path
    """Its ``.capture.json``."""
    trace: Path | None
    """Its trace file (None if it was removed or never copied)."""
    meta: dict[str, Any]
    """``pid``, ``role``, ``worker``, ``run``, ``steps``, ``cuda``, ``started_unix_s``, ``ended_unix_s``."""
    breakdown: TraceBreakdown


def folder(state_dir: Path) -> Path:
    return state_dir / FOLDER


def keep(state_dir: Path, source_trace: str, meta: dict[str, Any], result: TraceBreakdown,
         keep_n: int = KEEP_DEFAULT, max_mb: float = MAX_MB_DEFAULT) -> Capture:
    """Move (or copy, when moving is not allowed) ``source_trace`` into the folder, write its
    ``.capture.json``, then remove the oldest captures beyond the bounds. Raises ``OSError`` if the
    folder cannot be written."""
    where = folder(state_dir)
    where.mkdir(parents=True, exist_ok=True)
    base = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{meta.get('pid', 0)}"
    if (where / (base + _META)).exists():  # a second capture of the process within the second
        base += f"-{secrets.token_hex(2)}"
    trace = where / (base + _TRACE)
    try:
        os.replace(source_trace, trace)
    except OSError:
        shutil.copyfile(source_trace, trace)  # another user's file in the sticky tally directory
    path = where / (base + _META)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"meta": meta, "trace": trace.name, "breakdown": result.to_json()}))
    os.replace(tmp, path)
    prune(state_dir, keep_n, max_mb)
    return Capture(path, trace, meta, result)


def captures(state_dir: Path) -> list[Capture]:
    """The kept captures, oldest first; unreadable ones are skipped."""
    out = []
    try:
        paths = sorted(folder(state_dir).glob("*" + _META))
    except OSError:
        return []
    for path in paths:
        try:
            data = json.loads(path.read_text())
            breakdown = TraceBreakdown.from_json(data["breakdown"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        trace = path.parent / str(data.get("trace", ""))
        out.append(Capture(path, trace if trace.is_file() else None, dict(data.get("meta") or {}), breakdown))
    return out


def latest(state_dir: Path) -> Capture | None:
    """The newest kept capture, or None."""
    kept = captures(state_dir)
    return kept[-1] if kept else None


def prune(state_dir: Path, keep_n: int = KEEP_DEFAULT, max_mb: float = MAX_MB_DEFAULT) -> int:
    """Remove the oldest captures beyond ``keep_n`` or ``max_mb`` of traces; returns how many went."""
    kept = captures(state_dir)
    removed = 0
    sizes = [c.trace.stat().st_size if c.trace is not None else 0 for c in kept]
    while kept and (len(kept) > keep_n or (len(kept) > 1 and sum(sizes) > max_mb * (1 << 20))):
        gone = kept.pop(0)
        sizes.pop(0)
        for p in (gone.trace, gone.path):
            if p is not None:
                p.unlink(missing_ok=True)
        removed += 1
    return removed


class LatestCapture:
    """The newest kept capture as a ``CaptureView``, read again only when the folder changed (its
    modification time): what the exporters read at every scrape or window. Never raises."""

    def __init__(self, state_dir: Path) -> None:
        self._folder = folder(state_dir)
        self._state_dir = state_dir
        self._mtime_ns: int | None = None
        self._view: CaptureView | None = None

    def view(self) -> CaptureView | None:
        try:
            mtime = self._folder.stat().st_mtime_ns
        except OSError:
            return None
        if mtime != self._mtime_ns:
            c = latest(self._state_dir)
            self._view = None if c is None else CaptureView(
                str(c.meta.get("role") or ""), str(c.meta.get("worker") or ""), c.meta.get("run"),
                float(c.meta.get("ended_unix_s") or 0.0), c.breakdown)
            self._mtime_ns = mtime
        return self._view
