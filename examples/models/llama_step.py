"""FSDP2 training steps of llama.py's model (or mpt.py's, `--size mpt-7b`), as a script
that torchrun (or `sgpu run`) starts on every GPU of a node, written as one is written for
the node:

    torchrun --nproc-per-node 8 examples/models/llama_step.py --size 8B
    SGPU_SIM_COMPUTE=shapes sgpu run --backend sim --gpus 8 -- \\
        python examples/models/llama_step.py --size 8B --ac selective
    sgpu run --backend sim --nnodes 64 --nproc-per-node 8 --sim-compute shapes --sim-fold \\
        -- python examples/models/llama_step.py --size 405B --tp 8 --ac full

The second runs it on 8 simulated H100s in shape-only compute (docs/simulation.md): no
weights, no data, the step's collectives, peak memory and predicted time as on the node.
The third runs Llama 3.1 405B in torchtitan's 2D parallelism (tensor parallel in each node,
FSDP2 across 64 nodes) on 512 simulated H100s, node 0's ranks standing for every node's (a
folded world). It prints GPU 0's peak memory and the last step's time and tokens per second
per GPU.
"""

import argparse
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import llama  # noqa: E402
import mpt  # noqa: E402

CONFIGS = {**llama.CONFIGS, **mpt.CONFIGS}


def step_seconds(step, breakdown: bool = False) -> tuple[float, str]:
    """How long `step` takes on GPU 0: in sgpu's shape-only compute, the time its compute
    model predicts for it (with `breakdown`, rank 0 prints the operators that take most of
    it); elsewhere, the wall clock's, the GPU synchronised around it."""
    try:
        from sgpu import compute_stats
    except ImportError:
        compute_stats = dict
    before = compute_stats()
    torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    after = compute_stats()
    if not after.get("platform"):
        return wall, "measured"
    if breakdown and int(os.environ.get("RANK", 0)) == 0:
        ops = {op: t["predicted_seconds"] - before.get("ops", {}).get(op, {}).get(
            "predicted_seconds", 0) for op, t in after["ops"].items()}
        for op, seconds in sorted(ops.items(), key=lambda item: -item[1])[:15]:
            count = after["ops"][op]["count"] - before.get("ops", {}).get(op, {}).get("count", 0)
            print(f"  {op}: {seconds:.4f} s in {count} calls")
    def step_end(stats):  # the compute's critical path and the collectives exposed past it
        return stats.get("predicted_seconds", 0) + stats.get("exposed_collective_seconds", 0)

    return step_end(after) - step_end(before), f"predicted on {after['platform']}"


def flops_per_token(model, config, seq: int) -> float:
    """The model's FLOPs per token as torchtitan counts them for MFU: 6 per parameter (the
    embeddings' aside) and 12 * layers * dim * sequence for attention. Recomputation is not
    counted: it is the model's work, not the GPU's."""
    embeddings = sum(p.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding)
                     for p in m.parameters(recurse=False))
    parameters = sum(p.numel() for p in model.parameters()) - embeddings
    return 6 * parameters + 12 * config.n_layers * config.dim * min(seq, config.max_seq_len)


def mark_step(tokens: float, flops: float) -> None:
    """The step's end, for sgpu's own line on each step (sgpu.step()); nothing without sgpu."""
    try:
        import sgpu
    except ImportError:
        return
    sgpu.step(tokens=tokens, flops=flops)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="8B", choices=sorted(CONFIGS))
    parser.add_argument("--batch", type=int, default=1, help="sequences a micro-batch")
    parser.add_argument("--accum", type=int, default=1,
                        help="micro-batches a step (gradient accumulation)")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--ac", choices=["none", "selective", "full"], default="none",
                        help="activation checkpointing: none, torchtitan's per-operator "
                        "selective policy, or each block's activations recomputed in backward")
    parser.add_argument("--checkpointing", action="store_true", help="the same as --ac full")
    parser.add_argument("--tp", type=int, default=1,
                        help="tensor-parallel ranks (torchtitan's 2D parallelism: tensor "
                        "parallel over each group of this many consecutive ranks, a node's "
                        "GPUs at 8, FSDP2 across the groups)")
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--loss", choices=["float32", "fused"], default="float32",
                        help="the loss on the logits made float32 (torchtitan's), or on the "
                        "logits as they are, as a fused cross-entropy kernel (llm-foundry's)")
    parser.add_argument("--steps", type=int, default=1,
                        help="steps to run; the last one's time is printed (from the second "
                        "on, the optimizer's state is held through forward and backward, as "
                        "in a long run)")
    parser.add_argument("--peak-tflops", type=float, default=989.4,
                        help="the dense bf16 peak MFU is a share of (default: the H100 SXM's, "
                        "as torchtitan reports MFU for its H100s)")
    parser.add_argument("--breakdown", action="store_true",
                        help="in shape-only compute, the operators that take most of the "
                        "last step's predicted time")
    args = parser.parse_args()

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    config = CONFIGS[args.size]
    family = llama
    if isinstance(config, mpt.Config):
        config, family = config.at(args.seq), mpt
    world = dist.get_world_size()
    if args.tp < 1 or world % args.tp or (args.tp > 1 and family is not llama):
        parser.error(f"--tp {args.tp}: tensor parallelism takes a divisor of the world's "
                     f"{world} ranks, for a Llama size")
    mesh = (init_device_mesh("cuda", (world,)) if args.tp == 1 else
            init_device_mesh("cuda", (world // args.tp, args.tp), mesh_dim_names=("dp", "tp")))
    model = family.build(config, mesh, "full" if args.checkpointing else args.ac,
                         args.precision == "bf16")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # torchtitan's tokens per GPU: a tensor-parallel group's GPUs share its batch.
    tokens = args.accum * args.batch * min(args.seq, config.max_seq_len) / args.tp
    per_token = flops_per_token(model, config, args.seq)
    for _ in range(args.steps):
        seconds, how = step_seconds(lambda: llama.train_step(model, optimizer, args.batch,
                                                             args.seq, args.accum,
                                                             args.loss),
                                    args.breakdown)
        mark_step(tokens, tokens * per_token)
    if dist.get_rank() == 0:
        layout = f" (FSDP {world // args.tp} x TP {args.tp})" if args.tp > 1 else ""
        print(f"{args.size} step on {world} GPUs{layout}: peak allocated "
              f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB, peak reserved "
              f"{torch.cuda.max_memory_reserved() / 2**30:.2f} GiB on GPU 0; step {args.steps} "
              f"{seconds:.4g} s ({how}), {tokens / seconds:,.0f} tokens/s per GPU; MFU "
              f"{tokens / seconds * per_token / (args.peak_tflops * 1e12):.0%}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
