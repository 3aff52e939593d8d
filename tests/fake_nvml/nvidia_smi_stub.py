"""A stand-in ``nvidia-smi`` for the GPU check's readings comparison: it answers ``--query-gpu``
with fixed readings that match (GPU 0) or differ from (GPU 1) what the tests script into the fake
NVML driver, so the comparison is known to work, and to catch a mismatch, without a GPU."""

STUB = '''
import sys
HELP = """List of valid properties to query for the switch "--query-gpu":

"index"
Zero based index of the GPU.

"utilization.gpu"
"utilization.memory"
"memory.total"
"memory.used"
"memory.free"
"power.draw"
"enforced.power.limit"
"temperature.gpu"
"temperature.memory"
"clocks.current.sm" or "clocks.sm"
"clocks.current.memory" or "clocks.mem"
"clocks_event_reasons.active" or "clocks_throttle_reasons.active"
"ecc.errors.corrected.volatile.total"
"ecc.errors.uncorrected.volatile.total"
"""
GPUS = {
    0: {"utilization.gpu": "55", "utilization.memory": "30", "memory.total": "81920", "memory.used": "10240",
        "memory.free": "70656", "power.draw": "301.50", "enforced.power.limit": "700.00", "temperature.gpu": "45",
        "temperature.memory": "50", "clocks.sm": "1980", "clocks.mem": "2619",
        "clocks_event_reasons.active": "0x0000000000000004", "ecc.errors.corrected.volatile.total": "0",
        "ecc.errors.uncorrected.volatile.total": "0"},
}
GPUS[1] = dict(GPUS[0], **{"power.draw": "150.00", "temperature.memory": "[N/A]"})
if "--help-query-gpu" in sys.argv:
    print(HELP)
    sys.exit(0)
if "dmon" in sys.argv:
    print("# gpu  rxpci  txpci")
    print("# Idx   MB/s   MB/s")
    print("    0   2000   1000")
    print("    1   2000     10")
    sys.exit(0)
fields = next(a for a in sys.argv if a.startswith("--query-gpu=")).split("=", 1)[1].split(",")
for index, values in GPUS.items():
    print(", ".join(str(index) if f == "index" else values.get(f, "[Not Supported]") for f in fields))
'''
