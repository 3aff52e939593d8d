"""The shared back-off: doubling delays, capped, reset after a success."""

from __future__ import annotations

import pytest

from sidecar.model.backoff import Backoff


def test_doubles_up_to_the_cap_and_resets() -> None:
    b = Backoff(5.0, 30.0)
    assert [b.failed() for _ in range(5)] == [5.0, 10.0, 20.0, 30.0, 30.0]
    assert b.delay_s == 30.0
    b.reset()
    assert b.delay_s == 5.0 and b.failed() == 5.0


def test_a_first_delay_above_the_cap_is_kept_once() -> None:
    b = Backoff(10.0, 4.0)  # what the NVML source's loops did before the helper
    assert [b.failed() for _ in range(3)] == [10.0, 4.0, 4.0]


@pytest.mark.parametrize("first, cap", [(0.0, 1.0), (1.0, 0.0), (-1.0, 5.0)])
def test_rejects_non_positive_delays(first: float, cap: float) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        Backoff(first, cap)
