"""The process table as /proc shows it, for tests that check what a call left running (the
pytest suite, and the chaos soak in tests/soak)."""

import os
import pathlib
import time
from typing import Iterator, NamedTuple


class Process(NamedTuple):
    pid: int
    state: str  # "Z" for a zombie
    ppid: int
    pgrp: int


def processes() -> Iterator[Process]:
    """Every process /proc lists, with its state, parent and process group; those that end
    while it is read are left out."""
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        yield Process(int(entry.name), fields[0], int(fields[1]), int(fields[2]))


def processes_with_marker(marker: str) -> list[int]:
    """The pids of live processes whose environment, as the kernel shows it, holds `marker`:
    a variable set before the caller started, which its ranks, its fork server and what
    they start inherit. (A variable the caller sets later is not seen in ranks forked by
    the fork server: /proc shows the environment a process was exec'd with.)"""
    found = []
    for process in processes():
        if process.pid == os.getpid() or process.state == "Z":
            continue
        try:
            environ = pathlib.Path(f"/proc/{process.pid}/environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in environ.split(b"\0"):
            found.append(process.pid)
    return found


def alive(pids) -> list[int]:
    """Those of `pids` that still run (zombies are gone), and every live process in their
    process groups (what a rank started stays in its rank's group)."""
    groups = set(pids)
    return [p.pid for p in processes() if p.state != "Z" and (p.pid in groups or p.pgrp in groups)]


def zombie_children() -> list[int]:
    """This process's children that ended and were not reaped."""
    return [p.pid for p in processes() if p.state == "Z" and p.ppid == os.getpid()]


def is_fork_server(pid: int) -> bool:
    """True for a Python fork server (it lives as long as its caller, by design)."""
    try:
        return b"sgpu._fork_server" in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def wait_until(predicate, limit: float = 30.0) -> bool:
    """Polls `predicate` until it holds or `limit` seconds pass; returns its last value."""
    deadline = time.monotonic() + limit
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()
