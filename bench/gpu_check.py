"""The whole GPU check, one command for a GPU machine: ``python bench/gpu_check.py``.

Runs, one after the other, with their output as they print it:

1. ``gpu_check_shim.py``: zero synchronization of every shim call inside
   ``torch.cuda.set_sync_debug_mode("error")`` in a bf16 training loop, scalar values checked,
   step throughput with and without the shim (issue 2);
2. ``gpu_check_nvml.py``: the daemon's NVML readings next to ``nvidia-smi --query-gpu`` for every
   field, and the NVML cost per poll on real hardware (issue 4).

Exit status: 0 when both passed, else the first failing status. ``--out FILE`` also writes the
combined output to FILE (for ``bench/RESULTS*.md``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHECKS = ("gpu_check_shim.py", "gpu_check_nvml.py")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="also write the combined output here")
    args = parser.parse_args()
    status = 0
    lines: list[str] = []
    for script in CHECKS:
        header = f"===== {script} ====="
        print(header, flush=True)
        lines.append(header)
        proc = subprocess.Popen([sys.executable, str(HERE / script)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            lines.append(line.rstrip("\n"))
        rc = proc.wait()
        lines.append(f"===== {script}: exit {rc} =====")
        print(lines[-1], flush=True)
        status = status or rc
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
