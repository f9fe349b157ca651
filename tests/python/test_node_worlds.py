"""The process groups that processes on a simulated node form themselves, under `sgpu sim`:
recorded as a launch's ranks are, judged when they hang, faulted by the plan, summed up when
they end; and `sgpu sim` as the command's supervisor (signals, what is left running)."""

import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import time

from sgpu_cli import SGPU, needs_cli

pytestmark = needs_cli

# Two processes by mp.spawn form an "nccl" world over tcp:// and all-reduce three times; with
# "skip", rank 1 sleeps instead of its third.
WORLD = """
import socket, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def worker(rank, port, skip):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    t = torch.ones(4, device="cuda")
    for step in range(3):
        if skip and rank == 1 and step == 2:
            time.sleep(300)
        dist.all_reduce(t)
    torch.cuda.synchronize()
    dist.destroy_process_group()

if __name__ == "__main__":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(worker, args=(port, sys.argv[1] == "skip"), nprocs=2)
    print("done")
"""


def sim(tmp_path, *flags, how="ok", timeout=240):
    script = tmp_path / "world.py"
    script.write_text(textwrap.dedent(WORLD))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGPU_")}
    env["SGPU_RUNS_DIR"] = str(tmp_path / "runs")
    started = time.monotonic()
    done = subprocess.run([SGPU, "sim", *flags, "--", sys.executable, str(script), how],
                          env=env, capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - started


def alive(pid: int) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def test_a_world_that_hangs_gets_a_launchs_verdict_and_its_processes_are_ended(tmp_path):
    done, elapsed = sim(tmp_path, "--hang-timeout", "3", how="skip")
    err = done.stderr
    assert done.returncode == 124, err
    assert re.search(r"sgpu: the world of 2 processes on the node \(pids (\d+), (\d+)", err), err
    assert ("hung: rank 1 never entered collective #3 (all_reduce of 4 float32 (sum)): rank 0 "
            "has waited in it for") in err
    assert "#3 all_reduce of 4 float32 (sum), in flight for" in err  # the rings' table
    # The culprit's stack, its Python frames included, as a launch quotes it.
    assert "the stack of rank 1" in err and "world.py\", line 14 in worker" in err
    assert "(--hang-timeout is 3.0 s: a collective was in flight that long" in err
    folder = re.search(r"its rings and reports are in (\S+)", err).group(1)
    assert "rank 1 never entered collective #3" in (pathlib.Path(folder) / "collectives.txt").read_text()
    assert (pathlib.Path(folder) / "flight-recorder" / "nccl_trace_rank_0").is_file()
    pids = [int(p) for p in re.search(r"pids (\d+), (\d+)", err).groups()]
    assert not any(alive(pid) for pid in pids)
    assert elapsed < 120  # not the 300 s rank 1 sleeps


def test_a_fault_plan_names_the_ranks_of_a_world_the_processes_formed(tmp_path):
    done, _ = sim(tmp_path, "--faults", "rank=1:exit=7@collective=2")
    assert done.returncode != 0
    assert "process 1 terminated with exit code 7" in done.stderr, done.stderr
    assert "done" not in done.stdout


def test_a_world_that_ends_is_summed_up_and_leaves_no_folder(tmp_path):
    done, _ = sim(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done"
    assert re.search(r"sgpu sim: the world of 2 processes on the node \(pids \d+, \d+.*\): "
                     r"collectives \(the most of any rank\): all_reduce 3 calls, 48 B, .* on "
                     r"h100-nvswitch\)", done.stderr), done.stderr
    assert not list((tmp_path / "runs").glob("node-*"))


def test_what_the_command_leaves_running_is_ended(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGPU_")}
    env["SGPU_RUNS_DIR"] = str(tmp_path)
    done = subprocess.run([SGPU, "sim", "--", "sh", "-c", "sleep 300 & echo $!"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.strip())
    assert f"sgpu sim: ending 1 process the command left running (pid {pid})" in done.stderr
    assert not alive(pid)


def test_a_signal_sent_to_sgpu_sim_reaches_its_command(tmp_path):
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: (print('got it', flush=True), sys.exit(5)))\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGPU_")}
    env["SGPU_RUNS_DIR"] = str(tmp_path)
    process = subprocess.Popen([SGPU, "sim", "--", sys.executable, "-c", code], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 5, err
    assert out.strip() == "got it"
