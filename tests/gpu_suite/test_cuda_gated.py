"""GPU-gated tests as a GPU project writes them: each skips where torch sees no GPU."""

import pytest
import torch

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")


@needs_cuda
def test_matmul_on_the_gpu():
    a = torch.randn(64, 32, device="cuda")
    b = torch.randn(32, 16, device="cuda")
    out = a @ b
    assert out.device.type == "cuda"
    torch.testing.assert_close(out.cpu(), a.cpu() @ b.cpu())


@needs_cuda
def test_memory_is_counted_on_the_device():
    before = torch.cuda.memory_allocated()
    block = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    assert torch.cuda.memory_allocated() - before >= block.numel()
    free, total = torch.cuda.mem_get_info()
    assert 0 < free <= total


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_copy_between_two_gpus():
    x = torch.arange(8.0, device="cuda:0")
    y = x.to("cuda:1")
    assert y.device == torch.device("cuda:1")
    assert torch.equal(y.cpu(), x.cpu())


@needs_cuda
def test_autocast_matmul_is_half():
    with torch.autocast("cuda", dtype=torch.float16):
        out = torch.randn(8, 8, device="cuda") @ torch.randn(8, 8, device="cuda")
    assert out.dtype == torch.float16
