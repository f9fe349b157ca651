#!/usr/bin/env python3
"""How long a Python distributed call takes to launch, against what else launches the same
function, in one run on this machine.

The function imports torch and returns its rank, as a training function's first line
would. For 1, 2, 4 and 8 ranks (--ranks), timed in this order:

  floor        fork N processes from this interpreter (torch imported, one thread) and
               reap them: what starting N ranks that have torch costs at least
  sgpu warm    @sgpu.distributed, fork server already started (the default start method)
  + mlflow     the same, of a function that also imports mlflow (the README's quick start
               logs with it): its fork server imports mlflow once, so a warm call costs
               what one without the import does (aim: at most 1.5x sgpu warm)
  sgpu exec    @sgpu.distributed(start_method="exec"): N fresh interpreters
  mp.spawn     torch.multiprocessing.spawn(fn, nprocs=N)
  torchrun     torchrun --nproc-per-node N on a script that does the same

Each is the median of --repeat runs (mp.spawn and torchrun: --slow-repeat). The table
gives each time and its ratio to the floor; the aims are sgpu warm within 1.5x of the floor
and at least 30 times faster than mp.spawn at 8 ranks.

    PYTHONPATH=build/python /opt/sgpu/venv/bin/python bench/bench_python_launch.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the floor forks: one thread only
os.environ.setdefault("SGPU_BACKEND", "sim")
os.environ.setdefault("SGPU_TRACKING", "off")  # launches, not MLflow, are timed

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import sgpu  # noqa: E402


def rank_function():
    import torch  # noqa: F401 - what a training function does first

    return sgpu.get_global_rank()


def time_floor(ranks: int) -> float:
    start = time.perf_counter()
    pids = []
    for _ in range(ranks):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    return time.perf_counter() - start


def rank_function_with_mlflow():
    import mlflow  # noqa: F401 - what a function that logs does first
    import torch  # noqa: F401

    return sgpu.get_global_rank()


def time_sgpu(ranks: int, method: str, function=rank_function) -> float:
    fn = sgpu.distributed(gpus=ranks, start_method=method)(function)
    start = time.perf_counter()
    result = fn.distributed()
    elapsed = time.perf_counter() - start
    assert result == list(range(ranks)), result
    return elapsed


def time_mp_spawn(ranks: int) -> float:
    start = time.perf_counter()
    mp.spawn(spawned_trivial, nprocs=ranks, join=True)
    return time.perf_counter() - start


def spawned_trivial(index):
    import torch  # noqa: F401 - as rank_function


def time_torchrun(ranks: int, folder: str) -> float:
    script = os.path.join(folder, "rank.py")
    with open(script, "w") as f:
        f.write(textwrap.dedent("""
            import os
            import torch
            assert int(os.environ["RANK"]) < int(os.environ["WORLD_SIZE"])
        """))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={ranks}", script]
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def hosts_file() -> str:
    """Whether /etc/hosts names the IPv4-mapped loopback, which stock files do not (NOTE
    [Store peers' names]: sgpu's launches must not depend on it)."""
    try:
        with open("/etc/hosts") as f:
            mapped = any(line.split()[:1] == ["::ffff:127.0.0.1"] for line in f)
    except OSError:
        return "/etc/hosts unreadable"
    return "/etc/hosts names ::ffff:127.0.0.1" if mapped else "stock /etc/hosts (no ::ffff:127.0.0.1)"


def median(fn, repeat: int) -> float:
    return statistics.median(fn() for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="1,2,4,8")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--slow-repeat", type=int, default=1)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    counts = [int(n) for n in args.ranks.split(",")]
    sgpu.distributed(gpus=1)(rank_function).distributed()  # the fork server starts here
    sgpu.distributed(gpus=1)(rank_function_with_mlflow).distributed()  # it imports mlflow
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for ranks in counts:
            row = {"ranks": ranks}
            row["floor"] = median(lambda: time_floor(ranks), args.repeat)
            row["sgpu warm"] = median(lambda: time_sgpu(ranks, "fork-server"), args.repeat)
            row["+ mlflow"] = median(
                lambda: time_sgpu(ranks, "fork-server", rank_function_with_mlflow), args.repeat)
            row["sgpu exec"] = median(lambda: time_sgpu(ranks, "exec"), max(args.repeat // 3, 1))
            row["mp.spawn"] = median(lambda: time_mp_spawn(ranks), args.slow_repeat)
            row["torchrun"] = median(lambda: time_torchrun(ranks, folder), args.slow_repeat)
            rows.append(row)
    names = ["floor", "sgpu warm", "+ mlflow", "sgpu exec", "mp.spawn", "torchrun"]
    print(f"{os.cpu_count()} cores; medians; (x) is the ratio to the floor; {hosts_file()}")
    print("ranks " + "".join(f"{n:>22}" for n in names))
    for row in rows:
        cells = "".join(f"{row[n] * 1e3:>12.1f} ms {row[n] / row['floor']:>6.1f}x" for n in names)
        print(f"{row['ranks']:>5} {cells}")
    last = rows[-1]
    print(f"at {last['ranks']} ranks: sgpu warm is {last['sgpu warm'] / last['floor']:.2f}x the floor "
          f"(aim <= 1.5x), {last['mp.spawn'] / last['sgpu warm']:.0f}x faster than mp.spawn (aim >= 30x), "
          f"{last['torchrun'] / last['sgpu warm']:.0f}x faster than torchrun; a function that "
          f"imports mlflow: {last['+ mlflow'] / last['sgpu warm']:.2f}x sgpu warm (aim <= 1.5x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
