"""What the hello says about the run beyond W&B: a run label from the launcher, and the model's
FLOPs per token. Read from the environment once, when the publisher is made.

**Run label** (the daemon's run ledger is per run: the W&B run id when the trainer has one, else
this label, else the host cut at idle gaps; docs/METRICS.md, "Run ledger"). The first of:

- ``DFLASH_RUN_LABEL``: set by whoever launches the run (or ``configure(run_label=...)``), as is;
- ``TORCHELASTIC_RUN_ID`` (torchrun's rendezvous id; ``--standalone`` makes a fresh one per
  launch; torchrun's restarts of failed workers keep it) as ``torchelastic:<id>``, unless it is
  ``none`` (torchrun's default without ``--rdzv-id``);
- ``SLURM_JOB_ID`` as ``slurm:<job>``, with ``.<step>`` from ``SLURM_STEP_ID`` under ``srun``
  (a requeued job keeps its id: one run; each ``srun`` of an allocation is a run of its own).

Every process of a run inherits these (DataLoader workers, spawn children), so all its senders
name the same run; ``configure()`` exports an explicit label to the environment for them.

**FLOPs per token**: ``DFLASH_FLOPS_PER_TOKEN`` (or ``configure(flops_per_token=...)``), the model
FLOPs per trained token (forward and backward, e.g. 6 x parameters), for the ledger's MFU.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping

RUN_LABEL_ENV = "DFLASH_RUN_LABEL"
FLOPS_ENV = "DFLASH_FLOPS_PER_TOKEN"
MAX_LABEL_CHARS = 200
"""Longer labels are cut (the daemon keeps hello strings of up to 256 characters)."""
MAX_FLOPS_PER_TOKEN = 1e18

log = logging.getLogger("trainer_shim")


def run_label(environ: Mapping[str, str] = os.environ) -> str | None:
    """The run label by the rule of the module docstring, or None when nothing names the run."""
    explicit = environ.get(RUN_LABEL_ENV, "").strip()
    if explicit:
        return explicit[:MAX_LABEL_CHARS]
    rdzv = environ.get("TORCHELASTIC_RUN_ID", "").strip()
    if rdzv and rdzv != "none":
        return f"torchelastic:{rdzv}"[:MAX_LABEL_CHARS]
    job = environ.get("SLURM_JOB_ID", "").strip()
    if job:
        step = environ.get("SLURM_STEP_ID", "").strip()
        return (f"slurm:{job}.{step}" if step else f"slurm:{job}")[:MAX_LABEL_CHARS]
    return None


def check_flops(value: float) -> float:
    """``value`` as a float when it is a model's FLOPs per token (1 to 1e18). Raises
    ``ValueError`` otherwise (NaN too)."""
    flops = float(value)
    if not (math.isfinite(flops) and 1.0 <= flops <= MAX_FLOPS_PER_TOKEN):
        raise ValueError(f"flops_per_token must be between 1 and {MAX_FLOPS_PER_TOKEN:g}, not {value!r}")
    return flops


def flops_from_env(environ: Mapping[str, str] = os.environ) -> float | None:
    """``DFLASH_FLOPS_PER_TOKEN`` as a number, None when unset; an unusable value is left out
    with one warning (the environment is no place to raise into the trainer from)."""
    raw = environ.get(FLOPS_ENV, "").strip()
    if not raw:
        return None
    try:
        return check_flops(float(raw))
    except ValueError:
        log.warning("trainer_shim: %s=%r is not a number of FLOPs per token (1 to 1e18); no MFU is stated",
                    FLOPS_ENV, raw)
        return None
