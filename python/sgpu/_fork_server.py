"""The Python fork server: `python -m sgpu._fork_server [MODULE,...]`, started by the C++
launcher at a caller's first fork-server call and living as long as that caller.

It imports torch (and the modules named); with --cuda-on-sim (the launcher adds it for
calls whose ranks serve cuda on sim) it also makes every operator's CUDA kernel run its CPU
kernel, which each rank would otherwise do after its fork. Then it serves the C++ fork server's loop
(launcher/fork_server.h); each rank is a fork of it, so a warm call imports nothing again.
A process with threads cannot fork safely: numpy's BLAS, which torch imports, is kept to
the calling thread, and the loop refuses to fork (naming the exec start method) if some
module started a thread anyway.
"""

import importlib
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def prepare(modules: list) -> None:
    """Before a rank is forked: the modules its call asked the server for (the heavy ones its
    function imports), imported once here so that no rank of a later call pays for them. One
    that fails to import is left for the rank, which says so itself."""
    for name in modules:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the rank's own import reports it
            pass


def main() -> None:
    flags = [arg for arg in sys.argv[1:] if arg.startswith("--")]
    preload = [name for arg in sys.argv[1:] if not arg.startswith("--")
               for name in arg.split(",") if name]
    for name in preload:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # a rank that needs it imports it, and says so then
    import cloudpickle  # noqa: F401 - every rank unpickles with it

    from sgpu import _native, _worker

    if "--cuda-on-sim" in flags and "torch" in sys.modules:
        # Its ranks serve cuda on sim: the part they share, done once here (NOTE [CUDA on sim]).
        _native.cover_cuda_operators_ahead()

    env = _native.serve_forks()  # returns only in a forked rank
    # The rank's environment replaces the server's, as exec would (putenv underneath).
    os.environ.clear()
    os.environ.update(entry.split("=", 1) for entry in env if "=" in entry)
    _worker.main()


if __name__ == "__main__":
    main()
