#!/usr/bin/env python3
"""One training step of a production-size model in shape-only mode (sim_compute="shapes")
against, in the same run, a call on the same ranks that only starts its process group
and ends (the launch, torch's import and the group: the floor any step pays):

  step      examples/models/llama.py at --size (Llama 3's 8B by default) under FSDP2 on
            --gpus simulated H100s, one forward, backward and AdamW step of --batch x --seq
            tokens (bfloat16 parameters and float32 reductions, or --precision fp32),
            without and with activation checkpointing: the call's wall time, its
            x over the floor, each rank's time in the step, the fullest GPU's peak allocated
            memory in the step, what the step's collectives are (count, bytes per op, and the
            collective model's predicted time on the node), and the step's predicted
            time on the node: its compute (the kernel model's, on the slowest rank) and
            the part of its collectives compute does not hide (NOTE [The step's timeline])
  floor     the same call doing nothing but init_process_group and destroy_process_group

    PYTHONPATH=build/python /opt/sgpu/venv/bin/python bench/bench_shapes.py [--gpus 8]
        [--json steps.json]   # Google Benchmark JSON for ci/bench-compare --counters-only
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples" / "models"))
os.environ.setdefault("SGPU_BACKEND", "sim")

import llama  # noqa: E402

from sgpu import distributed  # noqa: E402


def floor() -> float:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    dist.destroy_process_group()
    return 0.0


def step(size: str, batch: int, seq: int, checkpoint_activations: bool,
         mixed_precision: bool) -> tuple:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    import sgpu

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    config = llama.CONFIGS[size]
    model = llama.build(config, init_device_mesh("cuda", (dist.get_world_size(),)),
                        checkpoint_activations, mixed_precision)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.cuda.reset_peak_memory_stats()  # the step's peak, not the model's making
    start = time.perf_counter()
    before = sgpu.compute_stats()
    tokens = torch.randint(0, config.vocab_size, (batch, seq + 1)).cuda()
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    optimizer.step()
    after = sgpu.compute_stats()
    took = time.perf_counter() - start
    dist.destroy_process_group()
    keys = ("flops", "bytes", "predicted_seconds", "exposed_collective_seconds")
    return took, {key: after[key] - before[key] for key in keys}, torch.cuda.max_memory_allocated()


def timed(function, gpus: int, *args):
    call = distributed(gpus=gpus, tracking=False, sim_compute="shapes", timeout=1800,
                       console_ranks=[])(function)
    start = time.perf_counter()
    handle = call.launch(*args)
    per_rank = handle.result()
    return time.perf_counter() - start, per_rank, handle.comm_stats()


def row(name: str, wall: float, per_rank: list, comm: list) -> dict:
    """The step as a Google Benchmark row (ci/bench-compare reads it): exact counters
    (comm_*, collectives_*, memory_*, flops_*: the same on any machine) and predicted ones
    (model_*: the collective and compute models' times on the node)."""
    world = comm[0].get("world", {})
    compute = max((step for _, step, _ in per_rank),
                  key=lambda s: s["predicted_seconds"] + s["exposed_collective_seconds"])
    comm_seconds = sum(t["predicted_seconds"] for t in world.values())
    return {
        "name": name, "run_name": name, "run_type": "iteration", "repetitions": 1,
        "repetition_index": 0, "threads": 1, "iterations": 1,
        "real_time": wall, "cpu_time": wall, "time_unit": "s",
        "comm_bytes_per_step": sum(t["bytes"] for t in world.values()),
        "collectives_per_step": sum(t["count"] for t in world.values()),
        "memory_peak_bytes": max(peak for _, _, peak in per_rank),
        "flops_per_step": compute["flops"],
        "model_comm_ms_per_step": comm_seconds * 1e3,
        "model_compute_ms_per_step": compute["predicted_seconds"] * 1e3,
        "model_exposed_comm_ms_per_step": compute["exposed_collective_seconds"] * 1e3,
        "model_step_ms": (compute["predicted_seconds"] + compute["exposed_collective_seconds"]) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--size", default="8B", choices=sorted(llama.CONFIGS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--checkpointing", choices=["both", "off", "on"], default="both",
                        help="activation checkpointing: a run without and one with it "
                             "(both), or one of them")
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16",
                        help="FSDP2's parameters in bfloat16 with float32 reductions, as "
                             "torchtitan trains (bf16), or all in float32")
    parser.add_argument("--no-floor", action="store_true", help="skip the floor's call")
    parser.add_argument("--json", metavar="FILE",
                        help="also write the steps as Google Benchmark JSON, for "
                             "ci/bench-compare --counters-only")
    args = parser.parse_args()
    base = None
    if not args.no_floor:
        base, _, _ = timed(floor, args.gpus)
        print(f"floor: {args.gpus} ranks start, make their group and end in {base:.1f} s")
    rows = []
    for checkpointing in {"both": [False, True], "off": [False], "on": [True]}[args.checkpointing]:
        wall, per_rank, comm = timed(step, args.gpus, args.size, args.batch, args.seq,
                                     checkpointing, args.precision == "bf16")
        label = f"{args.size} FSDP2 step{' with activation checkpointing' if checkpointing else ''}"
        versus = f"x{wall / base:.1f} the floor; " if base else ""
        print(f"{label} on {args.gpus} simulated H100s, shape-only: {wall:.1f} s "
              f"({versus}in the step {max(took for took, _, _ in per_rank):.1f} s on the "
              f"slowest rank); the step's peak allocated memory "
              f"{max(peak for _, _, peak in per_rank) / 2**30:.2f} GiB on the fullest GPU")
        for op, totals in sorted(comm[0].get("world", {}).items()):
            print(f"  {op}: {totals['count']} calls, {totals['bytes'] / 2**30:.2f} GiB, "
                  f"{totals['predicted_seconds'] * 1e3:.1f} ms on {totals['platform']}")
        name = (f"shapes/{args.size}/fsdp2/{args.precision}{'/ac' if checkpointing else ''}"
                f"/{args.gpus}")
        rows.append(row(name, wall, per_rank, comm))
        r = rows[-1]
        print(f"  predicted step on rank 0's node: {r['model_step_ms']:.1f} ms = compute "
              f"{r['model_compute_ms_per_step']:.1f} ms ({r['flops_per_step'] / 1e12:.1f} TFLOP "
              f"on the slowest rank) + exposed collectives "
              f"{r['model_exposed_comm_ms_per_step']:.1f} ms (of "
              f"{r['model_comm_ms_per_step']:.1f} ms)")
    if args.json:
        context = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "backend": "sim",
                   "ranks": args.gpus, "benchmark": "bench_shapes.py"}
        with open(args.json, "w") as out:
            json.dump({"context": context, "benchmarks": rows}, out, indent=1)


if __name__ == "__main__":
    main()
