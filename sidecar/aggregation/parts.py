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

1. A name read as ``step`` whose reading says it means another phase beside its siblings
   (``SeriesView.sibling``) takes that meaning when timings of the same label that share its
   prefix (its stem less the last word) time the forward and the backward (or both as one).
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

Each change is said in the series' ``rule`` (``explain`` shows it).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

from sidecar.model.meanings import PHASES
from sidecar.model.names import split_segments
from sidecar.model.window import TIMING, SeriesView

PARTS = tuple(p for p in PHASES if p != "forward_backward")
"""Phases that can be a part of another (``forward_backward`` contains, it is no part)."""
EPISODE = "episode"
"""In the last segment of a name of the same namespace, what makes an uncertain step read an
episode's time (rule 4): ``episode``, ``episode_reward``, ``EpisodeReturn``, ``num_episodes``."""


def settle(series: Sequence[SeriesView]) -> tuple[SeriesView, ...]:
    """``series`` with the phases of each (role, worker) settled (the rules above)."""
    out = list(series)
    labels: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, v in enumerate(out):
        if v.kind == TIMING and (v.meaning in PHASES or v.sibling) and v.stem:
            labels[v.role, v.worker].append(i)
    for members in labels.values():
        if len(members) < 2:
            continue
        stems = _Stems(out, members)
        _siblings(out, members, stems)
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


def _siblings(out: list[SeriesView], members: list[int], stems: _Stems) -> None:
    for i in members:
        v = out[i]
        if not v.sibling or v.meaning == v.sibling or "_" not in v.stem:
            continue
        prefix = v.stem.rsplit("_", 1)[0] + "_"
        beside = {out[j].meaning: out[j].raw or out[j].name for j in stems.starting(prefix)
                  if j != i and out[j].meaning in PHASES}
        if {"forward", "backward"} <= beside.keys() or "forward_backward" in beside:
            out[i] = replace(v, meaning=v.sibling,
                             rule=f"{v.rule}; {v.sibling} beside {', '.join(sorted(beside.values())[:2])}")


def _containers(out: list[SeriesView], members: list[int], stems: _Stems) -> None:
    halves: frozenset[str] | None = None  # made when first needed, again after a split changed meanings
    for i in members:
        v = out[i]
        if v.meaning not in PHASES:
            continue
        parts = [j for j in stems.starting(v.stem + "_") if j != i and out[j].meaning in PARTS]
        if parts:
            _split(out, i, parts)
            halves = None
        elif v.meaning == "forward_backward":
            halves = _halves(out, members) if halves is None else halves
            if not _beside_its_halves(v, halves):
                continue
            out[i] = replace(v, meaning="", counted_in="forward, backward",
                             rule=f"{v.rule}; the sum of its forward and backward: not counted again")


def _split(out: list[SeriesView], i: int, parts: list[int]) -> None:
    """A phase timed with parts: the parts replace it where they are its own phase and another
    (DeepSpeed's backward = backward_inner + backward_allreduce) and no rule named it; parts of its
    own phase alone are inside it (``forward`` beside ``forward_attn``: the attention is not
    counted again); parts of other phases alone stay beside it."""
    v = out[i]
    meanings = {out[j].meaning for j in parts}
    names = ", ".join(sorted(out[j].raw or out[j].name for j in parts)[:3])
    if v.meaning in meanings and len(meanings) > 1 and not v.rule.startswith("mapping["):
        out[i] = replace(v, meaning="", counted_in=names,
                         rule=f"{v.rule}; the sum of its parts ({names}): not counted again")
        return
    for j in parts:
        if out[j].meaning == v.meaning:
            out[j] = replace(out[j], meaning="", counted_in=v.raw or v.name,
                             rule=f"{out[j].rule}; a part of {v.raw or v.name}: counted there")


def _halves(out: list[SeriesView], members: list[int]) -> frozenset[str]:
    """The prefixes (a stem less its last word, with its ``_``; ``""`` for a stem of one word) that
    both a ``forward`` and a ``backward`` timing of ``members`` have."""
    def prefix(stem: str) -> str:
        return stem.rsplit("_", 1)[0] + "_" if "_" in stem else ""

    forward = {prefix(out[j].stem) for j in members if out[j].meaning == "forward"}
    backward = {prefix(out[j].stem) for j in members if out[j].meaning == "backward"}
    return frozenset(forward & backward)


def _beside_its_halves(fb: SeriesView, halves: frozenset[str]) -> bool:
    """Whether a ``forward`` and a ``backward`` timing of the same prefix as each other (``halves``)
    stand beside ``fb`` (a ``forward_backward`` whose stem starts with that prefix): ``fwd_bwd``
    beside ``fwd`` and ``bwd``, not Megatron's ``forward-backward`` beside ``forward-compute`` and
    ``backward-compute``. Each of its stem's prefixes is looked up, not each of ``halves``."""
    if "" in halves:
        return True
    return any(fb.stem[:k + 1] in halves for k, c in enumerate(fb.stem) if c == "_")
