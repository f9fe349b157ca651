"""Run at every interpreter's start by a .pth file beside it (sgpu-build.pth, or the
installed sgpu-startup.pth); it costs one import of this file and does nothing elsewhere
but put one finder last on sys.meta_path (NOTE [Stand-in imports], below).

In a program that `sgpu run` started as a rank of a simulated node, and in any process that
starts with SGPU_BACKEND=sim (everything under `sgpu sim`, a notebook kernel started so), a
Python program that never imports sgpu (a script written for torchrun, a test suite) still
gets the simulated GPUs as its cuda devices (NOTE [CUDA on sim]): as soon as it imports
torch, sgpu serves them. A function's rank (sgpu's worker) and the fork server see to
themselves.
"""

import os

import _sgpu_rank_env as _rank_env


def _on_node() -> bool:
    """A process on a simulated node that sgpu did not start: SGPU_BACKEND=sim as its
    interpreter starts (under `sgpu sim`, in a notebook kernel started so, in what such a
    process starts). sgpu's own roles (a rank, a fork server) see to themselves."""
    env = os.environ
    return (env.get(_rank_env.BACKEND_SETTING) == _rank_env.SIM_BACKEND
            and _rank_env.ROLE not in env and not env.get(_rank_env.RANK_DIR))


# The words sgpu's option table takes for on and off (src/contract/option_table.cc; the native
# module's environment_flag reads them so, which a test holds these to).
_ON = ("on", "1", "true", "yes", "ON", "True")
_OFF = ("off", "0", "false", "no", "OFF", "False")


def _wanted() -> bool:
    env = os.environ
    if env.get(_rank_env.SIM_CUDA_SETTING, "on") in _OFF or _rank_env.ROLE in env:
        return False
    in_a_sim_rank = (env.get(_rank_env.RANK_BACKEND) == _rank_env.SIM_BACKEND
                     and bool(env.get(_rank_env.RANK_DIR)))
    return in_a_sim_rank or ON_NODE


ON_NODE = _on_node()  # read by sgpu._sim_cuda.on_node()


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
# and answers only for these names and their submodules (one the stand-in lacks raises
# NotOfferedError where it is imported). SGPU_SERVERLESS_GPU off (off, 0, false or no, as
# sgpu's other on/off variables take) leaves them unfound; a value that is neither on nor off
# is said on stderr, once, where a stand-in is looked for, and leaves them unfound too: a
# hook that every interpreter runs at its start must not stop them all.


def _serverless_gpu_setting() -> str:
    """SGPU_SERVERLESS_GPU's text, "on" when unset or empty (as the option table reads it)."""
    return os.environ.get(_rank_env.SERVERLESS_GPU_SETTING) or "on"


class _StandIns:
    _NAMES = {"serverless_gpu": "serverless_gpu", "databricks.air": "databricks_air"}
    _refused: set = set()  # the values said on stderr: each once a process

    @classmethod
    def _on(cls) -> bool:
        text = _serverless_gpu_setting()
        if text in _ON:
            return True
        if text not in _OFF and text not in cls._refused:
            cls._refused.add(text)
            import sys

            print(f"sgpu: SGPU_SERVERLESS_GPU={text} is neither on nor off: \"off\" (or 0, false, "
                  "no) or \"on\" (or 1, true, yes); the stand-ins for serverless_gpu and "
                  "databricks.air stay off", file=sys.stderr, flush=True)
        return False

    @staticmethod
    def _folder(name: str):
        """The stand-in package's folder for the import name `name`, or None."""
        folder = _StandIns._NAMES.get(name)
        if folder is None:
            return None
        import importlib.util

        found = importlib.util.find_spec("sgpu")  # finds the package, imports nothing
        if found is None or not found.submodule_search_locations:
            return None
        for root in found.submodule_search_locations:
            package = os.path.join(root, "stand_in", folder)
            if os.path.isfile(os.path.join(package, "__init__.py")):
                return package
        return None

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname in cls._NAMES:
            package = cls._folder(fullname) if cls._on() else None
            if package is None:
                return None
            import importlib.util

            return importlib.util.spec_from_file_location(
                fullname, os.path.join(package, "__init__.py"),
                submodule_search_locations=[package])
        # A submodule of a stand-in that its folder lacks (every finder before this one
        # looked there): not offered, as a name the stand-in lacks is. An installed
        # package's missing submodule stays the ModuleNotFoundError it is.
        parent, _, name = fullname.rpartition(".")
        package = cls._folder(parent)
        if package is None or path is None or list(path) != [package]:
            return None
        from sgpu.stand_in import not_offered

        raise not_offered(parent, name)


if _serverless_gpu_setting() not in _OFF:
    import sys

    sys.meta_path.append(_StandIns)
