"""Run at every interpreter's start by a .pth file beside it (sgpu-build.pth, or the
installed sgpu-startup.pth); it costs one import of this file and does nothing elsewhere
but put one finder last on sys.meta_path (NOTE [Stand-in imports], below).

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


# NOTE [Stand-in imports]: Databricks' `serverless_gpu` and `databricks.air`, for a notebook
# written for them, from sgpu's stand-ins (sgpu/stand_in/) when no installed package has the
# name: this finder is last on sys.meta_path, after the one that finds installed packages,
# and answers only for these names. SGPU_SERVERLESS_GPU=off leaves them unfound.
class _StandIns:
    _NAMES = {"serverless_gpu": "serverless_gpu", "databricks.air": "databricks_air"}

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        folder = cls._NAMES.get(fullname)
        if folder is None or os.environ.get("SGPU_SERVERLESS_GPU", "on") == "off":
            return None
        import importlib.util

        found = importlib.util.find_spec("sgpu")  # finds the package, imports nothing
        if found is None or not found.submodule_search_locations:
            return None
        for root in found.submodule_search_locations:
            package = os.path.join(root, "stand_in", folder)
            if os.path.isfile(os.path.join(package, "__init__.py")):
                return importlib.util.spec_from_file_location(
                    fullname, os.path.join(package, "__init__.py"),
                    submodule_search_locations=[package])
        return None


if os.environ.get("SGPU_SERVERLESS_GPU", "on") != "off":
    import sys

    sys.meta_path.append(_StandIns)
