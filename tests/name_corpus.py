"""The corpus of real metric names (``tests/data/names/``) and how the daemon's reading of it is
scored: by the test (``tests/test_name_corpus.py``) and the benchmark (``bench/bench_names.py``).

Each key is published as its trainer logs it (a key of a ``publish()`` dict: what the taps on
W&B, TensorBoard and MLflow send), all the keys of one repository by one sender, so that a name
decided by its siblings (DeepSpeed's ``elapsed_time_ms_step``) is read in its context; the
daemon's mapping stage and its window (``Aggregator.roll``, where a phase's parts are settled)
give each key its meaning.
"""

from __future__ import annotations

import tomllib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from sidecar.aggregation.aggregator import Aggregator
from sidecar.core.pipeline import ingest_records
from sidecar.model.meanings import PHASES
from sidecar.model.window import PROFILE
from sidecar.processing.mapping import Mapper

CORPUS = Path(__file__).parent / "data" / "names"


def _order(path: Path) -> int:
    """The design part first, then the held-out parts in the order they were built."""
    n = path.stem.removeprefix("names_holdout")
    return -1 if path.stem == "names_design" else int(n or 1)


PARTS = tuple(p.name for p in sorted(CORPUS.glob("names_*.toml"), key=_order))
"""Every part of the corpus, in the order it was built (``names_design.toml``, ``names_holdout.toml``,
``names_holdout2.toml``, ...): what the test and the benchmark score."""
DESIGN, HOLDOUT = CORPUS / "names_design.toml", CORPUS / "names_holdout.toml"
PHASE_LABELS = frozenset(PHASES) | {"step"}
"""Labels of a timing that is a phase of the step (or the whole step); ``other_phase`` (a timed part
of the step the insight has no meaning for) and ``none`` are right when read as no phase."""


PRINTED = "print"
"""``logged_by`` of a key its trainer only prints (a log line): no tap sees it and no trainer
publishes it as such, so the reading is scored on the published keys and, apart, on these."""


@dataclass(frozen=True)
class Row:
    """One corpus key: as logged, where it was read, and what its code computes."""

    key: str
    repo: str
    path: str
    logged_by: str
    unit: str
    label: str
    ambiguous: bool
    note: str

    @property
    def published(self) -> bool:
        return self.logged_by != PRINTED


def load(path: Path) -> list[Row]:
    """The rows of one corpus file."""
    with path.open("rb") as f:
        tables = tomllib.load(f)["key"]
    return [Row(t["key"], t["repo"], t["path"], t["logged_by"], t.get("unit", ""), t["label"],
                bool(t.get("ambiguous", False)), t.get("note", "")) for t in tables]


class Got(NamedTuple):
    """What the daemon made of a key: its meaning (``""``: none) and the read's certainty (0-1)."""

    meaning: str
    certainty: float = 1.0


def read(rows: Iterable[Row]) -> dict[tuple[str, str], Got]:
    """(repo, key) -> what the daemon makes of it, each repository's keys sent by one trainer in
    one ``publish()`` dict."""
    by_repo: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        by_repo[r.repo].append(r.key)
    out: dict[tuple[str, str], Got] = {}
    for repo, keys in by_repo.items():
        agg, mapper = Aggregator(), Mapper()
        ingest_records(agg, "trainer", "0", [[PROFILE, 1, dict.fromkeys(keys, 1.0)]], mapper)
        # a phase told with its parts is read, then not counted again (its parts are): it was read right
        seen = {v.raw or v.name: Got(v.meaning, v.certainty) for v in agg.roll(0.0, 1.0, 1.0).series
                if not v.counted_in}
        for key in keys:  # a key refused by the window (two keys on one exported name) is read alone
            m = mapper.resolve(PROFILE, key, "trainer", "0")
            out[repo, key] = seen.get(key, Got(m.meaning, m.certainty))
    return out


def right(row: Row, meaning: str) -> bool:
    """Whether ``meaning`` is what the row's code computes: its phase, or no phase for a key that
    is none (``other_phase``: a part of the step that has no meaning of its own)."""
    if row.label in PHASE_LABELS:
        return meaning == row.label
    return meaning not in PHASE_LABELS


@dataclass
class Score:
    """Counts of one corpus part: timing keys of a phase read right, non-phase keys read as a phase
    (the costly error), per label, and the ambiguous keys apart."""

    phase_right: int = 0
    phase_total: int = 0
    nonphase_wrong: int = 0
    nonphase_total: int = 0
    ambiguous_right: int = 0
    ambiguous_total: int = 0
    by_label: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    misses: list[tuple[Row, str]] = field(default_factory=list)

    @property
    def phase_share(self) -> float:
        return self.phase_right / self.phase_total if self.phase_total else 1.0

    @property
    def nonphase_share(self) -> float:
        return self.nonphase_wrong / self.nonphase_total if self.nonphase_total else 0.0


def score(rows: Iterable[Row], meanings: Mapping[tuple[str, str], Got]) -> Score:
    """Score ``meanings`` (``read``) against the rows' labels."""
    s = Score()
    for r in rows:
        meaning = meanings[r.repo, r.key].meaning
        ok = right(r, meaning)
        s.by_label[r.label][0] += ok
        s.by_label[r.label][1] += 1
        if not ok:
            s.misses.append((r, meaning))
        if r.ambiguous:
            s.ambiguous_right += ok
            s.ambiguous_total += 1
        elif r.label in PHASE_LABELS:
            s.phase_right += ok
            s.phase_total += 1
        else:
            s.nonphase_wrong += not ok
            s.nonphase_total += 1
    return s
