"""What an exception that ends a process means (``trainer_shim.exit_causes``), on real torch
errors (CPU torch: its CUDA out-of-memory type, ``torch.distributed``'s backend error, its host
allocator's real failure) and on the cases no trainer plans for: a chain whose cause is the OOM, a
DataLoader worker's error re-raised in the main process, a ``__str__`` that raises, a message of
megabytes, a chain that loops. How the daemon tells an end from what it knows
(``model.ends.how_ended``). And a real process: the trainer's own hooks still run, the tally and
the exit-status file tell its death."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import torch
import torch.distributed as dist

from sidecar.model.ends import EndFacts, how_ended
from sidecar.sources.tallies import read_exit_status
from tests.daemon_harness import env
from trainer_shim import exit_causes, wire
from trainer_shim.exit_causes import classify, exit_detail

OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.11 GiB of which "
       "1.25 GiB is free.")


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001
        return caught


def test_torch_errors_are_told_by_their_class_and_words_without_importing_torch() -> None:
    assert classify(torch.cuda.OutOfMemoryError(OOM)) == ("cuda_oom", f"OutOfMemoryError: {OOM}", 3)
    old = RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity)")
    assert classify(old)[0::2] == ("cuda_oom", 0)
    assert classify(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"))[0] \
        == "cuda_oom"
    assert classify(dist.DistBackendError("NCCL communicator was aborted on rank 3."))[0] == "nccl"
    assert classify(dist.DistStoreError("Timed out after 901 seconds waiting for clients"))[0] == "nccl"
    assert classify(RuntimeError("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)"))[0] \
        == "nccl"
    with pytest.raises(RuntimeError) as host:
        torch.empty(2**62, dtype=torch.uint8)  # the host allocator's real failure
    assert classify(host.value)[0] == "host_oom"
    assert classify(MemoryError())[0:2] == ("host_oom", "MemoryError")
    assert classify(ValueError("loss is NaN at step 100")) == ("exception", "ValueError: loss is NaN at step 100", -1)
    assert classify(KeyboardInterrupt())[0] == "signal"


def test_a_look_alike_class_elsewhere_is_told_by_its_name_and_bases() -> None:
    """No torch needed: a class named as torch's (another torch version, a fork) is recognised."""
    fake = type("OutOfMemoryError", (RuntimeError,), {"__module__": "torch"})
    sub = type("MyBackendError", (type("DistBackendError", (RuntimeError,), {}),), {})
    assert classify(fake("HIP out of memory. GPU 2 has"))[0::2] == ("cuda_oom", 2)
    assert classify(sub("boom"))[0] == "nccl"


def test_the_first_specific_cause_along_the_chain_wins() -> None:
    def chained() -> BaseException:
        try:
            raise torch.cuda.OutOfMemoryError(OOM)
        except RuntimeError as exc:
            try:
                raise RuntimeError("step 100 failed") from exc
            except RuntimeError as outer:
                return outer

    cause, detail, gpu = classify(chained())
    assert (cause, gpu) == ("cuda_oom", 3)
    assert detail.startswith("RuntimeError: step 100 failed (from OutOfMemoryError: CUDA out of memory.")
    loader = RuntimeError("Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most recent "
                          "call last):\n" + "  frame\n" * 2000 + "RuntimeError: DefaultCPUAllocator: can't allocate "
                          "memory: you tried to allocate 4611686018427387904 bytes.")
    assert classify(loader)[:2] == ("host_oom", "RuntimeError: Caught RuntimeError in DataLoader worker process 0.")


