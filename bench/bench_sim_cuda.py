#!/usr/bin/env python3
"""What CUDA on sim costs: training steps per second of the same model in one simulated
rank, on cuda (the simulated GPU: every operator through sgpu's CUDA kernels, which run the
CPU's) against the CPU (the same kernels, called directly: what SGPU_SIM_CUDA=off runs),
timed in one run, alternately, so that both see the same machine.

  mlp       the seed notebook's MLP (10 -> 32 -> 2, ReLU), batch 32, Adam, cross-entropy:
            small operators, where the per-operator cost shows; aim: at most 2x slower
  matmul    two 2048x2048 linear layers, batch 512, SGD: compute-bound; aim: at most 1.1x

Each figure is the median of --repeat timed runs of --steps steps (after warm-up steps).

    PYTHONPATH=build/python /opt/sgpu/venv/bin/python bench/bench_sim_cuda.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

os.environ.setdefault("SGPU_BACKEND", "sim")
os.environ.setdefault("SGPU_TRACKING", "off")

import sgpu  # noqa: E402


def measure(models: dict, repeat: int) -> dict:
    """In the rank: steps per second of each model on cpu and on cuda, alternately."""
    import time

    import torch

    torch.set_num_threads(1)

    def mlp(device):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 2)).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        x = torch.randn(32, 10, device=device)
        y = torch.randint(0, 2, (32,), device=device)
        loss_fn = torch.nn.CrossEntropyLoss()

        def step():
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()

        return step

    def matmul(device):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.Linear(2048, 2048))
        model = model.to(device)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(512, 2048, device=device)

        def step():
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()

        return step

    builders = {"mlp": mlp, "matmul": matmul}
    figures = {}
    for name, (steps, warmup) in models.items():
        runs = {"cpu": [], "cuda": []}
        made = {device: builders[name](device) for device in runs}
        for device, step in made.items():
            for _ in range(warmup):
                step()
        for _ in range(repeat):
            for device, step in made.items():
                start = time.perf_counter()
                for _ in range(steps):
                    step()
                runs[device].append(steps / (time.perf_counter() - start))
        figures[name] = {device: statistics.median(r) for device, r in runs.items()}
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--mlp-steps", type=int, default=200)
    parser.add_argument("--matmul-steps", type=int, default=3)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    run = sgpu.distributed(measure, gpus=1, timeout=None)
    models = {"mlp": (args.mlp_steps, 20), "matmul": (args.matmul_steps, 1)}
    (figures,) = run.distributed(models, args.repeat)
    aims = {"mlp": 2.0, "matmul": 1.1}
    print(f"{'model':<8} {'cpu steps/s':>12} {'cuda steps/s':>13} {'cuda/cpu time':>14}  aim")
    for name, f in figures.items():
        ratio = f["cpu"] / f["cuda"]
        f["slowdown"] = ratio
        print(f"{name:<8} {f['cpu']:>12.2f} {f['cuda']:>13.2f} {ratio:>13.2f}x  <= {aims[name]}x")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
