"""XID error events through NVML's event set API.

One event set for all GPUs; each GPU that supports ``nvmlEventTypeXidCriticalError`` is
registered at start. Every poll drains the set with ``nvmlEventSetWait`` and a 0 ms timeout
(``NVML_ERROR_TIMEOUT`` means "no more events"), so the poller never blocks on it. Only events
raised after registration are seen: the counts start at 0 when the source starts.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from sidecar.sources.nvml_driver import TIMEOUT, GpuLostError, NvmlCallError, NvmlDriver, Outcome, constant

XID_EVENT = constant("nvmlEventTypeXidCriticalError", 0x8)
MAX_EVENTS_PER_POLL = 256
MAX_LOGGED_PER_GPU = 10


class XidWatcher:
    """Registers GPUs for XID events and hands each event to ``on_xid(gpu index, xid code)``."""

    def __init__(self, driver: NvmlDriver, log: logging.Logger, on_xid: Callable[[int, int], None]) -> None:
        self._driver = driver
        self._log = log
        self._on_xid = on_xid
        self._event_set: Any = None
        self._gpu_by_handle: dict[int, int] = {}
        self._logged: dict[int, int] = {}

    def setup(self, handles: Sequence[tuple[int, Any]]) -> set[int]:
        """Register ``(index, handle)`` pairs; returns the indices that will report XIDs."""
        outcome, event_set = self._driver.try_call("nvmlEventSetCreate")
        if outcome is not Outcome.OK:
            return set()
        self._event_set = event_set
        for index, handle in handles:
            try:
                outcome, supported = self._driver.try_call("nvmlDeviceGetSupportedEventTypes", handle, gpu=index)
                if outcome is not Outcome.OK or not supported & XID_EVENT:
                    continue
                outcome, _ = self._driver.try_call("nvmlDeviceRegisterEvents", handle, XID_EVENT, event_set, gpu=index)
            except GpuLostError:
                continue  # the GPU's own poll reports the loss
            if outcome is Outcome.OK:
                self._gpu_by_handle[self._driver.handle_key(handle)] = index
        if not self._gpu_by_handle:
            self.close()
        return set(self._gpu_by_handle.values())

    def drain(self) -> None:
        """Hand over every pending event without waiting."""
        if self._event_set is None:
            return
        for _ in range(MAX_EVENTS_PER_POLL):
            try:
                data = self._driver.call_raw("nvmlEventSetWait", self._event_set, 0, label="nvmlEventSetWait_v2")
            except NvmlCallError as exc:
                if exc.code != TIMEOUT:
                    with contextlib.suppress(GpuLostError):  # a GPU fell off; its own poll reports it
                        self._driver.classify(exc, None)
                return
            if data.eventType & XID_EVENT:
                self._deliver(self._gpu_by_handle.get(self._driver.handle_key(data.device)), int(data.eventData))

    def _deliver(self, index: int | None, xid: int) -> None:
        if index is None:
            return
        logged = self._logged.get(index, 0)
        if logged < MAX_LOGGED_PER_GPU:
            self._logged[index] = logged + 1
            suffix = " (further XIDs on this GPU are counted, not logged)" if logged + 1 == MAX_LOGGED_PER_GPU else ""
            self._log.warning("GPU %d: XID %d%s", index, xid, suffix)
        self._on_xid(index, xid)

    def close(self) -> None:
        """Free the event set (poller thread, at shutdown)."""
        if self._event_set is not None:
            self._driver.try_call("nvmlEventSetFree", self._event_set)
            self._event_set = None
