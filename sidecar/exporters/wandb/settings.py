"""The W&B exporter's settings (``sidecar.model.settings``): which run to join, where, and how
many rows it may hold. ``WandbConfig`` (the exporter's constructor argument) checks its run id and
queue size with these same declarations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlparse

from sidecar.model.settings import declared, setting


def run_id(raw: Any) -> str:
    """A W&B run id or ``auto``. Raises ``ValueError`` for an empty one or one with a slash or space."""
    value = str(raw)
    if not value.strip() or any(c in value for c in "/ \t"):
        raise ValueError("expected a W&B run id or 'auto'")
    return value


def prometheus_url(raw: Any) -> str:
    """An http(s) URL with a host. Raises ``ValueError`` otherwise."""
    value = str(raw).strip()
    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError("expected an http(s) URL such as http://prometheus:9090")
    return value


@dataclass(frozen=True)
class WandbSettings:
    """Which W&B run the sidecar writes into (docs/WANDB.md). Unset ``wandb_run``: no W&B export."""

    TITLE: ClassVar[str] = "W&B"
    """The options' group in ``--help`` and the docs."""

    wandb_run: str | None = setting(None, check=run_id, metavar="ID|auto", help=(
        "W&B run id to join (shared mode), or 'auto' to follow the run the trainer's shim announces. "
        "Unset: no W&B export."),
        summary="join the trainer's W&B run in shared mode, or follow the run its shim announces "
                "(docs/WANDB.md); unset: no W&B export")
    wandb_project: str | None = setting(
        None, metavar="P", help="W&B project where the trainer's shim announces none (default: $WANDB_PROJECT; the "
             "sidecar's own offline run without either: dflash-sidecar).",
        summary="W&B project where the trainer announces none (default: $WANDB_PROJECT, offline: dflash-sidecar)")
    wandb_entity: str | None = setting(
        None, metavar="E", help="W&B entity where the trainer's shim announces none (default: $WANDB_ENTITY).",
        summary="W&B entity where the trainer announces none (default: $WANDB_ENTITY)")
    wandb_queue: int = setting(256, check=int, bounds=(1, 100_000), unit="rows", metavar="N",
                               help="Rows the W&B exporter may queue before dropping (counted).")
    wandb_cluster_prometheus: str | None = setting(None, check=prometheus_url, metavar="URL", help=(
        "Prometheus base URL (e.g. http://prometheus:9090) whose straggler rules the daemon reads every 30 s "
        "to log the cluster's verdict into the W&B run: the node the others wait for, its cost (docs/DEPLOY.md, "
        "'Many nodes'). Unset: none."))


RUN, _, _, QUEUE, _ = declared(WandbSettings)
"""The declarations ``WandbConfig.validate`` applies (run id, queue size)."""
