"""Phases that contain phases, and names that take their meaning from their siblings.

Trainers time a phase and its parts side by side: DeepSpeed's monitor writes ``..._backward``
beside ``..._backward_inner`` and ``..._backward_allreduce`` (the backward is their sum), a loop
times ``forward_backward`` beside ``forward`` and ``backward``. Counted as they come, the
backward would count twice, and the all-reduce inside it never as communication. And a name's
last word may mean one phase in one framework and another elsewhere: ``step`` is the whole step
in most loops, but DeepSpeed's ``elapsed_time_ms_step`` is the optimizer step, next to
``elapsed_time_ms_forward`` and ``elapsed_time_ms_backward``.

``settle`` decides these once per window from the names of each (role, worker), before any
stage reads the window:

1. A name whose reading says it means a phase beside its siblings (``SeriesView.sibling``) takes
   that meaning when timings of the same label that share its prefix (its stem less the last
   word; for a stem of one word, the other stems of one word), less its own parts, time the
   phases around it (``SIBLING_NEEDS``) and not that phase already: a ``step`` the optimizer
   beside the forward and the backward (or both as one), a ``render`` or a ``unet`` (no phase
   alone) the forward beside a backward. Decided on the meanings as read, so the order of the
   names changes nothing. A name of one word read as a phase (``time/step``) keeps it.
2. A phase timing whose stem is the start of other phase timings' stems is timed with its parts
   (``x_backward`` beside ``x_backward_inner`` and ``x_backward_allreduce``). Where the parts are
   its own phase and another, and no user rule named it, it is their sum: it keeps no meaning
   (``counted_in`` its parts: it is not unattributed time either) and the parts are read. Parts of its own
   phase alone are inside it and not counted again (``forward`` beside ``forward_attn``); parts
   of other phases alone stay beside it.
3. ``forward_backward`` beside a ``forward`` and a ``backward`` of one prefix (``fwd_bwd`` beside
   ``fwd`` and ``bwd``) is their sum, likewise.
4. A timing read as the step only because nothing else was named (certainty below 1: a bare
   ``duration``, ``dt``, ``time``) whose namespace also records an episode (another series of the
   same label and namespace whose last segment holds ``EPISODE``: ``train/episode``,
   ``train/episode_reward``) is that episode's time, no phase of the step: RL loggers write an
   episode's wall time beside its number and its return when it ends (the SAC loggers that
   pytorch_sac and CURL share).

Each change is said in the series' ``rule`` (``explain`` shows it). A label's rules cost it about
n log n a window, whatever names a client sends (``_Stems``, ``SPELLINGS``, ``_Halves``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import replace
from itertools import accumulate, combinations

from sidecar.model.meanings import PHASES
from sidecar.model.names import split_segments
from sidecar.model.window import TIMING, SeriesView

PARTS = tuple(p for p in PHASES if p != "forward_backward")
BESIDE = frozenset(PHASES) | {"step"}
"""The meanings a label's rules read beside each other: the phases and the whole step (a sibling
never takes a meaning that stands beside it already)."""
"""Phases that can be a part of another (``forward_backward`` contains, it is no part)."""
SPELLINGS = 4
"""Names of one stem (``train/fwd_ms`` and ``train/fwd_s``; a flood's ``X__ELAPSED_Time_ms_step``)
a label's rules read, the first in the window's order: no trainer writes one name more ways, and
thousands of one stem made the rules quadratic (each compared with all the others); the rest are
left as read."""
SIBLING_NEEDS: dict[str, tuple[frozenset[str], ...]] = {
    "optimizer": (frozenset({"forward", "backward"}), frozenset({"forward_backward"})),
    "forward": (frozenset({"backward"}),),
    "step": tuple(frozenset(pair) for pair in combinations(PARTS + ("forward_backward",), 2)),
}
"""The meaning a sibling word may take (``sidecar.processing.reader.SIBLING_WORDS``; a test keeps
every one here) -> the phases, any one set of them, that must stand beside it for it to take it:
the phase they leave out (the optimizer beside a forward and a backward; the forward beside a
backward; a bare total the step beside any two phases), never one timed beside it already."""
EPISODE = "episode"
"""In the last segment of a name of the same namespace, what makes an uncertain step read an
episode's time (rule 4): ``episode``, ``episode_reward``, ``EpisodeReturn``, ``num_episodes``."""


def settle(series: Sequence[SeriesView]) -> tuple[SeriesView, ...]:
    """``series`` with the phases of each (role, worker) settled (the rules above)."""
    out = list(series)
    labels: dict[tuple[str, str], list[int]] = defaultdict(list)
    spellings: Counter[tuple[str, str, str]] = Counter()
    for i, v in enumerate(out):
        if v.kind == TIMING and (v.meaning in BESIDE or v.sibling) and v.stem:
            spellings[v.role, v.worker, v.stem] += 1
            if spellings[v.role, v.worker, v.stem] <= SPELLINGS:
                labels[v.role, v.worker].append(i)
    for members in labels.values():
        if len(members) < 2:
            continue
        stems = _Stems(out, members)
        _siblings(out, members)
        _containers(out, members, stems)
    _episodes(out)
    return tuple(out)


class _Stems:
    """One label's phase timings ordered by stem, to find those whose stem starts with a prefix in
    O(log n + matches): a name compared with every other was O(n²) a window, about 0.6 s a roll
    with 2,000 phase timings under one label (``bench/bench_roll.py --read``)."""

    __slots__ = ("_ordered", "_stems")

    def __init__(self, out: list[SeriesView], members: list[int]) -> None:
        self._ordered = sorted(members, key=lambda j: out[j].stem)
        self._stems = [out[j].stem for j in self._ordered]  # a stem never changes within settle

    def starting(self, prefix: str) -> list[int]:
        """The members whose stem starts with ``prefix``, in the order of ``members``."""
        k = bisect_left(self._stems, prefix)
        found = []
        while k < len(self._stems) and self._stems[k].startswith(prefix):
            found.append(self._ordered[k])
            k += 1
        return sorted(found)


def _episodes(out: list[SeriesView]) -> None:
    """Rule 4: an uncertain step read beside an episode's record of the same namespace is the episode's time."""
    uncertain = [i for i, v in enumerate(out) if v.kind == TIMING and v.meaning == "step" and v.certainty < 1.0]
    if not uncertain:
        return  # most windows: no series' names are split
    split = [_namespace(v.raw or v.name) for v in out]
    episodes: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for v, (namespace, last) in zip(out, split, strict=True):
        if EPISODE in last.lower():
            episodes[v.role, v.worker, namespace].append(last)
    for i in uncertain:
        v, (namespace, last) = out[i], split[i]
        episode = next((w for w in episodes.get((v.role, v.worker, namespace), ()) if w != last), "")
        if episode:
            out[i] = replace(v, meaning="", outside=True,
                             rule=f"{v.rule}; an episode's time beside {namespace}{episode}: no phase of the step")


def _namespace(name: str) -> tuple[str, str]:
    """(the namespace with its last separator, the last segment) of a series' name."""
    last = split_segments(name)[-1]
    return name[:len(name) - len(last)], last


def _siblings(out: list[SeriesView], members: list[int]) -> None:
    """Rule 1, decided on the meanings as read (the order of the names changes nothing): a sibling
    word takes its meaning where the phases of its prefix (less its own parts, ``x_render_binning``
    beside ``x_render``) meet one of its needs and do not hold that meaning already."""
    pending = [i for i in members if out[i].sibling and out[i].meaning != out[i].sibling
               and not (out[i].meaning and "_" not in out[i].stem)]  # a phase of one word (time/step) keeps it
    if not pending:
        return  # most windows: no sibling word
    levels = _Levels(out, members)
    for i in pending:
        v = out[i]
        beside = levels.beside(v)
        if v.sibling not in beside and any(need <= beside.keys() for need in SIBLING_NEEDS.get(v.sibling, ())):
            out[i] = replace(v, meaning=v.sibling, outside=False,
                             rule=f"{v.rule}; {v.sibling} beside {', '.join(sorted(beside.values())[:2])}")


class _Levels:
    """A label's phase timings ordered by stem, with running counts of each phase, so that what
    stands beside a sibling word (the phases whose stems start with its prefix, less its own parts)
    is a few bisections, not a pass over the label: a chain of nested prefixes (``x_render``,
    ``x_x_render``, ...) beside thousands of names made that pass about 1,100 n a window. Names of
    one word (``timing/render``, ``time/backward``: the namespace's durations) have the one-word
    names as siblings, not every name of the label."""

    __slots__ = ("_cum", "_one", "_pos", "_stems", "_names")

    def __init__(self, out: list[SeriesView], members: list[int]) -> None:
        ordered = sorted((j for j in members if out[j].meaning in BESIDE), key=lambda j: out[j].stem)
        self._stems = [out[j].stem for j in ordered]
        self._names = [out[j].raw or out[j].name for j in ordered]
        meanings = [out[j].meaning for j in ordered]
        self._pos: dict[str, list[int]] = defaultdict(list)
        for k, m in enumerate(meanings):
            self._pos[m].append(k)
        self._cum = {m: list(accumulate((x == m for x in meanings), initial=0)) for m in self._pos}
        self._one: dict[str, str] = {}
        for k, stem in enumerate(self._stems):
            if "_" not in stem:
                self._one.setdefault(meanings[k], self._names[k])

    def _range(self, prefix: str) -> tuple[int, int]:
        """The positions of the stems that start with ``prefix`` (which ends with ``_``)."""
        return bisect_left(self._stems, prefix), bisect_left(self._stems, prefix[:-1] + chr(ord("_") + 1))

    def beside(self, v: SeriesView) -> dict[str, str]:
        """Meaning -> a name, of the phase timings that share ``v``'s prefix, less ``v`` and its parts."""
        prefix = _prefix(v.stem)
        if not prefix:
            return {m: name for m, name in self._one.items() if m != v.meaning}
        lo, hi = self._range(prefix)
        own_lo, own_hi = self._range(v.stem + "_")  # its own parts are inside it
        me = v.raw or v.name
        found = {}
        for m, cum in self._cum.items():
            if cum[hi] - cum[lo] - (cum[own_hi] - cum[own_lo]) - (m == v.meaning) > 0:
                found[m] = self._first(m, (lo, hi), (own_lo, own_hi), me)
        return found

    def _first(self, m: str, span: tuple[int, int], own: tuple[int, int], me: str) -> str:
        """The first name of phase ``m`` in ``span`` outside ``own`` that is not ``me`` (one exists)."""
        pos = self._pos[m]
        k = bisect_left(pos, span[0])
        while k < len(pos) and pos[k] < span[1]:
            if own[0] <= pos[k] < own[1]:
                k = bisect_left(pos, own[1])
            elif self._names[pos[k]] == me:
                k += 1
            else:
                return self._names[pos[k]]
        return ""


def _containers(out: list[SeriesView], members: list[int], stems: _Stems) -> None:
    halves: _Halves | None = None  # made when first needed, kept up to date as splits change meanings
    for i in members:
        v = out[i]
        if v.meaning not in PHASES:
            continue
        parts = [j for j in stems.starting(v.stem + "_") if j != i and out[j].meaning in PARTS]
        if parts:
            for j, was in _split(out, i, parts):
                if halves is not None:
                    halves.gone(was, out[j].stem)
        elif v.meaning == "forward_backward":
            halves = _Halves(out, members) if halves is None else halves
            if not halves.beside(v.stem):
                continue
            out[i] = replace(v, meaning="", counted_in="forward, backward",
                             rule=f"{v.rule}; the sum of its forward and backward: not counted again")


def _split(out: list[SeriesView], i: int, parts: list[int]) -> list[tuple[int, str]]:
    """A phase timed with parts: the parts replace it where they are its own phase and another
    (DeepSpeed's backward = backward_inner + backward_allreduce) and no rule named it; parts of its
    own phase alone are inside it (``forward`` beside ``forward_attn``: the attention is not
    counted again); parts of other phases alone stay beside it. Returns the series whose meaning it
    took, each with the meaning it had."""
    v = out[i]
    meanings = {out[j].meaning for j in parts}
    names = ", ".join(sorted(out[j].raw or out[j].name for j in parts)[:3])
    if v.meaning in meanings and len(meanings) > 1 and not v.rule.startswith("mapping["):
        out[i] = replace(v, meaning="", counted_in=names,
                         rule=f"{v.rule}; the sum of its parts ({names}): not counted again")
        return [(i, v.meaning)]
    inside = [j for j in parts if out[j].meaning == v.meaning]
    for j in inside:
        out[j] = replace(out[j], meaning="", counted_in=v.raw or v.name,
                         rule=f"{out[j].rule}; a part of {v.raw or v.name}: counted there")
    return [(j, v.meaning) for j in inside]


def _prefix(stem: str) -> str:
    """A stem less its last word, with its ``_`` (``""`` for a stem of one word)."""
    return stem.rsplit("_", 1)[0] + "_" if "_" in stem else ""


class _Halves:
    """How many ``forward`` and ``backward`` timings of a label each prefix (``_prefix``) has, kept
    as splits take meanings: whether a ``forward_backward`` stands beside a forward and a backward
    of one prefix is then a lookup of its stem's prefixes, not a pass over the label (that pass,
    made again after each split, was quadratic in a flood of interleaved names)."""

    __slots__ = ("_counts",)

    def __init__(self, out: list[SeriesView], members: list[int]) -> None:
        self._counts: dict[str, Counter[str]] = {"forward": Counter(), "backward": Counter()}
        for j in members:
            if out[j].meaning in self._counts:
                self._counts[out[j].meaning][_prefix(out[j].stem)] += 1

    def gone(self, meaning: str, stem: str) -> None:
        """A series of ``stem`` no longer has ``meaning``."""
        if meaning in self._counts:
            self._counts[meaning][_prefix(stem)] -= 1

    def beside(self, stem: str) -> bool:
        """Whether a ``forward`` and a ``backward`` timing of the same prefix as each other stand
        beside a ``forward_backward`` of ``stem`` whose stem starts with that prefix: ``fwd_bwd``
        beside ``fwd`` and ``bwd``, not Megatron's ``forward-backward`` beside ``forward-compute``
        and ``backward-compute``."""
        forward, backward = self._counts["forward"], self._counts["backward"]
        prefixes = [""] + [stem[:k + 1] for k, c in enumerate(stem) if c == "_"]
        return any(forward[p] > 0 and backward[p] > 0 for p in prefixes)
