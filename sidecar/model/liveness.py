"""One liveness policy: what a sender's silence means, and after how long, for every stage.

A shim sends at least a heartbeat every 2 s (``trainer_shim.flusher.HEARTBEAT_S``), so each
cut-off below is a count of missed heartbeats. Shortest first, the words they define: *sending*,
*gone*, *live*, *forgotten* (docs/ARCHITECTURE.md's glossary; ``tests/test_glossary.py`` keeps the
two in step).
"""

from __future__ import annotations

SENDING_S = 3.0
"""A sender silent for longer than this at a window's end left at its last message (seconds)."""

GONE_AFTER_S = 5.0
"""Seconds a gone process's tally waits (and each of its senders must have been silent) before it
is reconciled, so that its last frames, still in the kernel's socket buffer or ZeroMQ's queue when it
died, are counted as received first. With 1 s, a short-lived process's only batch arrived after
its reconciling on a box at load 9-19 (2 cores), and was counted as ``lost_at_exit`` (and its frame as
``after_exit``) instead of accepted."""

LIVE_S = 10.0
"""A sender is live while its last message is at most this old (seconds): five missed heartbeats
mean it is gone (killed, exited, or cut off). A sender that said it was closing
(``trainer_shim.wire.Hello.closing``: a clean exit) is live only in the window its last message
arrived in (``model.window.is_live``)."""

FORGET_AFTER_S = 600.0
"""A sender silent this long is forgotten (seconds; its cumulative counts stay in the role totals)."""
