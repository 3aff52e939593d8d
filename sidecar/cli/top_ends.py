"""``top``'s event line for senders' ends: each role's last end, from a scrape of
``dflash_sidecar_sender_last_exit_timestamp_seconds`` (docs/METRICS.md)."""

from __future__ import annotations

import time

from rich.text import Text

from sidecar.model.ends import ALERTING

Samples = dict[str, list[tuple[dict[str, str], float]]]


def ends_line(samples: Samples, now_unix_s: float | None = None) -> Text | None:
    """``ended: trainer/0 pid 4242 oom (cuda_oom on GPU 1) at step 57, 12 s ago · drafter/1 ...``
    (an end that was not intended in red), newest first; None before any end."""
    ends = sorted(samples.get("dflash_sidecar_sender_last_exit_timestamp_seconds", []), key=lambda lv: -lv[1])
    if not ends:
        return None
    now = time.time() if now_unix_s is None else now_unix_s
    line = Text("ended: ")
    for i, (labels, when) in enumerate(ends):
        how = labels.get("how", "")
        what = f"{labels.get('role', '')}/{labels.get('worker', '')} pid {labels.get('pid', '?')} {how}"
        if labels.get("signal"):
            what += f" ({labels['signal']})"
        if labels.get("cause") and labels["cause"] != "signal":
            what += f" ({labels['cause']}" + (f" on GPU {labels['gpu']})" if labels.get("gpu") else ")")
        if labels.get("step"):
            what += f" at step {labels['step']}"
        what += f", {max(0.0, now - when):.0f} s ago"
        line.append((" · " if i else "") + what, style="red" if how in ALERTING else "")
    return line
