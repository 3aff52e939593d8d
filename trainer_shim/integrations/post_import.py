"""Which modules' imports put a tap on, and the post-import hook that waits for them.

``LIBRARY_MODULES`` says, per library, the modules a tap waits for; ``when_imported`` calls back
once a module has been imported: now if it is, else right after its body ran, through a finder at
the front of ``sys.meta_path`` that leaves once it waits for none. Both the no-code taps
(``trainer_shim.integrations.tap_import``, loaded by the ``.pth`` file at interpreter start) and
``trainer_shim.integrations.taps`` use it, so it imports the standard library only (it is loaded at
every interpreter start where ``DFLASH_SIDECAR_TAP`` is set) and nothing of the shim.

Nothing here raises into an import: a callback that fails is said once on stderr and the
trainer's import goes on.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

LIBRARY_MODULES: dict[str, tuple[str, ...]] = {
    "wandb": ("wandb",),
    "tensorboard": ("torch.utils.tensorboard.writer", "tensorboardX.writer"),
    "mlflow": ("mlflow",),
}
"""Per library the modules whose import puts the tap on (each module once its body has run)."""


class _PostImportFinder:
    """Finds nothing itself: for a module it waits for, it asks the other finders and wraps the
    loader they give so that the callbacks run after the module's body. The import system asks a
    finder for ``find_spec`` only: no ``importlib.abc`` base (importing it would cost this module,
    loaded at interpreter start, about half a millisecond)."""

    def __init__(self) -> None:
        self.callbacks: dict[str, list[Callable[[ModuleType], None]]] = {}
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.callbacks or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is not self and find is not None:
                    spec = find(fullname, path, target)
                    if spec is not None:
                        break
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


class _Loader:
    """The library's own loader, then the callbacks; the module keeps its own loader. Every other
    attribute is the library loader's own (``__getattr__``)."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        _fire(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


_finder = _PostImportFinder()
_lock = threading.Lock()


def when_imported(module: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` once the module named ``module`` has been imported: now if it
    is, else right after its body ran (once, however often the same callback is given)."""
    with _lock:
        loaded = sys.modules.get(module)
        if loaded is None:
            waiting = _finder.callbacks.setdefault(module, [])
            if callback not in waiting:
                waiting.append(callback)
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
    if loaded is not None:
        _call(callback, loaded)


def forget(modules: tuple[str, ...] | None = None) -> None:
    """Stop waiting for ``modules`` (default: all); the finder leaves once it waits for none."""
    with _lock:
        for name in list(_finder.callbacks) if modules is None else modules:
            _finder.callbacks.pop(name, None)
        _leave_if_done()


def waiting() -> tuple[str, ...]:
    """The modules whose import would put a tap on."""
    return tuple(sorted(_finder.callbacks))


def _fire(module: ModuleType) -> None:
    with _lock:
        callbacks = _finder.callbacks.pop(module.__name__, [])
        _leave_if_done()
    for callback in callbacks:
        _call(callback, module)


def _leave_if_done() -> None:
    if not _finder.callbacks and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def _call(callback: Callable[[ModuleType], None], module: ModuleType) -> None:
    try:
        callback(module)
    except Exception as exc:  # noqa: BLE001 - the trainer's import goes on; the library stays as it was
        sys.stderr.write(f"dflash-sidecar: could not tap {module.__name__}: {exc!r}\n")
