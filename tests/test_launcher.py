"""The one launcher's readers (``tests.launcher``), and that it and the GPU check's plumbing import
without pytest (the GPU check runs on a box with only the repository and the daemon's
dependencies). Its daemon is exercised by every test that starts one."""

from __future__ import annotations

import gzip
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from tests.launcher import ROOT, cpu_seconds, env, free_port, http_get, memory_bytes

WITHOUT_PYTEST = "import sys; sys.modules['pytest'] = None; "
"""Prefix of a ``python -c`` program in which ``import pytest`` fails."""


@pytest.mark.parametrize("program", [
    "import tests.launcher",
    "sys.path.insert(0, 'bench'); import gpu_check_common; gpu_check_common.DaemonProc",
    "sys.path.insert(0, 'bench'); import gpu_check_nvml",
])
def test_imports_without_pytest(program: str) -> None:
    out = subprocess.run([sys.executable, "-c", WITHOUT_PYTEST + program], capture_output=True, text=True,
                         cwd=ROOT, env=env(), timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]


def test_the_pytest_block_is_real() -> None:
    out = subprocess.run([sys.executable, "-c", WITHOUT_PYTEST + "import tests.daemon_harness"],
                         capture_output=True, text=True, cwd=ROOT, env=env(), timeout=120)
    assert out.returncode != 0 and "pytest" in out.stderr  # the harness needs pytest; the launcher must not


class _Page(http.server.BaseHTTPRequestHandler):
    BODY = b"dflash_up 1\n" * 100

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        gz = "gzip" in self.headers.get("Accept-Encoding", "")
        body = gzip.compress(self.BODY) if gz else self.BODY
        self.send_response(200 if self.path == "/metrics" else 404)
        if gz:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def page() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_http_get_reads_plain_and_gzip_and_raises_oserror(page: str) -> None:
    assert http_get(page + "/metrics") == _Page.BODY.decode()
    assert http_get(page + "/metrics", gz=True) == _Page.BODY.decode()
    with pytest.raises(OSError):
        http_get(page + "/missing")  # an error status
    with pytest.raises(OSError):
        http_get(f"http://127.0.0.1:{free_port()}/metrics", timeout_s=2)  # nothing listens


def test_cpu_and_memory_of_a_process_and_oserror_once_it_is_gone() -> None:
    assert cpu_seconds(os.getpid()) > 0
    rss, hwm = memory_bytes(os.getpid())
    assert 0 < rss <= hwm
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    with pytest.raises(OSError):
        cpu_seconds(child.pid)
    with pytest.raises(OSError):
        memory_bytes(child.pid)
