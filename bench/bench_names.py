"""How well the daemon reads real metric names (issue 43), side by side with what it did before
the name reader (the presets alone), and what a read costs per new series.

    PYTHONPATH=. python bench/bench_names.py [--rounds 5] [FILE.toml ...]

The corpus is ``tests/data/names/`` (real keys from the code of public training repositories,
each labelled with what its code computes; ``tests/name_corpus.py`` publishes and scores it).
For each part: the share of the phase timings (not marked ambiguous) read as their phase, the
share of the keys that are no phase read as one (the costly error), the ambiguous keys apart; the
published keys (what a tap or ``publish()`` carries) and the printed-only ones apart. The cost is
the mapping stage's resolution of every key of a part with a fresh mapper (no cache), median of
``--rounds`` alternating rounds, µs per key.

Files named on the command line are scored instead of the corpus: a corpus of names the project
does not hold (yours, or a held-out part before it is committed), in the corpus's format
(``tests/data/names/names_holdout8.toml``'s header says what each field means)."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sidecar.processing.mapping as mapping
from sidecar.model.window import PROFILE
from sidecar.processing.reader import Reading
from sidecar.processing.units import Unit
from tests.name_corpus import CORPUS, PARTS, Row, load, read, score


@contextmanager
def presets_only() -> Iterator[None]:
    """The mapping stage as it was before the reader: a name no rule or preset knows reads as nothing."""
    real, rate = mapping.read_name, mapping.read_rate
    mapping.read_name = lambda name, record=False: Reading("", Unit(name), "off")  # type: ignore[assignment]
    mapping.read_rate = lambda name: ""  # type: ignore[assignment]
    try:
        yield
    finally:
        mapping.read_name, mapping.read_rate = real, rate


def shares(rows: list[Row]) -> dict[str, str]:
    """The scores of ``rows`` as table cells."""
    meanings = read(rows)
    out = {}
    published = [r for r in rows if r.published]
    for part, sel in (("published", published), ("printed", [r for r in rows if not r.published])):
        s = score(sel, meanings)
        out[part] = (f"{s.phase_right}/{s.phase_total} = {s.phase_share:.1%} | {s.nonphase_wrong}/{s.nonphase_total} "
                     f"= {s.nonphase_share:.1%} | {s.ambiguous_right}/{s.ambiguous_total}")  # three cells
    return out


def per_key_us(rows: list[Row], rounds: int) -> tuple[float, float]:
    """Median µs per key to resolve ``rows``' keys with a fresh mapper: (with the reader, presets only)."""
    keys = [r.key for r in rows]

    def once() -> float:
        mapper = mapping.Mapper()
        t0 = time.perf_counter_ns()
        for k in keys:
            mapper.resolve(PROFILE, k, "trainer", "0")
        return (time.perf_counter_ns() - t0) / len(keys) / 1000.0

    timed: dict[str, list[float]] = {"reader": [], "presets": []}
    for _ in range(rounds):
        timed["reader"].append(once())
        with presets_only():
            timed["presets"].append(once())
    return statistics.median(timed["reader"]), statistics.median(timed["presets"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("files", nargs="*", type=Path, help="corpus files to score instead of tests/data/names/")
    args = parser.parse_args(argv)
    paths = args.files or [CORPUS / name for name in PARTS if (CORPUS / name).exists()]
    print("| part | keys (repos) | mapping | published: phase timings right | non-phase keys read as a phase "
          "| ambiguous right | printed only: phase timings right | non-phase read as a phase | ambiguous right |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    every: list[Row] = []
    for path in paths:
        rows = load(path)
        every += rows
        head = f"| {path.name} | {len(rows)} ({len({r.repo for r in rows})})"
        for label, scope in (("reader", _same), ("presets only", presets_only)):
            with scope():
                cells = shares(rows)
            print(f"{head} | {label} | {cells['published']} | {cells['printed']} |")
    reader_us, presets_us = per_key_us(every, args.rounds)
    print(f"\nresolve one new key, {len(every)} keys, median of {args.rounds} rounds: reader {reader_us:.1f} us, "
          f"presets only {presets_us:.1f} us (ratio {reader_us / presets_us:.2f})")
    return 0


@contextmanager
def _same() -> Iterator[None]:
    yield


if __name__ == "__main__":
    raise SystemExit(main())
