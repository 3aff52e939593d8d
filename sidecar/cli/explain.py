"""``dflash-sidecar explain``: fetches the daemon's ``/explain`` report
(``sidecar.processing.explain.explain_data``, served as JSON beside ``/metrics``) and prints it."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def format_text(data: dict[str, Any]) -> str:
    lines = [f"verdict: {data.get('verdict') or 'no window yet'}", "", "series seen:"]
    rows = data.get("series", [])
    if not rows:
        lines.append("  (none yet)")
    for s in rows:
        lines.append(f"  {s['role']}/{s['worker']} {s['kind']} {s['name']!r} -> {s['meaning']} "
                     f"[{s['rule']}; {s['form']}]")
    lines += ["", "missing inputs, per verdict:"]
    if not data.get("missing"):
        lines.append("  none")
    for verdict, lack in data.get("missing", {}).items():
        lines.append(f"  {verdict}:")
        for item in lack:
            lines.append(f"    {item['input']}: {item['supply']}")
    unused = data.get("unused_rules") or []
    if unused:
        lines += ["", "mapping rules that matched no series yet:"] + [f"  {u}" for u in unused]
    if data.get("config"):
        lines += ["", "config for the unmapped timings (paste into the --config file):", "", data["config"]]
    return "\n".join(lines)


def run_explain(url: str, as_json: bool = False) -> int:
    """Print the explain report of the daemon at ``url`` (``http://HOST:PORT/explain``)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            data = json.loads(resp.read().decode())
    except (OSError, ValueError) as exc:
        print(f"dflash-sidecar explain: cannot read {url}: {exc}; is the daemon running (see --prometheus-addr)? "
              "For a run that ended: dflash-sidecar explain --run ID (or report), from the run ledger")
        return 1
    print(json.dumps(data, indent=2) if as_json else format_text(data))
    return 0
