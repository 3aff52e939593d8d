"""What the straggler rules cost Prometheus at many nodes: series per node, rule evaluation time
and Prometheus's memory at 16, 64 and 256 simulated nodes (docs/DEPLOY.md, "Many nodes").

One real daemon page is captured first: ``dflash-sidecar demo --style generic --ranks 8`` on the
fake NVML driver with 8 GPUs (a DDP node of 8 ranks waiting in its all-reduce), its ``/metrics``
read once. Every simulated node serves that page with its own ``host`` (one HTTP server, one path
per node); a real Prometheus scrapes them all with the shipped ``prometheus-cluster.yml`` and every
shipped rule file at a 5 s scrape and evaluation. After ``--settle`` seconds it reads its own
``prometheus_tsdb_head_series``, its resident memory and, per rule group, the median of
``evaluationTime`` over the last evaluations.

    PYTHONPATH=. python bench/bench_cluster_scale.py [--nodes 16 64 256] [--settle 60]
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fake_nvml.build import build_fake_nvml  # noqa: E402
from tests.fake_nvml.control import FakeNvml  # noqa: E402

PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - local URL
        return bytes(resp.read())


def capture_page(tmp: Path) -> str:
    """One real daemon page: the demo's generic 8-rank loop, all-reduce bound, on 8 fake GPUs."""
    library = build_fake_nvml("full")
    control = FakeNvml(tmp / "nvml-control.txt", library, {"devices": 8})
    control.gpu("*", utilization_gpu=96, gpm_supported=1, gpm_sm_util=20, clock_reasons=0)
    port = free_port()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "LD_LIBRARY_PATH": str(library.parent),
           "FAKE_NVML_CONTROL": str(control.path), "DFLASH_RUN_LABEL": "bench"}
    proc = subprocess.Popen([sys.executable, "-m", "sidecar", "demo", "--style", "generic", "--ranks", "8",
                             "--bottleneck", "comm", "--interval", "1", "--duration", "12", "--nvml-interval", "0.5",
                             "--endpoint", f"ipc://{tmp}/demo.sock", "--prometheus-addr", f"127.0.0.1:{port}"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(1)
            try:
                page = get(f"http://127.0.0.1:{port}/metrics").decode()
            except OSError:
                continue
            if "dflash_node_step_seconds{" in page and "dflash_gpu_utilization_ratio{" in page:
                return page
        raise RuntimeError("the demo's page never carried node figures and GPUs")
    finally:
        proc.terminate()
        proc.wait(30)


def serve(pages: list[str]) -> ThreadingHTTPServer:
    encoded = [p.encode() for p in pages]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            body = encoded[int(self.path.rsplit("/", 1)[1])]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def measure(page: str, host: str, nodes: int, settle_s: float, tmp: Path) -> dict[str, float]:
    """Run Prometheus over ``nodes`` copies of ``page`` and read its figures."""
    pages = [page.replace(f'host="{host}"', f'host="node-{i:04d}"') for i in range(nodes)]
    server = serve(pages)
    work = tmp / f"prom-{nodes}"
    shutil.copytree(PROMETHEUS_DIR / "rules", work / "rules")
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus-cluster.yml").read_text())
    config["global"].update(scrape_interval="5s", evaluation_interval="5s")
    (work / "targets").mkdir()
    port = server.server_address[1]
    (work / "targets" / "nodes.yml").write_text(yaml.safe_dump(
        [{"targets": [f"127.0.0.1:{port}"], "labels": {"__metrics_path__": f"/node/{i}", "node": f"node-{i:04d}"}}
         for i in range(nodes)]))
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    web = free_port()
    prom = subprocess.Popen([shutil.which("prometheus") or "prometheus", f"--config.file={work / 'prometheus.yml'}",
                             f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{web}",
                             "--log.level=warn"], cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{web}"
    try:
        time.sleep(settle_s)
        evals: dict[str, list[float]] = {}
        for _ in range(6):
            for g in json.loads(get(f"{base}/api/v1/rules"))["data"]["groups"]:
                evals.setdefault(g["name"], []).append(g["evaluationTime"])
            time.sleep(5)
        own = get(f"{base}/metrics").decode().splitlines()
        head = next(float(x.split()[-1]) for x in own if x.startswith("prometheus_tsdb_head_series "))
        rss = next(float(x.split()[-1]) for x in own if x.startswith("process_resident_memory_bytes "))
        query = urllib.parse.urlencode({"query": 'count({__name__=~"dflash_.+", host="node-0000"})'})
        per_node = float(json.loads(get(f"{base}/api/v1/query?{query}"))["data"]["result"][0]["value"][1])
        seen = _count(base, "run_host:dflash_node_step_seconds:avg1m")
        recorded = _count(base, '{__name__=~"run.*:dflash_node_.+|host_cause:dflash_node_.+"}')
        edge = _count(base, '{__name__=~".+:dflash_.+", host="node-0000"}')
        return {"nodes": nodes, "series_per_node": per_node, "head_series": head, "rss_mb": rss / 1e6,
                "nodes_in_rules": seen, "straggler_series": recorded, "recorded_per_node": edge,
                **{f"eval_ms:{g}": statistics.median(v) * 1000 for g, v in evals.items()}}
    finally:
        prom.terminate()
        prom.wait(30)
        server.shutdown()


def _count(base: str, selector: str) -> float:
    """``count(selector)`` now (0 when empty)."""
    result = json.loads(get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": f"count({selector})"})))
    return float(result["data"]["result"][0]["value"][1]) if result["data"]["result"] else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--settle", type=float, default=60.0, help="seconds before reading (>= 1 minute of rules)")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dflash-scale-") as tmp:
        page = capture_page(Path(tmp))
        host = page.split('dflash_node_step_seconds{host="', 1)[1].split('"', 1)[0]
        rows = [measure(page, host, n, ns.settle, Path(tmp)) for n in ns.nodes]
    groups = sorted({k for r in rows for k in r if k.startswith("eval_ms:")})
    print("| nodes | in the rules | dflash series per node | recorded per node | straggler rules' series | "
          "head series | "
          "Prometheus RSS (MB) | " + " | ".join(f"{g[8:]} eval (ms)" for g in groups) + " |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in groups) + " |")
    for r in rows:
        print(f"| {r['nodes']} | {r['nodes_in_rules']:.0f} | {r['series_per_node']:.0f} | "
              f"{r['recorded_per_node']:.0f} | "
              f"{r['straggler_series']:.0f} | {r['head_series']:.0f} | {r['rss_mb']:.0f} | "
              + " | ".join(f"{r.get(g, float('nan')):.2f}" for g in groups) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
