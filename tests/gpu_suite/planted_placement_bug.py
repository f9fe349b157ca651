"""A torchrun-style script's bug that a GPU node catches: the ranks never call
torch.cuda.set_device, so all of them are on cuda:0 and NCCL refuses the group's first
collective ("Duplicate GPU detected"). Not collected by default: the suite's own test runs it
and expects it to fail."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, world: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("nccl", rank=rank, world_size=world)  # no set_device: the bug
    tensor = torch.ones(2, device="cuda")
    dist.all_reduce(tensor)
    dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_ranks_without_set_device(free_port):
    mp.spawn(_rank, args=(2, free_port), nprocs=2)
