"""Simulated GPUs with memory, from Python: a rank's cuda tensors count against their device
(its CPU tensors are host memory, as on a node), past the capacity the call raises
torch.OutOfMemoryError with CUDA's text, torch.cuda's figures are the simulated device's,
and every call reports each rank's figures, in its handle and its MLflow run. With
sim_cuda=False a rank's CPU tensors are its device's, as a C++ rank's are."""

import mlflow
import pytest
import torch

import sgpu
from sgpu import distributed

MiB = 1 << 20


def test_past_the_capacity_the_call_raises_torchs_out_of_memory_error():
    @distributed(gpus=2, sim_node="2xH100:64MiB")
    def big(rank):
        if sgpu.get_global_rank() == rank:
            torch.empty(80 * MiB, dtype=torch.uint8, device="cuda")
        return sgpu.get_global_rank()

    with pytest.raises(torch.OutOfMemoryError) as caught:
        big.distributed(1)
    assert str(caught.value).startswith(
        "CUDA out of memory. Tried to allocate 80.00 MiB. GPU 1 has a total capacity of "
        "64.00 MiB of which ")
    assert "is reserved by PyTorch but unallocated." in str(caught.value)
    # Below the capacity the same call runs.
    assert big.distributed(5) == [0, 1]


def test_cuda_tensors_count_host_tensors_do_not_and_torch_cuda_says_the_same():
    @distributed(gpus=2, tracking=False)
    def figures():
        def now():
            stats = sgpu.memory_stats()
            return stats["allocated_bytes.all.current"], stats["requested_bytes.all.current"]

        before = now()
        device = torch.empty(1000, dtype=torch.float32, device="cuda")
        after = now()
        host = torch.empty(MiB, dtype=torch.uint8)
        hosted = now()
        same = (torch.cuda.memory_allocated(), torch.cuda.memory_stats()) == (
            after[0], dict(sgpu.memory_stats()))
        free, total = torch.cuda.mem_get_info()
        reserved = torch.cuda.memory_reserved()
        del device, host
        torch.cuda.reset_peak_memory_stats()
        stats = sgpu.memory_stats()
        return (before, after, hosted, same, (free, total, reserved),
                (stats["allocated_bytes.all.peak"], stats["allocated_bytes.all.current"]))

    for before, after, hosted, same, (free, total, reserved), (peak, current) in (
            figures.distributed()):
        assert after[0] - before[0] == 4096  # 4000 bytes, rounded as the caching allocator does
        assert after[1] - before[1] == 4000
        assert hosted == after  # a CPU tensor is host memory
        assert same
        assert total == int(79.11 * 1024) << 20 and free == total - reserved
        assert peak == current  # reset: the peak starts again from now


def test_torch_cudas_figures_of_another_device_are_that_devices():
    @distributed(gpus=1, sim_node="2xH100", tracking=False)
    def figures():
        cuda = torch.cuda
        cuda.set_device(0)
        before = cuda.memory_allocated(1), cuda.memory_allocated(0)
        block = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda:1")
        out = {
            "current": cuda.current_device(),
            "allocated": cuda.memory_allocated(1) - before[0],
            "reserved": cuda.memory_reserved(1),
            "peak": cuda.max_memory_allocated(1),
            "stats": cuda.memory_stats(1)["allocated_bytes.all.current"] - before[0],
            "on_the_current": cuda.memory_allocated(0) - before[1],
        }
        del block
        return out

    out = figures.distributed()[0]
    assert out["current"] == 0
    assert out["allocated"] == out["stats"] == 64 * MiB
    assert out["reserved"] >= 64 * MiB and out["peak"] >= 64 * MiB
    assert out["on_the_current"] == 0


def test_with_sim_cuda_off_cpu_tensors_count_and_host_memory_does_not():
    @distributed(gpus=2, tracking=False, sim_cuda=False)
    def figures():
        def now():
            stats = sgpu.memory_stats()
            return stats["allocated_bytes.all.current"], stats["requested_bytes.all.current"]

        before = now()
        device = torch.empty(1000, dtype=torch.float32)
        after = now()
        with sgpu.host_memory():
            batch = torch.empty(MiB, dtype=torch.uint8)
            hosted = now()
        del device, batch
        sgpu.reset_peak_memory_stats()
        stats = sgpu.memory_stats()
        return before, after, hosted, (stats["allocated_bytes.all.peak"],
                                       stats["allocated_bytes.all.current"]), str(sgpu.device())

    for before, after, hosted, (peak, current), device in figures.distributed():
        assert after[0] - before[0] == 4096
        assert after[1] - before[1] == 4000
        assert hosted == after
        assert peak == current
        assert device == "cpu"


def test_the_handle_and_the_run_have_each_ranks_peaks():
    @distributed(gpus=3, sim_node="3xA10")
    def grow():
        kept = torch.zeros((sgpu.get_global_rank() + 1) * 4 * MiB, dtype=torch.uint8,
                           device=sgpu.device())
        return int(kept.numel())

    handle = grow.launch()
    assert handle.result() == [4 * MiB, 8 * MiB, 12 * MiB]
    memory = handle.memory_stats()
    assert [m["allocated_bytes.all.peak"] >= (r + 1) * 4 * MiB for r, m in enumerate(memory)] == [
        True] * 3
    assert all(m["num_ooms"] == 0 for m in memory)
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    history = mlflow.MlflowClient().get_metric_history(
        run.info.run_id, "sgpu.memory.peak_allocated_bytes")
    assert sorted((m.step, m.value) for m in history) == [
        (r, float(memory[r]["allocated_bytes.all.peak"])) for r in range(3)]
    reserved = mlflow.MlflowClient().get_metric_history(
        run.info.run_id, "sgpu.memory.peak_reserved_bytes")
    assert sorted(m.step for m in reserved) == [0, 1, 2]


def test_outside_a_rank_there_are_no_figures():
    assert sgpu.memory_stats() == {}
    with sgpu.host_memory():
        assert torch.ones(3).sum().item() == 3.0
