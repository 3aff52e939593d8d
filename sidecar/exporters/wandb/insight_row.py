"""The pipeline insight as one flat W&B row (``dict[str, float]``).

Keys look like ``pipeline/tokens_per_s/drafter``, ``pipeline/verdict_code``; the W&B exporter
adds its ``sidecar/`` prefix. Values the trainer does not publish are left out (W&B then draws a
gap, not a fake zero). docs/METRICS.md lists every key.
"""

from __future__ import annotations

from sidecar.model.insight import INSIGHT_VALUES, VERDICTS, PipelineInsight
from sidecar.model.meanings import REPORTED

PREFIX = "pipeline/"


def insight_row(insight: PipelineInsight) -> dict[str, float]:
    """One row for ``insight``: verdict (code and one-hot), evidence, and every derived metric."""
    row: dict[str, float] = {PREFIX + "verdict_code": float(insight.verdict.code)}
    for name in VERDICTS:
        row[f"{PREFIX}bottleneck/{name}"] = 1.0 if name == insight.verdict.name else 0.0
    for key, value in insight.verdict.evidence:
        row[f"{PREFIX}evidence/{key}"] = value
    for item in INSIGHT_VALUES:
        maybe = getattr(insight, item.attribute)
        if maybe is not None:
            row[PREFIX + item.wandb_key] = float(maybe)
    for role in insight.roles.values():
        row[f"{PREFIX}tokens_per_s/{role.role}"] = role.tokens_per_s
        row[f"{PREFIX}batches_per_s/{role.role}"] = role.batches_per_s
        for fig in REPORTED:
            if fig.meaning in role.reported:
                row[f"{PREFIX}reported/{fig.wandb_key}/{role.role}"] = role.reported[fig.meaning]
        if role.rate_cv is not None:
            row[f"{PREFIX}rate_cv/{role.role}"] = role.rate_cv
        for phase, share in role.time_share.items():
            row[f"{PREFIX}time_share/{role.role}/{phase}"] = share
    for w in insight.workers:
        base = f"{PREFIX}worker/{w.role}/{w.worker}/"
        row[base + "batches_per_s"] = w.batches_per_s
        row[base + "tokens_per_s"] = w.tokens_per_s
        if w.score is not None:
            row[base + "score"] = w.score
            row[base + "straggler"] = 1.0 if w.straggler else 0.0
    row[PREFIX + "throttled_gpus"] = float(len(insight.throttled_gpus))
    row[PREFIX + "verdict_confidence"] = insight.verdict.confidence
    for group, parts in insight.gpu_idle.items():
        for reason, value in parts.items():
            row[f"{PREFIX}gpu_idle/{group}/{reason}"] = value
    return row
