"""Shim calls inside ``torch.compile``d code: no raise, no graph break, no recompile.

Dynamo traces any Python function it meets. Traced, a shim call would put guards on the
channel's queue (which the flusher drains concurrently: guards then fail or raise) and on the
values passed. Dynamo's supported way out for calls that only log is
``torch._dynamo.config.reorderable_logging_functions``: a registered function is not traced; the
call is replayed after the graph has run, with the real tensors, and the graph does not break.
Its limits, as of torch 2.13 (``tests/test_shim_compile.py`` checks each):

- the function must be a plain Python function returning None (so every recording call of a
  channel is a plain function, see ``trainer_shim.channel``);
- its arguments must be tensors, constants of the traced code or format strings: a Python
  number that changes from call to call (a step counter passed into the compiled function) is
  guarded on, recompiles once, then turns symbolic and breaks the graph; a dict (``publish``'s
  profile) always breaks the graph;
- only calls made by the compiled frame itself are replayed: dynamo drops those made by a
  function it inlines (a submodule's ``forward``, a helper), so they record nothing;
- the call happens after the graph: a value that the graph mutates later is seen mutated.

``timer()`` cannot be one of these (it returns a context manager). Inside compiled code it is
replaced by ``contextlib.nullcontext`` (``substitute_in_graph``): dynamo neither breaks the graph
nor skips the function, and the timer records nothing; time the compiled call from outside.

Nothing here imports torch: the functions are registered when the trainer imports
``torch._dynamo`` (at once if it already did, else from an import hook), so a trainer that
never compiles never loads dynamo because of the shim.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

log = logging.getLogger("trainer_shim")

_DYNAMO = "torch._dynamo"
_lock = threading.Lock()
_logging_fns: list[Callable[..., None]] = []
_timer_fns: list[Callable[..., Any]] = []
_applied: set[int] = set()
_hook: _DynamoImportHook | None = None


def register(fns: dict[str, Callable[..., Any]]) -> None:
    """Make a channel's recording functions compile-safe: ``timer`` is replaced by a null
    context inside compiled code, every other one becomes a reorderable logging call. Takes
    effect at once if dynamo is loaded, else when it is imported. Never raises."""
    try:
        with _lock:
            for name, fn in fns.items():
                (_timer_fns if name == "timer" else _logging_fns).append(fn)
        if _DYNAMO in sys.modules:
            _apply()
        else:
            _install_hook()
    except Exception as exc:  # noqa: BLE001 - compile support is best effort
        log.warning("trainer_shim: cannot register with torch.compile: %r", exc)


def _apply() -> None:
    """Register every known function with dynamo (idempotent)."""
    from torch._dynamo import config  # the trainer has imported dynamo: no extra cost
    from torch._dynamo.decorators import substitute_in_graph

    with _lock:
        for fn in _logging_fns:
            if id(fn) not in _applied:
                config.reorderable_logging_functions.add(fn)
                _never_trace(fn)
                _applied.add(id(fn))
        for fn in _timer_fns:
            if id(fn) not in _applied:
                substitute_in_graph(fn, skip_signature_check=True)(_null_timer_for(fn))
                _never_trace(fn)
                _applied.add(id(fn))


def _never_trace(fn: Callable[..., Any]) -> None:
    """The replayed call runs while dynamo's frame hook is active, which would compile the
    shim's own frame (and what it calls: ``.item()`` on a CPU scalar breaks that graph). Run it
    and everything it calls as plain Python instead."""
    from torch._dynamo.eval_frame import set_code_exec_strategy
    from torch._dynamo.types import FrameAction, FrameExecStrategy

    set_code_exec_strategy(fn.__code__, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))


def _null_timer_for(fn: Callable[..., Any]) -> Callable[[str], contextlib.nullcontext[None]]:
    def timer_in_graph(name: str) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    timer_in_graph.__qualname__ = f"compiled_{getattr(fn, '__qualname__', 'timer')}"
    return timer_in_graph


class _DynamoImportHook(importlib.abc.MetaPathFinder):
    """Runs ``_apply`` right after ``torch._dynamo`` has been imported, before anything can be
    compiled. For every other import it costs one string comparison."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _DYNAMO:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_register(module: ModuleType) -> None:
            exec_module(module)
            try:
                _apply()
            except Exception as exc:  # noqa: BLE001 - never break the trainer's import
                log.warning("trainer_shim: cannot register with torch.compile: %r", exc)

        loader.exec_module = exec_then_register  # type: ignore[method-assign]
        return spec


def _install_hook() -> None:
    global _hook
    with _lock:
        if _hook is None:
            _hook = _DynamoImportHook()
            sys.meta_path.insert(0, _hook)
