#!/usr/bin/env python3
"""Worlds larger than the machine: a training step of a production model on many simulated
nodes, in shape-only compute, as a folded world (node 0's ranks standing for every node's,
and the world's last rank held against its place: `sgpu run --sim-fold`), against, in the
same run, the same folded world doing nothing but start its process group and end (the
floor: the launch, torch's import and the group, which any step pays):

  fsdp-64   Llama 3.1 8B under FSDP2 on 8 nodes of 8 H100s (64 GPUs), batch 2 x 8192,
            selective activation checkpointing (torchtitan's 8B configuration)
  2d-512    Llama 3.1 405B in torchtitan's 2D parallelism, tensor parallel in each node and
            FSDP2 across 64 nodes of 8 H100s (512 GPUs), batch 2 x 8192, full activation
            checkpointing

Each row gives the call's wall time on this machine, the floor's, the step's time over the
floor, the processes that ran ranks and the ranks they stood for, the largest process's peak
resident memory, and what examples/models/llama_step.py printed: the predicted step, tokens
per second per GPU and GPU 0's peak reserved memory.

    PYTHONPATH=build/python /opt/sgpu/venv/bin/python bench/bench_worlds.py \\
        [--rows fsdp-64,2d-512] [--json worlds.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import re
import resource
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from validate_predictions import LINE, STEP, chosen, simulated  # noqa: E402

FLOOR = ("import os, torch, torch.distributed as dist; "
         "torch.cuda.set_device(int(os.environ['LOCAL_RANK'])); "
         "dist.init_process_group('nccl'); dist.destroy_process_group()")
FOLDED = re.compile(r"sgpu: (?P<processes>\d+) processes stood for (?P<ranks>\d+) ranks")


@dataclasses.dataclass(frozen=True)
class World:
    id: str
    nodes: int
    args: tuple            # llama_step.py's
    node: str = "8xH100"   # SGPU_SIM


WORLDS = [
    World("fsdp-64", 8, ("--size", "8B", "--batch", "2", "--seq", "8192", "--ac", "selective")),
    World("2d-512", 64, ("--size", "405B", "--tp", "8", "--batch", "2", "--seq", "8192", "--ac",
                         "full")),
]


@dataclasses.dataclass
class Run:
    wall_seconds: float
    max_rss_bytes: int
    processes: int
    ranks: int
    output: str  # its stdout, then its stderr


def run(world: World, program: list, timeout: float) -> Run:
    """The folded world running `program`: its wall time, and the largest peak resident memory
    of any process it started (getrusage of the children, taken in a process of its own so
    that no other run's count)."""
    command, env = simulated(world.node, world.nodes, program)
    largest_child = ("import resource, subprocess, sys; "
                     "code = subprocess.run(sys.argv[1:]).returncode; "
                     "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "
                     "file=sys.stderr); sys.exit(code)")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", largest_child, *command], env=env,
                          capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{world.id}: `{' '.join(command)}` exited {done.returncode}:\n"
                           f"{done.stdout[-2000:]}{done.stderr[-4000:]}")
    # The summary of what stood for what comes with a step's figures (none for the floor).
    folded = FOLDED.search(done.stderr)
    max_rss_kib = int(done.stderr.strip().splitlines()[-1])
    return Run(wall, max_rss_kib * 1024, int(folded["processes"]) if folded else 0,
               int(folded["ranks"]) if folded else 0, done.stdout + done.stderr)


def measure(world: World, timeout: float) -> dict:
    floor = run(world, [sys.executable, "-c", FLOOR], timeout)
    step = run(world, [sys.executable, str(STEP), *world.args], timeout)
    figures = LINE.search(step.output)
    if figures is None or not step.processes:
        raise RuntimeError(f"{world.id}: no step figures or summary of the folded world in:\n"
                           f"{step.output[-4000:]}")
    return {"id": world.id, "gpus": step.ranks, "processes": step.processes,
            "wall_s": step.wall_seconds, "floor_s": floor.wall_seconds,
            "x_floor": step.wall_seconds / floor.wall_seconds,
            "max_rss_bytes": step.max_rss_bytes,
            "model_step_ms": float(figures["step"]) * 1e3,
            "model_tokens_per_s": float(figures["tps"].replace(",", "")),
            "memory_reserved_bytes": round(float(figures["reserved"]) * 2**30)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", help="the worlds to run, by id, comma-separated (default all)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a call may take")
    parser.add_argument("--json", metavar="FILE", help="also write Google Benchmark JSON")
    args = parser.parse_args(argv)
    worlds = chosen(parser, args.rows, WORLDS, "world")
    rows = []
    print("| world | GPUs | processes | wall | floor | x floor | largest RSS | predicted step "
          "| tokens/s/GPU | reserved, GPU 0 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for world in worlds:
        row = measure(world, args.timeout)
        rows.append(row)
        print(f"| {row['id']} | {row['gpus']} | {row['processes']} | {row['wall_s']:.0f} s | "
              f"{row['floor_s']:.0f} s | {row['x_floor']:.2f} | "
              f"{row['max_rss_bytes'] / 2**30:.2f} GiB | {row['model_step_ms'] / 1e3:.3f} s | "
              f"{row['model_tokens_per_s']:,.0f} | "
              f"{row['memory_reserved_bytes'] / 2**30:.2f} GiB |", flush=True)
    if args.json:
        benchmarks = [{"name": f"worlds/{r['id']}", "run_name": f"worlds/{r['id']}",
                       "run_type": "iteration", "repetitions": 1, "repetition_index": 0,
                       "threads": 1, "iterations": 1, "real_time": r["wall_s"],
                       "cpu_time": r["wall_s"], "time_unit": "s",
                       **{k: v for k, v in r.items() if k not in ("id", "wall_s")}}
                      for r in rows]
        context = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "backend": "sim",
                   "benchmark": "bench_worlds.py", "num_cpus": os.cpu_count()}
        with open(args.json, "w") as out:
            json.dump({"context": context, "benchmarks": benchmarks}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
