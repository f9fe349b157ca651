"""Multi-GPU tests as torch's own suite and DDP users write them: a MultiProcessTestCase
gated by skip_if_lt_x_gpu, and an mp.spawn of an NCCL DDP group by env://."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from torch.testing._internal.common_distributed import (
    MultiProcessTestCase,
    requires_nccl,
    skip_if_lt_x_gpu,
)


class NcclAllReduceTest(MultiProcessTestCase):
    @property
    def world_size(self) -> int:
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    @requires_nccl()
    @skip_if_lt_x_gpu(2)
    def test_all_reduce_sums_on_each_gpu(self):
        store = dist.FileStore(self.file_name, self.world_size)
        torch.cuda.set_device(self.rank)
        dist.init_process_group("nccl", store=store, rank=self.rank, world_size=self.world_size)
        tensor = torch.full((4,), float(self.rank + 1), device="cuda")
        dist.all_reduce(tensor)
        self.assertEqual(tensor.cpu(), torch.full((4,), 3.0))
        dist.destroy_process_group()


def _train(rank: int, world: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 2).cuda(), device_ids=[rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(4, 8, device="cuda") * (rank + 1)).square().sum().backward()
        optimizer.step()
    weights = [torch.empty_like(model.module.weight) for _ in range(world)]
    dist.all_gather(weights, model.module.weight.detach())
    assert all(torch.equal(w, weights[0]) for w in weights), "replicas diverged"
    dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 4, reason="needs 4 GPUs")
def test_ddp_replicas_agree_after_training(free_port):
    mp.spawn(_train, args=(4, free_port), nprocs=4)
