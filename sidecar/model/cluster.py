"""What one node tells the cluster: its run, its step time and where the step goes, by phase class.

The daemons of a data-parallel job never talk to each other; Prometheus joins them (the recording
rules of ``deploy/prometheus/rules/dflash-nodes.yml``). In such a job every rank's step takes as
long as the slowest rank's, so the step time alone does not tell the slow node: the share of the
step each node spends waiting in collectives does (the healthy nodes wait for the slow one), and
what the slow node spends its own time on tells why. docs/DEPLOY.md, "Many nodes", explains the
rules; docs/METRICS.md lists the families.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PHASE_CLASSES: tuple[str, ...] = ("comm", "data", "compute", "host", "unattributed")
"""The classes a node's step time is split into (``NodeFigures.shares``): collective waits
(``comm_wait``), data-loader waits (``data_wait``), the busy phases (forward, backward, optimizer,
pack, ...), measured host time between timed phases, and the rest (unmapped timings, other waits,
a gap that is not measured host time). They sum to 1 where the role's shares do."""

UNLABELLED_RUN = "unlabelled"
"""The run label of a node whose trainers name no run (``sidecar.aggregation.cluster.cluster_run``):
every such node of one Prometheus is taken as one run."""


@dataclass(frozen=True, slots=True)
class NodeFigures:
    """One node's figures for the cluster rules, for one window: the run its main role's live
    senders name, that role, its step time (seconds per step of one rank: the role's workers over
    its batch rate), and ``shares``: phase class (``PHASE_CLASSES``) -> share of the step (0-1)."""

    run: str
    role: str
    step_s: float
    shares: Mapping[str, float]


HOSTS_SERIES = "run:dflash_node_hosts:count"
"""The recorded series of the straggler rules that readers query (deploy/prometheus/rules/
dflash-node.yml, dflash-stragglers.yml; tests check the rules record each): nodes per run."""
NAMED_SERIES = "run_host_cause:dflash_node_straggler:excess_seconds"
"""The node the others wait for, with its cause: seconds per step its work exceeds the median's."""
HELD_SERIES = "run_host:dflash_node_straggler:excess_seconds"
"""The same without the cause (its stretch does not break when the cause changes)."""
LOST_SERIES = "run_host_cause:dflash_node_straggler:lost_gpu_hours_per_hour"
"""GPU-hours per hour the run's other nodes lose waiting for the named node."""
