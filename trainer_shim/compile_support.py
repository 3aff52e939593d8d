"""Shim calls inside ``torch.compile``d code: no raise, no graph break, records arrive.

Dynamo traces any Python function it meets. Traced, a shim call would put guards on the
channel's queue (which the flusher drains concurrently: guards then fail or raise) and on the
values passed. So dynamo never traces a recording function: ``torch.compiler.substitute_in_graph``
replaces each inside compiled code by a small function that dynamo traces. Where dynamo's
internals allow it, that function defers the call to the end of the graph
(``trainer_shim.compile_deferred``): one plain call of the recording function after the graph,
made by the outermost compiled frame, so a call in an inlined function is kept; no graph node,
a fraction of a microsecond (docs/SHIM.md). Otherwise it calls a shim operator
(``trainer_shim.compile_ops``), a graph node that runs the original function with the real
values (a few microseconds). Where the operators cannot be defined either (an older torch), the
functions become dynamo's reorderable logging calls, which lose the calls made in inlined
functions and break the graph for a dict or a symbolic int (a warning says so).

``timer()`` returns a context manager, which neither form can defer. Inside compiled code it
returns a small context manager whose ``__enter__`` and ``__exit__`` each call a shim operator
(dynamo traces it without a graph break): the first reads the host clock when the graph runs,
the second records the timing through the channel's ``timing``. Inductor's generated code
calls the two operators' Python bodies directly, 1-2 us a block; the other backends make
dispatcher calls (see ``trainer_shim.compile_ops``). Without the operators it is
``contextlib.nullcontext`` and records nothing.

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
_fns: list[tuple[str, Callable[..., Any]]] = []
_applied: set[int] = set()
_timings: dict[int, Callable[..., Any]] = {}
"""For each registered ``timer``: its channel's ``timing`` (what a compiled timer records with)."""
_fresh: dict[int, Callable[..., Any]] = {}
"""For each registered ``scalar`` that has one: the function a deferred call of it makes with a
0-d floating-point CPU tensor the graph computed (see ``register``)."""
_ops: ModuleType | None = None
_ops_failed = False
_deferred_failed = False
_hook: _DynamoImportHook | None = None


def register(fns: dict[str, Callable[..., Any]],
             fresh_scalar: Callable[[str, Any], None] | None = None) -> None:
    """Make a channel's recording functions compile-safe (see the module docstring): ``timer``
    is replaced inside compiled code by two shim operators around the block, every other one by
    a call deferred to the end of the graph (``trainer_shim.compile_deferred``) or a shim
    operator (``trainer_shim.compile_ops``). ``fresh_scalar(name, tensor)``, where given, is what a
    deferred ``scalar`` call of a 0-d floating-point CPU tensor calls instead of
    ``fns["scalar"]``: the tensor is a copy the graph made for that call, which nothing else
    sees, so it may be queued as it is and read by the flusher (``.item()`` cost the trainer
    ~0.5 us). Takes effect at once if dynamo is loaded, else when it is imported. Never
    raises."""
    try:
        with _lock:
            _fns.extend(fns.items())
            if "timer" in fns and "timing" in fns:
                _timings[id(fns["timer"])] = fns["timing"]
            if fresh_scalar is not None and "scalar" in fns:
                _fresh[id(fns["scalar"])] = fresh_scalar
        # Without "torch" in sys.modules (removed by someone), registering would import a second
        # torch: the functions wait for the next registration then.
        if _DYNAMO in sys.modules and "torch" in sys.modules:
            _apply()
        else:
            _install_hook()
    except Exception as exc:  # noqa: BLE001 - compile support is best effort
        log.warning("trainer_shim: cannot register with torch.compile: %r", exc)


def _apply() -> None:
    """Register every known function with dynamo (idempotent)."""
    from torch._dynamo.decorators import substitute_in_graph

    ops = _operators()
    with _lock:
        for name, fn in _fns:
            if id(fn) in _applied:
                continue
            if name == "timer" and ops is not None and id(fn) in _timings:
                substitute_in_graph(fn, skip_signature_check=True)(ops.timer_in_graph(_timings[id(fn)]))
            elif name == "timer":
                substitute_in_graph(fn, skip_signature_check=True)(_null_timer_for(fn))
            elif ops is not None:
                substitute_in_graph(fn, skip_signature_check=True)(_in_graph(ops, name, fn))
            else:
                from torch._dynamo import config

                config.reorderable_logging_functions.add(fn)
            _never_trace(fn)
            _applied.add(id(fn))


def _operators() -> ModuleType | None:
    """``trainer_shim.compile_ops`` (defining its operators on first use), or None where they
    cannot be defined: then the functions become reorderable logging calls, which lose the calls
    made in inlined functions (see docs/SHIM.md)."""
    global _ops, _ops_failed
    if _ops is None and not _ops_failed:
        try:
            from trainer_shim import compile_ops

            for impl in compile_ops.IMPLS:
                _never_trace(impl)
            _ops = compile_ops
        except Exception as exc:  # noqa: BLE001 - an older torch: fall back, say so once
            _ops_failed = True
            log.warning("trainer_shim: no shim operators for torch.compile (%r); calls in "
                        "functions dynamo inlines record nothing", exc)
    return _ops


def _in_graph(ops: ModuleType, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """What dynamo traces instead of ``fn``: a call deferred to the end of the graph where
    dynamo's internals allow it (``trainer_shim.compile_deferred``), else a shim operator."""
    operator_form = ops.in_graph(name, fn)
    deferred = _deferred()
    if deferred is None:
        return operator_form
    fresh = _fresh.get(id(fn))
    if fresh is not None:
        _never_trace(fresh)
    return deferred.in_graph(name, fn, operator_form, fresh)


def _deferred() -> ModuleType | None:
    try:
        from trainer_shim import compile_deferred
    except Exception as exc:  # noqa: BLE001 - operators instead, say so once
        global _deferred_failed
        if not _deferred_failed:
            log.warning("trainer_shim: shim calls in compiled code run as operators (%r)", exc)
        _deferred_failed = True
        return None
    return compile_deferred if compile_deferred.AVAILABLE else None


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
