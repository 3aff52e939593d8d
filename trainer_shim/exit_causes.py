"""What an exception that ends a process means, in one word of a small set, and its detail.

Both sides use it: the shim (``exit_hooks``) classifies the live exception that ends its process,
the daemon classifies the bare type name an older shim wrote into its tally. Nothing here imports
torch or any framework: an error is recognised by its class's name and module (and its bases'),
and by the words of its message, the way an operator reads a log. Nothing here raises: a
``__str__`` that fails, a chain that loops, a message of megabytes all give a bounded answer.

The causes (docs/RELIABILITY.md, "How a sender ended"):

- ``exception``: an uncaught Python exception (a NaN check, a bug, a failed assertion...);
- ``exit_code``: the process exited with a non-zero status and the shim saw no exception
  (``sys.exit(2)``, ``sys.exit("message")``, a trainer's excepthook that replaced the shim's);
- ``cuda_oom``: the accelerator ran out of memory: torch's ``OutOfMemoryError`` (``torch.cuda``'s
  in every torch version), "CUDA out of memory" / "HIP out of memory" in a ``RuntimeError`` of
  older torch, ``CUBLAS_STATUS_ALLOC_FAILED``, "CUDA error: out of memory";
- ``host_oom``: the host ran out of memory: ``MemoryError``, torch's ``DefaultCPUAllocator: can't
  allocate memory``, or the kernel's OOM killer (told by the daemon, not here);
- ``nccl``: the distributed backend failed: ``torch.distributed``'s ``DistError`` family
  (``DistBackendError``, ``DistNetworkError``, ``DistStoreError``), an NCCL error or watchdog
  timeout in the message. This is how one node's death shows on all the others;
- ``signal``: a signal ended it (SIGTERM, SIGINT, ``KeyboardInterrupt``; a fatal signal).

A cause found in an exception's ``__cause__`` or ``__context__`` counts (``raise
RuntimeError("step failed") from oom``): the first specific cause along the chain wins over
``exception``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

CAUSES: tuple[str, ...] = ("exception", "exit_code", "cuda_oom", "host_oom", "nccl", "signal")
"""Every cause a tally or an exported end may carry (empty: none)."""
OOM_CAUSES: frozenset[str] = frozenset({"cuda_oom", "host_oom"})
"""The causes that make an end ``oom``."""
DETAIL_MAX = 160
"""Characters of an end's detail at most: ``Type: first line of the message``, cut."""
TYPE_MAX = 64
"""Characters of a type name at most."""
CHAIN_MAX = 8
"""Exceptions of a chain (``__cause__``/``__context__``) looked at, at most."""
SCAN_CHARS = 2048
"""Of a message, the head and the tail looked at for the words below (a DataLoader worker's error
re-raised in the main process carries the original error on its last line)."""

_CUDA_OOM_TYPES = frozenset({"OutOfMemoryError", "CUDAOutOfMemoryError"})
_HOST_OOM_TYPES = frozenset({"MemoryError"})
_NCCL_TYPES = frozenset({"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"})
_CUDA_OOM_WORDS = re.compile(r"(CUDA|HIP|XPU) out of memory|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED|"
                             r"CUDNN_STATUS_ALLOC_FAILED|MPS backend out of memory")
_HOST_OOM_WORDS = re.compile(r"DefaultCPUAllocator: (can't allocate|not enough) memory")
_NCCL_WORDS = re.compile(r"\bNCCL (error|communicator|WARN)|ProcessGroupNCCL|\bnccl[A-Z][a-zA-Z]*Error\b|"
                         r"Watchdog caught collective operation timeout")
_GPU = re.compile(r"\bGPU (\d{1,4})\b|device cuda:(\d{1,4})\b")


def classify(exc: BaseException) -> tuple[str, str, int]:
    """``(cause, detail, gpu)`` of an exception that ends a process: ``gpu`` the device torch names
    in an out-of-memory message (-1: none). Never raises."""
    try:
        chain = list(_chain(exc))
        causes = [_cause_of(e) for e in chain]
        found = next((i for i, c in enumerate(causes) if c != "exception"), 0)
        cause = causes[found]
        detail = describe(exc)
        if found:
            detail = f"{detail} (from {describe(chain[found])})"
        return cause, cut(detail), gpu_of(_message(chain[found])) if cause == "cuda_oom" else -1
    except Exception:  # noqa: BLE001 - a broken exception must not stop the trainer's hook
        return "exception", "", -1


def classify_names(type_names: Sequence[str], message: str = "") -> str:
    """The cause of an exception whose class and bases are named ``type_names`` (the class first),
    with ``message``: for the daemon reading an older shim's detail (a bare type name)."""
    names = set(type_names)
    if names & _CUDA_OOM_TYPES:
        return "host_oom" if _HOST_OOM_WORDS.search(message) else "cuda_oom"
    if names & _HOST_OOM_TYPES:
        return "host_oom"
    if names & _NCCL_TYPES:
        return "nccl"
    if "KeyboardInterrupt" in names:
        return "signal"
    for words, cause in ((_CUDA_OOM_WORDS, "cuda_oom"), (_HOST_OOM_WORDS, "host_oom"), (_NCCL_WORDS, "nccl")):
        if words.search(message):
            return cause
    return "exception"


def describe(exc: BaseException) -> str:
    """``Type: first line of its message`` (the type alone when the message is empty), cut."""
    name = type(exc).__name__[:TYPE_MAX]
    first = _message(exc)[:DETAIL_MAX + 1].strip().split("\n", 1)[0].strip()
    return cut(f"{name}: {first}" if first else name)


def exit_detail(code: object) -> tuple[str, str]:
    """``(cause, detail)`` of a ``SystemExit`` with ``code``: no cause for 0 or None; ``exit status
    N``, or ``exit status 1: <message>`` for a string code (Python prints it and exits 1)."""
    if code is None or code == 0:
        return "", ""
    if isinstance(code, int):
        return "exit_code", f"exit status {code & 0xFF}"
    try:
        text = str(code).strip().split("\n", 1)[0]
    except Exception:  # noqa: BLE001
        text = ""
    return "exit_code", cut(f"exit status 1: {text}" if text else "exit status 1")


def gpu_of(message: str) -> int:
    """The GPU index an out-of-memory message names (``GPU 0 has a total capacity...``, ``(GPU 0;
    ...)`` of older torch, ``device cuda:1``), -1 if none."""
    m = _GPU.search(message[:SCAN_CHARS])
    return int(m.group(1) or m.group(2)) if m else -1


def cut(text: str, limit: int = DETAIL_MAX) -> str:
    """``text`` on one line of printable characters, at most ``limit`` characters (``…`` marks a cut)."""
    flat = "".join(c if c.isprintable() else " " for c in text[: limit * 2])
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _cause_of(exc: BaseException) -> str:
    return classify_names(list(_type_names(type(exc))), _scanned(_message(exc)))


def _type_names(kind: type) -> Iterable[str]:
    for base in getattr(kind, "__mro__", (kind,))[:16]:
        yield getattr(base, "__name__", "")


def _chain(exc: BaseException) -> Iterable[BaseException]:
    """The exception, then what caused it (``__cause__``, else ``__context__`` unless suppressed)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < CHAIN_MAX:
        seen.add(id(current))
        yield current
        cause = current.__cause__
        current = cause if cause is not None or current.__suppress_context__ else current.__context__


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - a __str__ that fails
        return ""


def _scanned(message: str) -> str:
    if len(message) <= 2 * SCAN_CHARS:
        return message
    return message[:SCAN_CHARS] + "\n" + message[-SCAN_CHARS:]
