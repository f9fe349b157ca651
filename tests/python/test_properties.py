"""Laws of the decorator over many calls: every fault kind at any rank gives that rank's
row; calls side by side stay apart; a hundred calls in a row leave nothing behind."""

import gc
import os
import pathlib
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sgpu
from conftest import alive, distributed_error
from sgpu import distributed

# fault action -> the row's kind
FAULTS = {"segv": "signal", "abort": "signal", "exit=5": "exit_code", "throw": "exception"}


def naps(seconds):
    time.sleep(seconds)
    return sgpu.get_global_rank()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_fault_kind_at_any_rank_gives_that_ranks_row(data):
    world = data.draw(st.integers(1, 4), label="world")
    rank = data.draw(st.integers(0, world - 1), label="rank")
    action = data.draw(st.sampled_from(sorted(FAULTS)), label="action")
    point = data.draw(st.sampled_from(["start", "after=100ms"] if action != "throw" else ["start"]))
    fn = distributed(gpus=world, tracking=False, sim_faults=f"rank={rank}:{action}@{point}")(naps)
    with pytest.raises(Exception) as caught:
        fn.distributed(10)
    error = distributed_error(caught.value)
    assert isinstance(error, sgpu.DistributedError)
    rows = {row.rank: row for row in error.ranks}
    assert error.root_cause.rank == rank
    assert rows[rank].kind == FAULTS[action]
    if action == "exit=5":
        assert rows[rank].exit_code == 5
    assert all(rows[r].kind == "terminated" for r in rows if r != rank)


def test_three_calls_at_once_each_get_their_own_results():
    handles = [
        distributed(gpus=2 + i, tracking=False)(lambda i=i: (i, sgpu.get_global_rank())).launch()
        for i in range(3)
    ]
    assert [h.result(timeout=120) for h in handles] == [
        [(i, r) for r in range(2 + i)] for i in range(3)
    ]
    assert len({h.run_dir for h in handles}) == 3


def listening_ports(pid: int) -> set:
    """The TCP ports process `pid` listens on, from the kernel's tables."""
    inodes = set()
    for fd in pathlib.Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in pathlib.Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_a_hundred_calls_in_a_row_leak_no_process_descriptor_or_port(sgpu_sandbox):
    def pid_and_child():
        import subprocess

        child = subprocess.Popen(["sleep", "1000"])  # left running: sgpu takes it down
        return os.getpid(), child.pid

    fn = distributed(gpus=2, tracking=False)(pid_and_child)
    fn.distributed()  # whatever is made once (the fork server) is made now
    gc.collect()
    fds = len(os.listdir("/proc/self/fd"))
    threads = len(os.listdir("/proc/self/task"))
    started = []
    for _ in range(100):
        for rank_pid, child_pid in fn.distributed():
            started += [rank_pid, child_pid]
    assert len(set(started)) == 400
    assert alive(started) == []
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= fds
    assert len(os.listdir("/proc/self/task")) == threads
    assert listening_ports(os.getpid()) == set()
    assert list((sgpu_sandbox / "runs").iterdir()) == []  # each success removed its folder
