"""A Python process's tracebacks on the caller's signal (NOTE [Stack dumps] in
src/contract/stack_dump.h): armed into its rank's folder and announced there, so that the
caller quotes them when its call hangs."""

from __future__ import annotations

import os

import _sgpu_rank_env as _rank_env

_STACK_FILE = None


def arm_python_stacks(native, rank_dir: str | None = None) -> bool:
    """Every Python thread's traceback into rank-N/stacks/python on the caller's signal
    (NOTE [Stack dumps] in src/contract/stack_dump.h), for a call that hangs; `rank_dir`,
    else the rank's (SGPU_RANK_DIR). False when it cannot be armed (no folder, or no room in
    it): the rank then just has no Python stacks, which is no reason to fail it."""
    import faulthandler

    if rank_dir is None:
        rank_dir = os.environ.get(_rank_env.RANK_DIR, "")
    folder, python_file, _ = native.stack_files(rank_dir)
    if not rank_dir or not os.path.isdir(folder):
        return False
    global _STACK_FILE
    try:
        _STACK_FILE = open(python_file, "w")  # noqa: SIM115 - the rank's life
    except OSError:
        return False
    faulthandler.register(native.python_stack_signal(), file=_STACK_FILE, all_threads=True)
    return True


def arm_world_stacks(native) -> None:
    """In a process on the node under `sgpu sim` that has just formed a world: its Python
    tracebacks into its rank's folder there, announced, so that `sgpu sim` quotes them when
    the world hangs (NOTE [A node's worlds] in src/launcher/node_watch.h)."""
    rank_dir = native.node_world_rank_dir()
    if rank_dir and arm_python_stacks(native, rank_dir):
        announce_stacks(native, rank_dir)


def announce_stacks(native, rank_dir: str) -> None:
    """This process's pid in rank-N/stacks/program.pid: it answers the Python signal."""
    folder, _, pid_file = native.stack_files(rank_dir)
    staged = os.path.join(folder, f".program.pid.{os.getpid()}")
    try:  # a full runs folder: no stacks, and the program goes on
        with open(staged, "w") as out:
            out.write(str(os.getpid()))
        os.replace(staged, pid_file)
    except OSError:
        pass
