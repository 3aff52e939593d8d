"""Prometheus families of the pipeline insight (``dflash_pipeline_*``), built at scrape time.

``insight_families(insight, host)`` renders one ``PipelineInsight``: the window's
(``IngestReport.insight``). Values the trainer does not publish are absent, never zero.
docs/METRICS.md lists every family with its meaning and unit.
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily, Metric

from sidecar.model.cluster import PHASE_CLASSES
from sidecar.model.insight import INSIGHT_VALUES, VERDICTS, PipelineInsight
from sidecar.model.meanings import REPORTED

P = "dflash_pipeline_"


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(P + name, doc, labels=["host"] + labels)


def insight_families(insight: PipelineInsight, host: str) -> list[Metric]:
    """Every ``dflash_pipeline_*`` family for one window."""
    h = [host]
    verdict = _gauge("bottleneck", "Bottleneck verdict of the last window as a state set: 1 for the current "
                     "verdict, 0 for the others.", ["verdict"])
    for name in VERDICTS:
        verdict.add_metric(h + [name], 1.0 if name == insight.verdict.name else 0.0)
    conf = _gauge("verdict_confidence_ratio", "Confidence of the bottleneck verdict (0-1: 0.5 at its deciding "
                  "threshold, 1 a threshold's worth past it); absent while the verdict is unknown or idle.", [])
    if insight.verdict.name not in ("unknown", "idle"):
        conf.add_metric(h, insight.verdict.confidence)
    families: list[Metric] = [verdict, conf, *_role_families(insight, host), *_worker_families(insight, host),
                              *_idle_families(insight, host), *_node_families(insight, host)]
    for item in INSIGHT_VALUES:
        value = getattr(insight, item.attribute)
        if value is not None:
            fam = _gauge(item.name, item.help, [])
            fam.add_metric(h, value)
            families.append(fam)
    return families


def _role_families(insight: PipelineInsight, host: str) -> list[Metric]:
    tokens = _gauge("tokens_per_second", "Tokens processed per second by the role's workers (last window).", ["role"])
    batches = _gauge("batches_per_second", "Batches processed per second by the role's workers (last window).",
                     ["role"])
    cv = _gauge("rate_cv_ratio", "Coefficient of variation (std/mean) of the role's per-worker batch rates.", ["role"])
    share = _gauge("time_share_ratio", "Share of the role's wall time per step phase, mean over its workers "
                   "(0-1; 'other' is time no phase timing covers).", ["role", "phase"])
    reported = {fig.meaning: _gauge("reported_" + fig.family, fig.help, ["role"]) for fig in REPORTED}
    for role in insight.roles.values():
        for meaning, value in role.reported.items():
            reported[meaning].add_metric([host, role.role], value)
        tokens.add_metric([host, role.role], role.tokens_per_s)
        batches.add_metric([host, role.role], role.batches_per_s)
        if role.rate_cv is not None:
            cv.add_metric([host, role.role], role.rate_cv)
        for phase, value in role.time_share.items():
            share.add_metric([host, role.role, phase], value)
    return [tokens, batches, cv, share, *reported.values()]


def _worker_families(insight: PipelineInsight, host: str) -> list[Metric]:
    labels = ["role", "worker"]
    batches = _gauge("worker_batches_per_second", "Batches per second of one worker (last window).", labels)
    tokens = _gauge("worker_tokens_per_second", "Tokens per second of one worker (last window).", labels)
    score = _gauge("worker_score_ratio", "Worker performance relative to the best worker of its role (0-1, 1 = "
                   "best): best median busy time per batch over its own.", labels)
    straggler = _gauge("straggler", "1 when the worker's score is below the straggler threshold, else 0.", labels)
    for w in insight.workers:
        key = [host, w.role, w.worker]
        batches.add_metric(key, w.batches_per_s)
        tokens.add_metric(key, w.tokens_per_s)
        if w.score is not None:
            score.add_metric(key, w.score)
            straggler.add_metric(key, 1.0 if w.straggler else 0.0)
    return [batches, tokens, score, straggler]


def _idle_families(insight: PipelineInsight, host: str) -> list[Metric]:
    idle = _gauge("gpu_idle_ratio", "Idle share of the GPU group's GPUs (1 - GPM SM activity, else 1 - NVML "
                  "utilization), latest poll (0-1).", ["group"])
    split = _gauge("gpu_idle_reason_ratio", "The GPU group's idle share split by what its role did meanwhile: "
                   "data, queue, collectives, host, unexplained (0-1; the reasons sum to "
                   "dflash_pipeline_gpu_idle_ratio).",
                   ["group", "reason"])
    for group, parts in insight.gpu_idle.items():
        idle.add_metric([host, group], parts["idle"])
        for reason, value in parts.items():
            if reason != "idle":
                split.add_metric([host, group, reason], value)
    return [idle, split] if insight.gpu_idle else []


def _node_families(insight: PipelineInsight, host: str) -> list[Metric]:
    """``dflash_node_*``: the node's figures for the cluster rules (``sidecar.model.cluster``), 6
    series per node: its step time and its step split into the five phase classes, labelled with
    the run it serves."""
    node = insight.node
    if node is None:
        return []
    step = GaugeMetricFamily("dflash_node_step_seconds", "Step time of one rank of the node's main role (last "
                             "window, seconds), labelled with the run the node serves.", labels=["host", "run"])
    step.add_metric([host, node.run], node.step_s)
    share = GaugeMetricFamily("dflash_node_step_share_ratio", "Share of the node's step by phase class: comm "
                              "(collective waits), data (data-loader waits), compute (busy phases), host (measured "
                              "host time), unattributed (0-1).", labels=["host", "run", "class"])
    for name in PHASE_CLASSES:
        share.add_metric([host, node.run, name], node.shares.get(name, 0.0))
    return [step, share]
