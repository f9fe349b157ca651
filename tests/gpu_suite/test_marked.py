"""A test function run on several simulated GPUs by the plugin's marker."""

import pytest


@pytest.mark.sgpu(gpus=4)
def test_every_rank_sums_the_same():
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(__import__("os").environ["LOCAL_RANK"]))
    tensor = torch.tensor([float(rank)], device="cuda")
    dist.all_reduce(tensor)
    assert tensor.item() == 6.0
    dist.destroy_process_group()
