"""Low-rate sampling of the CUDA caching allocator's host-side counters.

``torch.cuda.memory_allocated`` and friends read the allocator's own bookkeeping on the host: no
CUDA call, no synchronization. The sampler never imports torch and never initializes CUDA: it only
samples when the trainer has imported torch and CUDA is already initialized.
"""

from __future__ import annotations

import sys
from typing import Protocol


class _Sink(Protocol):
    def append_allocator(self, device: int, allocated: int, reserved: int, max_reserved: int) -> None: ...


class AllocatorSampler:
    """Samples every ``interval_s`` seconds (0 disables) when called from the flusher."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._next = 0.0

    def due(self, now: float) -> bool:
        """True when a sample is due at monotonic time ``now`` (seconds)."""
        return self.interval_s > 0 and now >= self._next

    def sample(self, sink: _Sink, now: float | None = None) -> int:
        """Append one sample per device the process has allocated on; returns how many."""
        import time

        self._next = (time.monotonic() if now is None else now) + self.interval_s
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        if cuda is None or not cuda.is_initialized():
            return 0
        n = 0
        for device in range(cuda.device_count()):
            reserved = cuda.memory_reserved(device)
            if reserved == 0:
                continue
            sink.append_allocator(device, cuda.memory_allocated(device), reserved,
                                  cuda.max_memory_reserved(device))
            n += 1
        return n
