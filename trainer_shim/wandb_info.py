"""What the trainer's own W&B run is, read without importing wandb (only if the trainer did)."""

from __future__ import annotations

import sys

WandbRunInfo = tuple[()] | tuple[str | None, str | None, str | None, str | None, bool | None]
"""``()``, or ``(run_id, project, entity, mode, primary)`` (see ``wandb_run_info``)."""


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def wandb_run_info() -> WandbRunInfo:
    """``(run_id, project, entity, mode, primary)`` of the trainer's active W&B run, or ``()``
    when wandb is not imported or no run is active. Strings or None, ``primary`` a bool or None,
    so the hello always encodes. Never raises."""
    wandb = sys.modules.get("wandb")
    run = getattr(wandb, "run", None) if wandb is not None else None
    if run is None:
        return ()
    try:
        # run.settings is a deep copy in wandb 0.31; the private original is much cheaper.
        settings = getattr(run, "_settings", None) or run.settings
        primary = getattr(settings, "x_primary", None)
        return (
            _str(run.id),
            _str(getattr(run, "project", None)),
            _str(getattr(run, "entity", None)),
            _str(getattr(settings, "mode", None)),
            primary if isinstance(primary, bool) else None,
        )
    except Exception:  # noqa: BLE001 - a half-initialized or finished run
        return ()
