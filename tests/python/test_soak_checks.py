"""The chaos soak's own checks (tests/soak/soak.py): between rounds it counts only the
listening sockets of its own processes (itself, what it started, and what still carries its
jobs' marker), so a process that listens beside it on the same machine is no finding."""

import argparse
import importlib.util
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

SOAK = pathlib.Path(__file__).resolve().parents[1] / "soak" / "soak.py"
# A process that listens on a port of loopback and says its pid and port in a file.
LISTENER = """
import os, socket, sys, time
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
with open(sys.argv[1] + ".tmp", "w") as said:
    said.write(f"{os.getpid()} {server.getsockname()[1]}")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(120)
"""


@pytest.fixture(scope="module")
def soak():
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def listeners(tmp_path):
    """listen(orphan, env): a process listening on loopback, this process's child or (orphan)
    one whose parent has exited, so that it is no descendant of this process; returns its
    pid and address. Each is killed at the end."""
    started = []

    def listen(orphan: bool = False, env: dict | None = None) -> tuple[int, str]:
        said = tmp_path / f"listener-{len(started)}"
        command = [sys.executable, "-c", LISTENER, str(said)]
        if orphan:  # started by a process that exits at once
            command = [sys.executable, "-c", "import subprocess, sys; "
                       "subprocess.Popen(sys.argv[1:], start_new_session=True)", *command]
        child = subprocess.Popen(command, env=env)
        deadline = time.monotonic() + 30
        while not said.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        pid, port = map(int, said.read_text().split())
        started.append(pid)
        if orphan:
            child.wait()
        else:
            started.append(child)
        return pid, f"127.0.0.1:{port}"

    yield listen
    for process in started:
        if isinstance(process, int):
            try:
                os.kill(process, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            process.wait()


def parent_of(pid: int) -> int:
    return int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_the_sockets_counted_are_those_of_the_watched_process_its_children_and_its_marker(
        soak, listeners):
    prefix = f"{soak.MARKER}={os.getpid()}-"
    unrelated, unrelated_address = listeners(orphan=True)
    assert parent_of(unrelated) != os.getpid(), "this process adopts orphans: no unrelated one"
    child, child_address = listeners()
    marked, marked_address = listeners(orphan=True,
                                       env=dict(os.environ, **{soak.MARKER: f"{os.getpid()}-7"}))
    other_soak, _ = listeners(orphan=True, env=dict(os.environ, **{soak.MARKER: "1-7"}))

    watched = soak.own_processes(os.getpid(), prefix)
    assert os.getpid() in watched and child in watched and marked in watched
    assert unrelated not in watched and other_soak not in watched
    found = soak.listening_sockets(watched)
    assert found[child_address] == {child}
    assert found[marked_address] == {marked}
    assert unrelated_address not in found
    assert unrelated_address in soak.listening_sockets([unrelated])  # it does listen


def test_a_round_ends_clean_beside_an_unrelated_listener_and_names_one_of_its_own(soak, listeners):
    checker = soak.Soak(argparse.Namespace(seed=1))
    try:
        listeners(orphan=True)  # another user's server, started while the soak runs
        checker.check_round()
        assert checker.problems == []
        pid, address = listeners()
        checker.check_round()
        assert len(checker.problems) == 1
        assert f"listening sockets left: {address} held by {pid} (" in checker.problems[0]
        checker.check_round()
        assert len(checker.problems) == 1  # said once
    finally:
        shutil.rmtree(checker.root, ignore_errors=True)
