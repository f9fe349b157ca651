"""A callback right after a module's first import, so that sgpu does not import a module, nor
pay for it, before anyone needs it."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs `callback(module)` right after module `name` is first imported (by whoever
    imports it), so that sgpu does not import it, nor pay for it, before anyone needs it."""

    def __init__(self, name, callback):
        self._name = name
        self._callback = callback
        self._inner = None

    def find_spec(self, fullname, path, target=None):
        if fullname != self._name or self._inner is not None:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return None
        self._inner = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        self._callback(module)


def after_import(name: str, callback) -> None:
    """`callback(module)` now if module `name` is imported, else right after its import."""
    if name in sys.modules:
        callback(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))
