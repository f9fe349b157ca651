"""The kernel model's calibration (ci/gpu_calibrate.py): what a GPU measured becomes a
platform file whose predictions follow the measurements. The measuring needs a GPU; the
fit and its use do not."""

import importlib.util
import json
import pathlib

import pytest
import torch

import sgpu
from sgpu import distributed

ROOT = pathlib.Path(__file__).resolve().parents[2]
H100 = json.loads((ROOT / "src" / "model" / "platforms" / "h100-nvswitch.json").read_text())


def calibration():
    spec = importlib.util.spec_from_file_location("gpu_calibrate", ROOT / "ci" / "gpu_calibrate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# What a slower H100 could measure: half the matmul rate the shipped table has.
MEASURED = {"matmul_tflops": {"8192x8192x8192": 400.0, "4096x4096x4096": 390.0},
            "attention_tflops": 300.0, "copy_gbps": 2680.0, "kernel_us": 4.0, "host_us": 7.5}


def test_the_fit_carries_each_measurement_into_the_kernel_table():
    fitted = calibration().fit(H100, MEASURED, "NVIDIA H100 80GB HBM3 (test)")
    kernels = fitted["compute"]["kernels"]
    # 8192^2 outputs in 128x256 tiles are 2048 tiles in 16 waves of 132: 97% of the SMs.
    assert kernels["matmul_tiles"] == [[128, 256, round(400 / (989.4 * 2048 / 2112), 4)]]
    assert kernels["attention_efficiency"] == round(300 / 989.4, 4)
    assert kernels["memory_efficiency"] == 0.8
    assert kernels["kernel_floor_us"] == 4.0 and kernels["host_us"] == 7.5
    assert "validation" not in kernels  # held to no measured run yet
    assert "measured on NVIDIA H100 80GB HBM3 (test)" in kernels["sources"][0]
    assert "8192x8192x8192 400.0" in kernels["sources"][0]
    assert fitted["name"] == "h100-nvswitch-calibrated" and fitted["default_for"] == []
    assert H100["compute"]["kernels"]["matmul_tiles"] == [[128, 256, 0.831]]  # base untouched


def test_a_matmul_faster_than_the_peak_is_refused():
    with pytest.raises(ValueError, match="not within the platform's peak of 989.4 TFLOPS"):
        calibration().fit(H100, dict(MEASURED, matmul_tflops={"8192x8192x8192": 1500.0}), "x")


def big_matmul() -> float:
    torch.cuda.set_device(sgpu.get_local_rank())
    a = torch.empty(8192, 8192, device="cuda", dtype=torch.bfloat16)
    before = sgpu.compute_stats()["predicted_seconds"]
    a @ a
    return sgpu.compute_stats()["predicted_seconds"] - before


def test_a_calibrated_platform_file_times_the_step_by_what_was_measured(tmp_path):
    """The calibrated file, named in the node's spec, times an 8192^3 bfloat16 matmul at
    the 400 TFLOPS measured, where the shipped table gives about 800."""
    fitted = calibration().fit(H100, MEASURED, "test")
    path = tmp_path / "h100-calibrated.json"
    path.write_text(json.dumps(fitted))
    seconds = {}
    for name, node in (("shipped", "1xH100"), ("calibrated", f"1xH100@{path}")):
        call = distributed(gpus=1, tracking=False, sim_compute="shapes", sim_node=node)
        seconds[name] = call(big_matmul).distributed()[0]
    flops = 2 * 8192 ** 3
    # The kernel, after the host's time to issue it (7.5 us measured; 10 us shipped).
    assert seconds["calibrated"] == pytest.approx(flops / 400e12 + 7.5e-6, rel=1e-4)
    assert seconds["shipped"] == pytest.approx(flops / 797.5e12 + 10e-6, rel=5e-3)
