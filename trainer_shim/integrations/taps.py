"""Zero new lines: what the trainer already logs to W&B, TensorBoard or MLflow also goes to the
sidecar. One line::

    from trainer_shim.integrations.taps import tap
    tap("wandb", "tensorboard", "mlflow")      # or tap(): all three

or no code at all: ``DFLASH_SIDECAR_TAP=wandb,tensorboard,mlflow`` in the trainer's environment
(``trainer_shim.integrations.tap_import``).

Tapped calls: ``wandb.log`` and ``wandb.Run.log`` (the dict, with its ``step``, else the row's
step W&B assigns), ``SummaryWriter.add_scalar``/``add_scalars`` of ``torch.utils.tensorboard``
and ``tensorboardX`` (``global_step``), ``mlflow.log_metric``/``log_metrics`` (``step``). Each
call's numbers go out as one ``publish(step, {name: value, ...})`` record, so the daemon maps the
names exactly as a published dict's (presets, units, your ``[[mapping]]`` rules); a call without a
step takes the last step seen. What is forwarded and what is skipped: ``tap_values``; how a call
stays the library's own: ``tap_targets``.

A library not yet imported is tapped when the trainer imports it. Nothing here imports a logging
library. The tap is undone by closing the channel it publishes to: ``telemetry.close()`` for the
default channel, the owning publisher's ``close()`` for a channel given to ``tap``, or ``untap()``.
"""

from __future__ import annotations

import functools
import threading
from types import ModuleType
from typing import Any

from trainer_shim import publisher as _publisher
from trainer_shim import telemetry
from trainer_shim.channel import Channel
from trainer_shim.integrations import post_import, tap_targets
from trainer_shim.integrations.post_import import LIBRARY_MODULES
from trainer_shim.integrations.tap_targets import Patch, exclude
from trainer_shim.integrations.tap_values import TapSink

__all__ = ["exclude", "stats", "tap", "tapped", "untap"]

_PATCHERS = {"wandb": tap_targets.wandb_patches, "tensorboard": tap_targets.tensorboard_patches,
             "mlflow": tap_targets.mlflow_patches}
_state = tap_targets.STATE
_patches: dict[str, list[Patch]] = {}
"""Module name -> the patches put on it."""
_last_sink: TapSink | None = None
"""The latest sink, kept after ``untap`` for ``stats``."""
_lock = threading.RLock()


def tap(*libraries: str, channel: Channel | None = None) -> None:
    """Forward the numbers the trainer logs through ``libraries`` (default: all of ``wandb``,
    ``tensorboard``, ``mlflow``) to ``channel`` (default: the process's default channel, as
    ``telemetry.publish`` does, following ``configure()``). Calling it again adds libraries; a
    different ``channel`` replaces the previous one for all of them. Raises ``ValueError`` for
    an unknown library name (a set-up call); never raises once the tap is on."""
    global _last_sink
    names = libraries or tuple(LIBRARY_MODULES)
    unknown = [n for n in names if n not in LIBRARY_MODULES]
    if unknown:
        raise ValueError(f"tap: unknown {', '.join(map(repr, unknown))}; known: {', '.join(LIBRARY_MODULES)}")
    target: Any = channel if channel is not None else telemetry
    with _lock:
        if _state.sink is None or _state.sink.target is not target:
            _state.sink = _last_sink = TapSink(target)
            _undo_on_close(channel)
    for library in names:
        for module in LIBRARY_MODULES[library]:
            post_import.when_imported(module, _PUT_ON[library])


def untap() -> None:
    """Take every tap off: the libraries' functions are theirs again, nothing more is forwarded
    (a wrapper someone still holds calls the library only), no import is waited for."""
    with _lock:
        _state.sink = None
        for patches in _patches.values():
            for patch in reversed(patches):
                patch.undo()
        _patches.clear()
    post_import.forget(tuple(m for modules in LIBRARY_MODULES.values() for m in modules))


def tapped() -> tuple[str, ...]:
    """The modules a tap is on now (e.g. ``("mlflow", "wandb")``)."""
    with _lock:
        return tuple(sorted(_patches))


def stats() -> dict[str, Any]:
    """``tapped`` modules, values ``skipped`` (not a number: images, strings, tensors of more
    than one element) and tap ``errors`` (calls whose forwarding failed; the trainer's call was
    unaffected), counted since the tap was put on (kept after it came off)."""
    sink = _last_sink
    return {"tapped": tapped(), "skipped": sink.skipped if sink else 0, "errors": sink.errors if sink else 0}


def _put_on(library: str, module: ModuleType) -> None:
    """Patch ``module`` (just imported, or imported before the tap) unless it is already."""
    with _lock:
        if _state.sink is None or module.__name__ in _patches:
            return
        patches = _PATCHERS[library](module, _state)
        for patch in patches:
            patch.apply()
        _patches[module.__name__] = patches


_PUT_ON = {library: functools.partial(_put_on, library) for library in _PATCHERS}
"""One callback per library, so that ``tap`` called again waits for an import only once."""


def _undo_on_close(channel: Channel | None) -> None:
    """Untap when the channel's publisher closes (the default channel: ``telemetry.close()``)."""
    if channel is None:
        telemetry.on_close(_untap_if_default)
        return
    owner = _publisher.owner_of(channel)
    if owner is not None:
        owner.on_close(lambda: _untap_if(channel))


def _untap_if_default() -> None:
    _untap_if(telemetry)


def _untap_if(target: Any) -> None:
    sink = _state.sink
    if sink is not None and sink.target is target:
        untap()

