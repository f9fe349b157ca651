#!/usr/bin/env python3
"""Measures the kernel model's figures on this machine's GPU and writes a platform file
that carries them: the calibration of a platform (NOTE [The kernel model] in
src/model/kernels.h).

    python3 ci/gpu_calibrate.py --base PLATFORM.json --out DIR    # on a GPU node

It times, with torch on GPU 0, a few microbenchmarks, each the median of several runs
between CUDA events:
  - bfloat16 matmuls (8192^3, 4096^3, 2048^3 and a skinny 16384x1024x4096): the largest
    gives the table's tile fraction, as the shipped table's fraction was set from a
    published 8192^3 figure; the others are written beside it, to compare;
  - flash attention in bfloat16 (scaled_dot_product_attention, head dim 128): the
    attention fraction of the peak;
  - a 1 GiB device-to-device copy: the memory fraction of the datasheet's bandwidth;
  - 2,000 one-element additions queued behind a long kernel: the GPU's time per kernel
    (the floor); and the same issued with the GPU idle: the host's time per operator.
Then it writes DIR/<base>-calibrated.json: the base platform with those figures in its
"compute.kernels", the measurements and the device in its sources, and no "validation"
(a calibrated table is held to no measured run until bench/validate_predictions.py
compares it). `sgpu run` takes it as `SGPU_SIM=8xH100@DIR/<base>-calibrated.json`.

ci/gpu-pack packs this script; .gpu-prebuilt/gpu_run.py runs it after the tests, writing
into $OUT/calibration when $OUT is set. fit() is the part without a GPU, which the tests
check (tests/python/test_calibration.py).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

MATMULS = [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 2048, 2048), (16384, 1024, 4096)]
ATTENTION = (4, 32, 4096, 128)  # batch, heads, sequence, head dim
COPY_BYTES = 1 << 30
TINY_KERNELS = 2000


def fill(kernels: dict, m: int, n: int) -> float:
    """The share of the SMs the last wave of the table's best tile keeps busy, as the
    kernel model counts it (model/kernels.cc)."""
    best = 0.0
    for rows, cols, _ in kernels["matmul_tiles"]:
        tiles = math.ceil(m / rows) * math.ceil(n / cols)
        waves = math.ceil(tiles / kernels["sms"])
        best = max(best, tiles / (waves * kernels["sms"]))
    return best


def fit(base: dict, measured: dict, device: str) -> dict:
    """The base platform with the measured kernel figures in its table.

    `measured`: {"matmul_tflops": {"MxNxK": TFLOPS, ...}, "attention_tflops",
    "copy_gbps", "kernel_us", "host_us"}; the matmul "8192x8192x8192" is required."""
    platform = json.loads(json.dumps(base))
    compute = platform["compute"]
    kernels = compute["kernels"]
    peak = compute["peak_tflops"]["bfloat16"]
    square = measured["matmul_tflops"]["8192x8192x8192"]
    fraction = square / (peak * fill(kernels, 8192, 8192))
    if not 0 < fraction <= 1:
        raise ValueError(f"an 8192^3 bfloat16 matmul at {square:.1f} TFLOPS is not within "
                         f"the platform's peak of {peak} TFLOPS: is the base the GPU's?")
    kernels["matmul_tiles"] = [[rows, cols, round(fraction, 4)]
                               for rows, cols, _ in kernels["matmul_tiles"][:1]]
    kernels["attention_efficiency"] = round(min(measured["attention_tflops"] / peak, 1), 4)
    kernels["memory_efficiency"] = round(
        min(measured["copy_gbps"] / compute["memory_bandwidth_gbps"], 1), 4)
    kernels["kernel_floor_us"] = round(measured["kernel_us"], 2)
    kernels["host_us"] = round(measured["host_us"], 2)
    others = ", ".join(f"{shape} {tflops:.1f}" for shape, tflops in
                       measured["matmul_tflops"].items())
    kernels["sources"] = [
        f"measured on {device} with ci/gpu_calibrate.py: bfloat16 matmuls (TFLOPS) {others}; "
        f"flash attention {measured['attention_tflops']:.1f} TFLOPS; a 1 GiB copy "
        f"{measured['copy_gbps']:.0f} GB/s; {measured['kernel_us']:.2f} us a queued kernel, "
        f"{measured['host_us']:.2f} us of host time an eager operator"]
    kernels.pop("validation", None)
    platform["name"] = f"{base['name']}-calibrated"
    platform["description"] = f"{base['description']}; its kernel table measured on {device}"
    platform["default_for"] = []
    return platform


def measure() -> tuple[dict, str]:  # pragma: no cover - needs a GPU
    """The microbenchmarks on GPU 0."""
    import torch
    import torch.nn.functional as F

    def timed(run, repeats=5) -> float:
        run()  # warm up (the library's heuristics, the allocator)
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)

    device = torch.device("cuda", 0)
    bf16 = dict(device=device, dtype=torch.bfloat16)
    matmul = {}
    for m, n, k in MATMULS:
        a, b = torch.randn(m, k, **bf16), torch.randn(k, n, **bf16)
        matmul[f"{m}x{n}x{k}"] = 2 * m * n * k / timed(lambda: a @ b) / 1e12
        del a, b
    batch, heads, seq, dim = ATTENTION
    q, k, v = (torch.randn(batch, heads, seq, dim, **bf16) for _ in range(3))
    attention = 4 * batch * heads * seq * seq * dim / timed(
        lambda: F.scaled_dot_product_attention(q, k, v)) / 1e12
    del q, k, v
    source = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    copy = 2 * COPY_BYTES / timed(lambda: target.copy_(source)) / 1e9
    del source, target
    one = torch.zeros(1, device=device)
    long_a = torch.randn(8192, 8192, **bf16)

    def queued():
        long_a @ long_a  # the GPU is busy while the host queues the small kernels
        for _ in range(TINY_KERNELS):
            one.add_(1)

    kernel_us = (timed(queued) - timed(lambda: long_a @ long_a)) / TINY_KERNELS * 1e6
    torch.cuda.synchronize()
    hosts = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(TINY_KERNELS):
            one.add_(1)
        hosts.append((time.perf_counter() - start) / TINY_KERNELS * 1e6)
        torch.cuda.synchronize()
    name = (f"{torch.cuda.get_device_name(0)} (torch {torch.__version__}, CUDA "
            f"{torch.version.cuda}, {time.strftime('%Y-%m-%d')})")
    return {"matmul_tflops": matmul, "attention_tflops": attention, "copy_gbps": copy,
            "kernel_us": max(kernel_us, 0.0), "host_us": statistics.median(hosts)}, name


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the platform file to calibrate")
    parser.add_argument("--out", required=True, help="the folder to write the result into")
    args = parser.parse_args(argv)
    with open(args.base) as f:
        base = json.load(f)
    if "kernels" not in base.get("compute", {}):
        print(f"gpu_calibrate: {args.base} has no compute.kernels table to calibrate",
              file=sys.stderr)
        return 2
    measured, device = measure()
    print(json.dumps(measured, indent=1))
    platform = fit(base, measured, device)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{platform['name']}.json")
    with open(path, "w") as f:
        json.dump(platform, f, indent=2)
        f.write("\n")
    print(f"gpu_calibrate: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
