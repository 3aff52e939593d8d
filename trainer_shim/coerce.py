"""The flusher's msgpack encode hook, shared by the publisher (its encoder) and the channel (strict
mode checks a value as the daemon will receive it). Standard library only."""

from __future__ import annotations

import logging
import operator
from typing import Any

log = logging.getLogger("trainer_shim")


def coerce(obj: Any) -> Any:
    """msgspec encode hook for values that are not plain numbers: numpy scalars and 1-element CPU
    tensors become ints or floats; a CUDA tensor is never touched (that would synchronize) and,
    like anything else unconvertible, becomes None, which the daemon rejects and counts as
    ``invalid_value``."""
    if getattr(obj, "is_cuda", False) or getattr(getattr(obj, "device", None), "type", "cpu") != "cpu":
        warn_once("device", "telemetry: a tensor on a device was passed as a plain value and "
                  "dropped (reading it would synchronize); use telemetry.scalar(name, tensor)")
        return None
    try:
        if hasattr(obj, "__index__") and not hasattr(obj, "numel"):
            return operator.index(obj)
        return float(obj)
    except Exception:  # noqa: BLE001
        warn_once(type(obj).__name__, f"telemetry: a {type(obj).__name__} is not a number and "
                  "was dropped (set DFLASH_TELEMETRY_STRICT=1 to raise at the call site)")
        return None


_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """Log ``message`` as a warning the first time ``key`` is seen in this process."""
    if key not in _warned:
        _warned.add(key)
        log.warning(message)
