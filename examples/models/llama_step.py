"""One FSDP2 training step of llama.py's model, as a script that torchrun (or `sgpu run`)
starts on every GPU of a node, written as one is written for the node:

    torchrun --nproc-per-node 8 examples/models/llama_step.py --size 8B
    SGPU_SIM_COMPUTE=shapes sgpu run --backend sim --gpus 8 -- \\
        python examples/models/llama_step.py --size 8B --ac selective

The second runs it on 8 simulated H100s in shape-only compute (docs/simulation.md): no
weights, no data, the step's collectives, peak memory and predicted time as on the node.
"""

import argparse
import os
import pathlib
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import llama  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="8B", choices=sorted(llama.CONFIGS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--ac", choices=["none", "selective", "full"], default="none",
                        help="activation checkpointing: none, torchtitan's per-operator "
                        "selective policy, or each block's activations recomputed in backward")
    parser.add_argument("--checkpointing", action="store_true", help="the same as --ac full")
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    args = parser.parse_args()

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    config = llama.CONFIGS[args.size]
    model = llama.build(config, init_device_mesh("cuda", (dist.get_world_size(),)),
                        "full" if args.checkpointing else args.ac, args.precision == "bf16")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    llama.train_step(model, optimizer, args.batch, args.seq)
    if dist.get_rank() == 0:
        print(f"{args.size} step on {dist.get_world_size()} GPUs: peak allocated "
              f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB, peak reserved "
              f"{torch.cuda.max_memory_reserved() / 2**30:.2f} GiB on GPU 0")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
