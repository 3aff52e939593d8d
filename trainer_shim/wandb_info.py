"""What the trainer's own W&B run is, read without importing wandb (only if the trainer did)."""

from __future__ import annotations

import sys
from typing import Any


def wandb_run_info() -> tuple[Any, ...]:
    """``(run_id, project, entity, mode, primary)`` of the trainer's active W&B run, or ``()``
    when wandb is not imported or no run is active. Never raises."""
    wandb = sys.modules.get("wandb")
    run = getattr(wandb, "run", None) if wandb is not None else None
    if run is None:
        return ()
    try:
        settings = run.settings
        return (
            run.id,
            run.project,
            run.entity,
            getattr(settings, "mode", None),
            getattr(settings, "x_primary", None),
        )
    except Exception:  # noqa: BLE001 - a half-initialized or finished run
        return ()
