"""The node's figures for the cluster view (``sidecar.model.cluster``): which run the node serves,
its step time and its step split by phase class, from one window's insight and senders.

**Run label** (``cluster_run``): every daemon of a job must name the same run, so it is taken from
what all the job's processes share, the first of: the launcher's run label the shim announces
(``trainer_shim.run_label``: ``DFLASH_RUN_LABEL`` set by whoever launches the job, else
torchrun's ``TORCHELASTIC_RUN_ID``, else ``SLURM_JOB_ID``), then the W&B run id the shim
announces (usually only rank 0 has one, so the launcher's label comes first), else
``unlabelled``. Among a node's live senders of its main role, the label most of them name wins.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from sidecar.model.cluster import UNLABELLED_RUN, NodeFigures
from sidecar.model.insight import RoleInsight
from sidecar.model.meanings import BUSY_PHASES
from sidecar.model.window import SenderView

_KNOWN = ("comm_wait", "data_wait", "other", *BUSY_PHASES)


def cluster_run(hello: Mapping[str, Any] | None) -> str | None:
    """The run a sender names for the cluster (module docstring), None when it names none."""
    hello = hello or {}
    for key in ("run_label", "wandb_run_id"):
        value = hello.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def node_figures(roles: Mapping[str, RoleInsight], senders: Sequence[SenderView] | None,
                 duration_s: float) -> NodeFigures | None:
    """The node's figures from its main role (the one with the most workers among those with phase
    timings, as the single-role verdict reads): None when no role has phase timings or batches,
    and, where ``senders`` are told, when none of the role's senders is live or one started inside
    the window (a node's first window after a (re)start counts its ranks' batches over a part of
    it: its step time would read long, and the cluster rules would name it for its restart)."""
    timed = [r for r in roles.values() if r.time_share and r.batches_per_s > 0 and r.workers > 0]
    if not timed:
        return None
    main = max(timed, key=lambda r: (r.workers, r.role))
    if senders is not None:
        own = [s for s in senders if s.role == main.role]
        started = [s for s in own if s.first_seen_age_s is not None and s.first_seen_age_s < duration_s]
        if started or not any(s.live(duration_s) for s in own):
            return None
    share = main.time_share
    host = share.get("other", 0.0) if main.host_measured else 0.0
    parts = {"comm": share.get("comm_wait", 0.0), "data": share.get("data_wait", 0.0),
             "compute": sum(share.get(p, 0.0) for p in BUSY_PHASES), "host": host}
    rest = sum(v for k, v in share.items() if k not in _KNOWN) + (share.get("other", 0.0) - host)
    parts["unattributed"] = max(0.0, rest)
    names = Counter(cluster_run(s.hello) for s in senders or () if s.role == main.role and s.live(duration_s))
    named = [(n, c) for n, c in names.most_common() if n is not None]
    run = named[0][0] if named else UNLABELLED_RUN
    return NodeFigures(run, main.role, main.workers / main.batches_per_s, parts)
