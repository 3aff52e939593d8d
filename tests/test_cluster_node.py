"""The node's figures for the cluster rules: the run it serves (the launcher's label first, then
the W&B run, else ``unlabelled``), its step time and its step split by phase class, as the
``dflash_node_*`` families of a scrape; and the ``cluster`` command's screen of a view."""

from __future__ import annotations

import dataclasses
from pathlib import Path

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


def test_the_cluster_screen_names_the_node_and_lists_every_node_slowest_first() -> None:
    from sidecar.cli.cluster import ClusterView, Named, NodeRow, cluster_json, render, stretch_start

    assert stretch_start([100.0, 105.0, 130.0, 135.0, 140.0], 5.0) == 130.0  # named again after a gap
    assert stretch_start([], 5.0) is None
    shares = {"comm": 0.02, "data": 0.02, "compute": 0.93, "host": 0.02, "unattributed": 0.01}
    healthy = {"comm": 0.55, "data": 0.02, "compute": 0.4, "host": 0.02, "unattributed": 0.01}
    view = ClusterView("job", 0.55, [Named("n3", "compute-bound", 0.53, 6.36, 1000.0)],
                       [NodeRow("n3", 1.0, 2.18, shares, "balanced"),
                        NodeRow("n0", 1.0, 1.0, healthy, "communication-bound")])
    text = render(view, 1075.0)
    assert text.splitlines()[:3] == [
        "run job: 2 nodes; the median node waits 55% of its step in collectives",
        "n3 holds the others back: compute-bound, since 00:16:40 UTC (1m 15s)",
        "  its own work takes 0.530 s per step more than the median node's: the other nodes lose 6.36 GPU-hours "
        "per hour waiting"]
    rows = text.split("verdict\n", 1)[1].splitlines()
    assert rows[0].split() == ["n3", "1.000", "2.18", "2%", "2%", "93%", "2%", "1%", "balanced"]
    assert cluster_json(view)["named"][0]["host"] == "n3"
    quiet = render(ClusterView("job", 0.05, [], view.nodes), 1075.0)
    assert "no node holds the others back" in quiet


def test_the_w_and_b_cluster_row_is_wired_where_both_settings_are_given(tmp_path: Path) -> None:
    from sidecar.core import config
    from sidecar.core.daemon import Daemon

    given = {"wandb_run": "auto", "gpu_metrics": False, "state_dir": str(tmp_path)}
    names = [e.name for e in Daemon(config.load(given), host="n0").exporters]
    assert "wandb-cluster" not in names
    with_url = Daemon(config.load(given | {"wandb_cluster_prometheus": "http://prom:9090"}), host="n0")
    assert [e.name for e in with_url.exporters][-2:] == ["wandb", "wandb-cluster"]
    with pytest.raises(config.ConfigError, match="expected an http\\(s\\) URL"):
        config.load({"wandb_cluster_prometheus": "prom:9090"})
