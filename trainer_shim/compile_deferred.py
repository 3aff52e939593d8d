"""Shim calls inside ``torch.compile``d code as calls deferred to the end of the graph (imported
only by ``trainer_shim.compile_support``, once the trainer has imported ``torch._dynamo``).

Inside compiled code each recording function (all but ``timer``) is replaced
(``torch.compiler.substitute_in_graph``) by a small function that dynamo traces. It checks the
argument types and then, at trace time (``torch._dynamo.comptime``), hands the call and its
arguments as dynamo sees them (constants, symbolic ints and floats, tensors) to the frame that
dynamo compiles, the outermost one: dynamo emits one plain Python call of the recording function
per shim call after the graph, with the constants in the bytecode and the tensors and symbolic
values taken from the graph's outputs. This is dynamo's own mechanism for
``reorderable_logging_functions``, which keeps only the calls made in the compiled frame itself
(a call in an inlined function, a submodule's ``forward`` or a helper, is lost) and breaks the
graph for a symbolic int. Handed to the outermost frame, no call is lost; the graph holds no node
for a shim call (nothing for inductor to order, partition or keep out of a CUDA graph), and a
call costs what the recording function costs in eager code plus one graph output for a tensor
or symbolic value.

Records are queued when the graph has run (in call order), not where the call stands in the
function; a graph that raises queues nothing of its calls. A ``publish`` dict is rebuilt from
the values it held at the call. Whatever does not fit (a non-str name, a value of another type,
a dict with non-number values) goes through the original function behind
``torch.compiler.disable``: the graph breaks there, the record arrives. A call inside a
higher-order operator's subgraph (activation checkpointing, ``torch.cond``), whose values cannot
be outputs of the outer graph, is traced as a shim operator (``trainer_shim.compile_ops``).

This uses dynamo internals (the instruction translator's ``debug_locals`` and
``DebuggingVariable``); ``AVAILABLE`` says whether they exist. If deferring fails at trace time
anyway (a torch that changed them), a warning says so once and every later call is traced as a
shim operator instead (``trainer_shim.compile_ops``); the frame being traced then records
through the operators, so nothing is lost and nothing raises.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from trainer_shim.compile_ops import eager_fallback, guarded_publish

log = logging.getLogger("trainer_shim")

try:
    from torch._dynamo.comptime import comptime
    from torch._dynamo.source import GlobalSource
    from torch._dynamo.variables import (
        ConstantVariable,
        SymNodeVariable,
        TensorVariable,
        UnspecializedPythonVariable,
    )
    from torch._dynamo.variables.dicts import ConstDictVariable
    from torch._dynamo.variables.misc import DebuggingVariable

    AVAILABLE = True
except ImportError:  # pragma: no cover - a torch without these internals: operators instead
    AVAILABLE = False

broken = False
"""Set once deferring has failed at trace time (dynamo's internals are not what this module
expects): every call traced afterwards is an operator call. A module global that the traced
functions read, so dynamo guards on it: frames compiled before recompile once."""

_fns: list[Callable[..., Any]] = []
_VALUES: tuple[type, ...] = (
    (ConstantVariable, SymNodeVariable, TensorVariable, UnspecializedPythonVariable)
    if AVAILABLE else ())


def _defer(ctx: Any) -> None:
    """At trace time, in the frame of a replacement function: append the call of
    ``_fns[index]`` with the local ``args`` (a tuple) to the outermost frame's deferred calls.
    Where this one call cannot be deferred (an argument dynamo holds in a form it cannot hand
    out of the graph, a call inside a higher-order operator's subgraph such as activation
    checkpointing, whose values cannot be outputs of the outer graph) it sets the local
    ``deferred`` to False, and the caller traces an operator call for it. Never raises: on any
    other failure sets ``broken``."""
    global broken
    if broken:
        return
    try:
        tx = ctx._i_will_not_complain_if_bc_breaks_InstructionTranslator()
        if not _append(ctx, tx):
            tx.symbolic_locals["deferred"] = ConstantVariable.create(False)
    except Exception as exc:  # noqa: BLE001 - fall back to operators, say so once
        if not broken:
            log.warning("trainer_shim: cannot defer shim calls in compiled code (%r); they run "
                        "as shim operators (a few microseconds each)", exc)
        broken = True


def _append(ctx: Any, tx: Any) -> bool:
    """Append the call to the outermost frame's deferred calls; False where it cannot be."""
    fid = ctx.get_local("index")._i_will_not_complain_if_bc_breaks_VariableTracker()
    args = ctx.get_local("args")._i_will_not_complain_if_bc_breaks_VariableTracker()
    fn = _fns[fid.as_python_constant()]
    items = list(args.items)
    if not all(_deferrable(item) for item in items):
        return False
    root = tx
    while root.parent is not None:
        root = root.parent
    if root.export:  # an exported graph has no Python around it: as dynamo's logging calls
        return True
    if tx.output.current_tracer.parent is not None:
        return False
    name = root.output.install_global_by_id("___dflash_shim_fn", fn)
    root.debug_locals.append((DebuggingVariable(fn, source=GlobalSource(name)), items))
    return True


def _deferrable(item: Any) -> bool:
    if isinstance(item, ConstDictVariable):
        return all(isinstance(k.vt, ConstantVariable) and _deferrable(v)
                   for k, v in item.items.items())
    return isinstance(item, _VALUES)


def in_graph(kind: str, fn: Callable[..., Any], operator_form: Callable[..., None],
             fresh: Callable[..., None] | None = None) -> Callable[..., None]:
    """The function dynamo traces instead of recording function ``fn`` (``kind``: its name,
    ``publish`` or one of the (name, value) calls); ``operator_form`` is the same call as a shim
    operator (``trainer_shim.compile_ops.in_graph``), traced once deferring is ``broken``;
    ``fresh``, where given, is deferred instead of ``fn`` for a 0-d floating-point CPU tensor
    (``compile_support.register``)."""
    fid = len(_fns)
    _fns.append(fn)
    fresh_fid = fid
    if fresh is not None:
        fresh_fid = len(_fns)
        _fns.append(fresh)
    if kind == "publish":
        def publish_deferred(step: Any, profile: Any) -> None:
            snapshot = dict(profile)  # the values at the call, whatever the function does to the dict later
            deferred = True  # noqa: F841 - read and set by _defer at trace time
            index, args = fid, (step, snapshot)  # noqa: F841 - read by _defer at trace time
            comptime(_defer)
            if broken or not deferred:
                operator_form(step, profile)

        return guarded_publish(fn, publish_deferred)

    fallback = eager_fallback(fn)

    def record_in_graph(name: Any, value: Any = 1) -> None:
        if type(name) is not str or type(value) is bool or not isinstance(
                value, (int, float, str, torch.Tensor)):
            fallback(name, value)
            return
        index = fid  # noqa: F841 - read by _defer at trace time
        if isinstance(value, torch.Tensor):  # the value now: the graph may change it later
            if value.device.type == "cpu" and value.dim() == 0 and value.is_floating_point():
                index = fresh_fid  # noqa: F841 - read by _defer at trace time
            value = value.detach().clone()
        args = (name, value)  # noqa: F841 - read by _defer at trace time
        deferred = True  # noqa: F841 - read and set by _defer at trace time
        comptime(_defer)
        if broken or not deferred:
            operator_form(name, value)

    return record_in_graph
