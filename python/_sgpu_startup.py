"""Run at every interpreter's start by a .pth file beside it (sgpu-build.pth, or the
installed sgpu-startup.pth); it costs one import of this file and does nothing elsewhere.

In a program that `sgpu run` started as a rank of a simulated node, a Python program that
never imports sgpu (a script written for torchrun) still gets the simulated GPUs as its
cuda devices (NOTE [CUDA on sim]): as soon as it imports torch, sgpu serves them. A
function's rank (sgpu's worker) and the fork server see to themselves.
"""

import os


def _wanted() -> bool:
    env = os.environ
    return (env.get("SGPU_RANK_BACKEND") == "sim" and bool(env.get("SGPU_RANK_DIR"))
            and "SGPU_ROLE" not in env and env.get("SGPU_SIM_CUDA", "on") != "off")


if _wanted():
    import importlib.abc
    import importlib.util
    import sys

    class _AfterTorch(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def __init__(self):
            self._inner = None

        def find_spec(self, fullname, path, target=None):
            if fullname != "torch" or self._inner is not None:
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
            import sgpu  # noqa: F401 - its torch hook serves cuda now that torch is here

    sys.meta_path.insert(0, _AfterTorch())
