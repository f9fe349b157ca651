#!/usr/bin/env python3
"""Runs the gpu-labelled tests that ci/gpu-pack built and packed, on a GPU node.

The node needs PyTorch of the version they were built against (built-against.txt) and
nothing else: the tests load libtorch from the node's torch package and sgpu's CUDA
module from this folder. Each test runs as CTest would run it (gpu-tests.json, from
`ctest --show-only=json-v1`), with its run folders and file store in a temporary folder.
Prints the inventory and every test's output; exits 0 when every test passed (a test
that needs more GPUs than the node has is skipped, and passes), 1 when one failed, 2 for
another torch, 3 when torch sees no GPU (every test would only skip; --allow-no-gpu runs
them anyway, to check the packing on a machine without one).

Then it calibrates the kernel model of the GPU's platform (gpu_calibrate.py, on the packed
platform file whose GPU type the device's name gives: H100, H200) and writes the
calibrated platform file into --calibration (default $OUT/calibration where $OUT is set,
else calibration/ beside this script); a GPU with no such platform is not calibrated.

    python3 .gpu-prebuilt/gpu_run.py [--timeout SECONDS] [--allow-no-gpu] [--calibration DIR]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    parser = argparse.ArgumentParser(description="Runs the packed gpu tests.")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per test")
    parser.add_argument("--allow-no-gpu", action="store_true")
    parser.add_argument("--calibration", default=os.path.join(
        os.environ["OUT"] if os.environ.get("OUT") else HERE, "calibration"),
        help="where to write the calibrated platform file")
    args = parser.parse_args()
    import torch

    built = open(os.path.join(HERE, "built-against.txt")).read()
    want = re.search(r'SGPU_TORCH_VERSION "([^"]*)"', built).group(1)
    have = torch.__version__
    print(f"torch {have} (built against {want}), CUDA {torch.version.cuda}, "
          f"{torch.cuda.device_count()} GPU(s)", flush=True)
    if have.split("+")[0] != want.split("+")[0]:
        print(f"gpu_run: these tests were built against torch {want} but this node has "
              f"{have}; build on the node with ci/gpu-check instead", file=sys.stderr)
        return 2
    if torch.cuda.device_count() == 0 and not args.allow_no_gpu:
        print("gpu_run: torch sees no GPU here, so every test would only skip "
              "(--allow-no-gpu runs them anyway)", file=sys.stderr)
        return 3
    env = dict(os.environ)
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    env["LD_LIBRARY_PATH"] = torch_lib + (":" + env["LD_LIBRARY_PATH"]
                                          if env.get("LD_LIBRARY_PATH") else "")
    env["SGPU_CUDA_MODULE"] = os.path.join(HERE, "lib", "libsgpu_cuda_runtime.so")
    env.pop("SGPU_BACKEND", None)
    work = tempfile.mkdtemp(prefix="sgpu-gpu-run-")

    print("== inventory", flush=True)
    subprocess.run([os.path.join(HERE, "bin", "inventory")], env=env, check=False)

    tests = json.load(open(os.path.join(HERE, "gpu-tests.json")))["tests"]
    failed = []
    for test in tests:
        test_env = dict(env)
        properties = {p["name"]: p["value"] for p in test.get("properties", [])}
        for entry in properties.get("ENVIRONMENT", []):
            key, _, value = entry.partition("=")
            if key == "SGPU_RUNS_DIR":
                value = os.path.join(work, "test-runs")
            elif key == "MLFLOW_TRACKING_URI":
                value = "file:" + os.path.join(work, "test-mlruns")
            test_env[key] = value
        command = [os.path.join(HERE, "bin", os.path.basename(test["command"][0]))]
        command += test["command"][1:]
        print(f"== {test['name']}: {' '.join(command[1:])}", flush=True)
        start = time.monotonic()
        try:
            code = subprocess.run(command, env=test_env, cwd=work,
                                  timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        seconds = time.monotonic() - start
        print(f"== {test['name']}: {'passed' if code == 0 else f'FAILED ({code})'} "
              f"in {seconds:.1f} s", flush=True)
        if code != 0:
            failed.append(test["name"])
    print(f"gpu_run: {len(tests) - len(failed)} of {len(tests)} passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    calibrate(torch, args.calibration)
    return 1 if failed else 0


# The packed platform file calibrated for a device whose name holds the key.
PLATFORMS = {"H100": "h100-nvswitch", "H200": "h200-nvswitch"}


def calibrate(torch, out):
    """The kernel model's microbenchmarks on GPU 0, into a calibrated platform file."""
    if torch.cuda.device_count() == 0:
        return
    name = torch.cuda.get_device_name(0)
    platform = next((p for key, p in PLATFORMS.items() if key in name), None)
    if platform is None:
        print(f"== calibration: no packed platform for {name}; not calibrated", flush=True)
        return
    print(f"== calibration of {platform} on {name}", flush=True)
    subprocess.run([sys.executable, os.path.join(HERE, "gpu_calibrate.py"), "--base",
                    os.path.join(HERE, "platforms", f"{platform}.json"), "--out", out],
                   check=False)


if __name__ == "__main__":
    sys.exit(main())
