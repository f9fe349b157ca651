#!/usr/bin/env python3
"""One training step of a production-size model in shape-only mode (sim_compute="shapes")
against, in the same run, a call on the same ranks that only starts its process group
and ends (the launch, torch's import and the group: the floor any step pays):

  step      examples/models/llama.py at --size (Llama 3's 8B by default) under FSDP2 on
            --gpus simulated H100s, one forward, backward and AdamW step of --batch x --seq
            tokens, without and with activation checkpointing: the call's wall time, its
            x over the floor, each rank's time in the step, the fullest GPU's peak allocated
            memory, and what the step's collectives are: count, bytes per op, and the
            collective model's predicted time on the node
  floor     the same call doing nothing but init_process_group and destroy_process_group

    PYTHONPATH=build/python /opt/sgpu/venv/bin/python bench/bench_shapes.py [--gpus 8]
"""

from __future__ import annotations

import argparse
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


def step(size: str, batch: int, seq: int, checkpoint_activations: bool) -> float:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    config = llama.CONFIGS[size]
    model = llama.Transformer(config).cuda()
    llama.shard(model, init_device_mesh("cuda", (dist.get_world_size(),)), checkpoint_activations)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    start = time.perf_counter()
    tokens = torch.randint(0, config.vocab_size, (batch, seq + 1)).cuda()
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    optimizer.step()
    took = time.perf_counter() - start
    dist.destroy_process_group()
    return took


def timed(function, gpus: int, *args):
    call = distributed(gpus=gpus, tracking=False, sim_compute="shapes", timeout=1800,
                       console_ranks=[])(function)
    start = time.perf_counter()
    handle = call.launch(*args)
    per_rank = handle.result()
    peak = max(m["allocated_bytes.all.peak"] for m in handle.memory_stats())
    return time.perf_counter() - start, per_rank, handle.comm_stats(), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--size", default="8B", choices=sorted(llama.CONFIGS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--no-checkpointing", action="store_true",
                        help="skip the run with activation checkpointing")
    args = parser.parse_args()
    base, _, _, _ = timed(floor, args.gpus)
    print(f"floor: {args.gpus} ranks start, make their group and end in {base:.1f} s")
    for checkpointing in [False] + ([] if args.no_checkpointing else [True]):
        wall, per_rank, comm, peak = timed(step, args.gpus, args.size, args.batch, args.seq,
                                           checkpointing)
        label = f"{args.size} FSDP2 step{' with activation checkpointing' if checkpointing else ''}"
        print(f"{label} on {args.gpus} simulated H100s, shape-only: {wall:.1f} s "
              f"(x{wall / base:.1f} the floor; in the step {max(per_rank):.1f} s on the "
              f"slowest rank); peak allocated {peak / 2**30:.2f} GiB on the fullest GPU")
        predicted = 0.0
        for op, totals in sorted(comm[0].get("world", {}).items()):
            predicted += totals["predicted_seconds"]
            print(f"  {op}: {totals['count']} calls, {totals['bytes'] / 2**30:.2f} GiB, "
                  f"{totals['predicted_seconds'] * 1e3:.1f} ms on {totals['platform']}")
        print(f"  communication predicted per step on rank 0: {predicted * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
