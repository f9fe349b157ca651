#!/usr/bin/env python3
"""What a GPU-gated pytest session costs on a simulated node, against the same tests
rewritten for the CPU, in one run on this machine.

Twenty small tests (a matmul, a convolution, a reduction, an optimizer step ...), written
twice:
  cpu          on device "cpu", no gate: the suite a project without GPUs would keep;
  sim          on device "cuda", each gated by skipif(not torch.cuda.is_available()), run
               under `sgpu sim -- pytest`: the session and its tests on 8 simulated H100s.
Each is the median wall time of --repeat sessions of `python -m pytest -q` in a fresh
interpreter, its torch import included; the aim is sim within 1.5x of cpu.

    PYTHONPATH=build/python /opt/sgpu/venv/bin/python bench/bench_gpu_suite.py \
        [--sgpu build/bin/sgpu] [--repeat 3] [--json out.json]
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

BODIES = [
    "a = torch.randn(64, 64, device=D); assert (a @ a).shape == (64, 64)",
    "x = torch.randn(2, 3, 16, 16, device=D); assert torch.nn.Conv2d(3, 4, 3).to(D)(x).shape[1] == 4",
    "x = torch.arange(100.0, device=D); assert x.sum().item() == 4950.0",
    "m = torch.nn.Linear(8, 2).to(D); o = torch.optim.SGD(m.parameters(), 0.1); "
    "m(torch.randn(4, 8, device=D)).sum().backward(); o.step()",
    "x = torch.randn(32, device=D); assert torch.allclose(x.softmax(0).sum(), torch.tensor(1.0, device=D))",
    "x = torch.randn(8, 8, device=D); assert torch.linalg.norm(x) >= 0",
    "x = torch.randint(0, 10, (50,), device=D); assert x.max().item() < 10",
    "x = torch.randn(4, 5, device=D); assert x.t().contiguous().shape == (5, 4)",
    "x = torch.ones(10, device=D); x[2:5] = 0; assert x.sum().item() == 7",
    "e = torch.nn.Embedding(10, 4).to(D); assert e(torch.tensor([1, 2], device=D)).shape == (2, 4)",
    "x = torch.randn(3, 4, device=D); assert torch.cat([x, x]).shape == (6, 4)",
    "l = torch.nn.LayerNorm(6).to(D); assert l(torch.randn(2, 6, device=D)).shape == (2, 6)",
    "x = torch.randn(16, device=D, requires_grad=True); (x * x).sum().backward(); "
    "assert torch.allclose(x.grad, 2 * x)",
    "x = torch.randn(5, 5, device=D); assert torch.allclose(x + 0, x)",
    "x = torch.randn(2, 8, device=D); assert torch.nn.functional.gelu(x).shape == x.shape",
    "x = torch.tensor([3.0, 1.0, 2.0], device=D); assert x.sort().values.tolist() == [1.0, 2.0, 3.0]",
    "x = torch.randn(4, 4, device=D); assert (x.to(torch.float16).float() - x).abs().max() < 0.01",
    "x = torch.randn(6, 6, device=D); assert torch.where(x > 0, x, 0).min() >= 0",
    "x = torch.ones(5, device=D); assert x.cumsum(0).tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]",
    "x = torch.zeros(3, device=D); x.add_(1); assert x.tolist() == [1.0, 1.0, 1.0]",
]


def write_suite(folder: str, device: str) -> str:
    path = os.path.join(folder, f"test_{device}.py")
    lines = ["import pytest", "import torch", f'D = "{device}"', ""]
    if device == "cuda":
        lines += ['gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")', ""]
    for i, body in enumerate(BODIES):
        if device == "cuda":
            lines.append("@gpu")
        lines += [f"def test_{i}():", textwrap.indent(body.replace("; ", "\n"), "    "), ""]
    with open(path, "w") as out:
        out.write("\n".join(lines))
    return path


def session(command: list, env: dict) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0 or f"{len(BODIES)} passed" not in done.stdout:
        sys.exit(f"bench_gpu_suite: {' '.join(command)} did not pass all tests:\n{done.stdout[-3000:]}"
                 f"{done.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sgpu", default=os.path.join(os.path.dirname(__file__), "..", "build",
                                                       "bin", "sgpu"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("SGPU_BACKEND", "SGPU_SIM")}
    env.update(SGPU_TRACKING="off", PYTHONDONTWRITEBYTECODE="1")
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    with tempfile.TemporaryDirectory() as folder:
        cpu, cuda = write_suite(folder, "cpu"), write_suite(folder, "cuda")
        times = {"cpu": [], "sim": []}
        for _ in range(args.repeat):  # interleaved: drift on the machine hits both alike
            times["cpu"].append(session([*pytest, cpu], env))
            times["sim"].append(session([args.sgpu, "sim", "--", *pytest, cuda], env))
    medians = {name: statistics.median(values) for name, values in times.items()}
    ratio = medians["sim"] / medians["cpu"]
    print(f"{len(BODIES)} small tests, median of {args.repeat} sessions each")
    print(f"  cpu   rewritten for the CPU         {medians['cpu']:7.2f} s   1.00x")
    print(f"  sim   GPU-gated, under sgpu sim     {medians['sim']:7.2f} s   {ratio:.2f}x "
          "(aim: at most 1.50x)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"seconds": medians, "ratio": ratio, "tests": len(BODIES)}, out, indent=2)


if __name__ == "__main__":
    main()