def test_the_detail_is_bounded_and_nothing_raises() -> None:
    class Broken(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert classify(Broken()) == ("exception", "Broken", -1)
    huge = classify(ValueError("x" * 5_000_000 + "\nsecret second line"))[1]
    assert len(huge) == exit_causes.DETAIL_MAX and huge.endswith("…") and "secret" not in huge
    assert "\x1b" not in classify(ValueError("\x1b[31mred\x07"))[1]
    a, b = _raised(ValueError("a")), _raised(ValueError("b"))
    a.__context__, b.__context__ = b, a  # a loop
    assert classify(a)[0] == "exception"
    assert exit_detail(None) == ("", "") and exit_detail(0) == ("", "")
    assert exit_detail(2) == ("exit_code", "exit status 2") and exit_detail(-1) == ("exit_code", "exit status 255")
    assert exit_detail("config missing\nmore") == ("exit_code", "exit status 1: config missing")


@pytest.mark.parametrize(("facts", "told"), [
    (EndFacts(True, exit_status=0), ("clean", "", "")),
    (EndFacts(True), ("clean", "", "")),  # no status told (musl, a shim before it): the final tally
    (EndFacts(True, exit_status=3), ("failed", "exit_code", "exit status 3")),
    (EndFacts(True, cause="exception", detail="E: x", exit_status=1), ("failed", "exception", "E: x")),
    (EndFacts(True, cause="exception", detail="E: x"), ("failed", "exception", "E: x")),
    (EndFacts(True, detail="ValueError"), ("failed", "exception", "ValueError")),  # a shim before ``cause``
    (EndFacts(True, detail="OutOfMemoryError"), ("oom", "cuda_oom", "OutOfMemoryError")),
    (EndFacts(True, cause="made-up", detail="E: x"), ("failed", "exception", "E: x")),
    (EndFacts(True, cause="cuda_oom", detail="O", exit_status=1), ("oom", "cuda_oom", "O")),
    (EndFacts(True, cause="exception", detail="Z", thread="prefetch", exit_status=0), ("clean", "", "")),
    (EndFacts(True, cause="exception", detail="Z", thread="prefetch"), ("clean", "", "")),
    (EndFacts(True, cause="nccl", detail="Z", thread="t", exit_status=1), ("failed", "nccl", "in thread t: Z")),
    (EndFacts(False, cause="exception", detail="Z", thread="t"), ("unclean", "exception", "in thread t: Z")),
    (EndFacts(False, cause="cuda_oom", detail="O"), ("oom", "cuda_oom", "O")),  # the hook then os._exit
    (EndFacts(False), ("unclean", "", "")),
    (EndFacts(False, crash="SIGSEGV"), ("crashed", "signal", "")),
    (EndFacts(False, kernel_oom=True), ("oom", "host_oom", "")),
    (EndFacts(True, signum=15, exit_status=1), ("terminated", "signal", "")),
])
def test_how_an_end_is_told(facts: EndFacts, told: tuple[str, str, str]) -> None:
    end = how_ended(facts)
    assert (end.how, end.cause, end.detail) == told


HOOKS_CHILD = """
import sys, threading, time
from trainer_shim import telemetry
def own(kind, value, tb):
    print("own hook:", kind.__name__, file=sys.stderr, flush=True)
def own_thread(args):
    print("own thread hook:", args.exc_type.__name__, file=sys.stderr, flush=True)
sys.excepthook, threading.excepthook = own, own_thread  # the trainer's, before the shim's
telemetry.configure(endpoint=sys.argv[1], role="t", worker="0")
telemetry.count("n")
telemetry.flush(wait_s=2)
time.sleep(0.3)  # the flusher wrote the tally (and armed the exit-status file) after the cycle
t = threading.Thread(target=lambda: 1 / 0, name="prefetch"); t.start(); t.join()
raise RuntimeError("loss is NaN at step 100")
"""


def test_the_trainers_own_hooks_still_run_and_the_tally_tells_the_death(tmp_path: Path) -> None:
    """The trainer's ``sys.excepthook`` and ``threading.excepthook``, installed before the shim,
    run as before (the shim's chain to them); the final tally tells the main thread's exception
    (not the thread's, seen first) and the exit-status file the status 1."""
    directory = tmp_path / "s.sock.tallies"
    directory.mkdir()  # as a daemon makes it: the shim never creates it
    out = subprocess.run([sys.executable, "-c", HOOKS_CHILD, f"ipc://{tmp_path}/s.sock"], capture_output=True,
                         text=True, timeout=60, env=env())
    assert out.returncode == 1, out.stderr
    assert "own thread hook: ZeroDivisionError" in out.stderr and "own hook: RuntimeError" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr  # the trainer's hooks replaced Python's printing, and still do
    (tally_path,) = directory.glob("*" + wire.TALLY_SUFFIX)
    fd = os.open(tally_path, os.O_RDONLY)
    try:
        payload = wire.read_tally_slots(lambda off, n: os.pread(fd, n, off))
    finally:
        os.close(fd)
    assert payload is not None
    tally = msgspec.msgpack.decode(payload, type=wire.Tally)
    assert tally.end == wire.TallyEnd.CLOSED
    assert (tally.cause, tally.detail, tally.thread) == ("exception", "RuntimeError: loss is NaN at step 100", "")
    (exit_path,) = directory.glob("*" + wire.EXIT_SUFFIX)
    assert read_exit_status(str(exit_path)) == 1
