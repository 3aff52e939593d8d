"""Exponential back-off between retries, shared by the NVML source and the W&B exporter."""

from __future__ import annotations


class Backoff:
    """Delays of ``first_s``, then doubling, capped at ``max_s`` from the second on; ``reset()``
    after a success. Not thread-safe: each user keeps its own on the thread that retries."""

    def __init__(self, first_s: float, max_s: float) -> None:
        """Raises ``ValueError`` unless both are > 0."""
        if not (first_s > 0 and max_s > 0):
            raise ValueError(f"back-off delays must be > 0, got {first_s!r} and {max_s!r}")
        self.first_s = first_s
        self.max_s = max_s
        self.delay_s = first_s
        """The wait before the next retry (seconds)."""

    def failed(self) -> float:
        """An attempt failed: the wait before the next one; the one after will be twice as long."""
        delay = self.delay_s
        self.delay_s = min(delay * 2, self.max_s)
        return delay

    def reset(self) -> None:
        """An attempt succeeded: the next failure waits ``first_s`` again."""
        self.delay_s = self.first_s
