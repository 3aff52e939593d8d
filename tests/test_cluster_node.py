"""The node's figures for the cluster rules: the run it serves (the launcher's label first, then
the W&B run, else ``unlabelled``), its step time and its step split by phase class, as the
``dflash_node_*`` families of a scrape."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import CollectorRegistry

from sidecar.aggregation.cluster import cluster_run
from sidecar.aggregation.insight import compute_insight
from sidecar.exporters.prometheus.insight import insight_families
from sidecar.model.cluster import PHASE_CLASSES, UNLABELLED_RUN
from tests.insight_synth import report, sender, worker

DDP = {"data_wait": 5, "forward": 20, "backward": 30, "optimizer": 5, "comm_wait": 40}  # ms per step


def test_the_launchers_label_names_the_run_before_the_wandb_run() -> None:
    assert cluster_run({"run_label": "torchelastic:job7", "wandb_run_id": "abc123"}) == "torchelastic:job7"
    assert cluster_run({"run_label": " ", "wandb_run_id": "abc123"}) == "abc123"
    assert cluster_run({"host": "n0"}) is None and cluster_run(None) is None


def test_a_node_reports_its_step_and_its_split_by_class_for_the_run_most_of_its_ranks_name() -> None:
    series = worker("trainer", "0", DDP, 10) + worker("trainer", "1", DDP, 10)
    hellos = [{"run_label": "slurm:42"}, {"run_label": "slurm:42"}]
    senders = tuple(dataclasses.replace(sender("trainer", str(i), sender_id=i + 1), hello=h)
                    for i, h in enumerate(hellos))
    node = compute_insight(report(series, senders=senders).window, None, None, senders).node
    assert node is not None and node.run == "slurm:42" and node.role == "trainer"
    assert node.step_s == pytest.approx(0.1)  # 10 steps per rank in a 1 s window
    assert node.shares["comm"] == pytest.approx(0.4) and node.shares["data"] == pytest.approx(0.05)
    assert node.shares["compute"] == pytest.approx(0.55) and sum(node.shares.values()) == pytest.approx(1.0)
    # the first window after a rank (re)started counts its batches over a part of it: not reported
    restarted = (senders[0], dataclasses.replace(senders[1], first_seen_age_s=0.4))
    assert compute_insight(report(series, senders=restarted).window, None, None, restarted).node is None
    # no rank names a run: the node is unlabelled (one run for all such nodes of a Prometheus)
    rep = report(series)
    node = compute_insight(rep.window, None, None, rep.senders).node
    assert node is not None and node.run == UNLABELLED_RUN


def test_the_node_families_are_six_series_labelled_with_host_and_run() -> None:
    series = worker("trainer", "0", DDP, 10)
    senders = (dataclasses.replace(sender("trainer", "0"), hello={"wandb_run_id": "abc123"}),)
    insight = compute_insight(report(series, senders=senders).window, None, None, senders)
    registry = CollectorRegistry()

    class _Fixed:
        def collect(self):  # type: ignore[no-untyped-def]
            return insight_families(insight, "n3")

    registry.register(_Fixed())
    node = {"host": "n3", "run": "abc123"}
    assert registry.get_sample_value("dflash_node_step_seconds", node) == pytest.approx(0.1)
    for name in PHASE_CLASSES:
        assert registry.get_sample_value("dflash_node_step_share_ratio", node | {"class": name}) is not None
    samples = [s for f in registry.collect() if f.name.startswith("dflash_node_") for s in f.samples]
    assert len(samples) == 6
    # a window without phase timings has no node figures, and no dflash_node_* series
    quiet = compute_insight(report([]).window, None, None, ())
    assert quiet.node is None and not [f for f in insight_families(quiet, "n3") if f.name.startswith("dflash_node")]
