"""The frameworks the notebook decorator is used with, written for GPUs, on 4 simulated
H100s: PyTorch DDP and FSDP2 over a cuda mesh, DeepSpeed ZeRO-1, 2 and 3 with its default
(CUDA) accelerator, Hugging Face Accelerate with a plain Accelerator(), and PyTorch
Lightning with accelerator="gpu". In each, every rank trains on its own LOCAL_RANK device
and the ranks end with the same model."""

import os

import pytest
import torch

from sgpu import distributed

RANKS = 4


def data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=generator)
    return x, (x.sum(1, keepdim=True) > 0).float()


def fingerprint(parameters) -> list:
    return [round(float(p.detach().double().sum()), 6) for p in parameters]


def check(results):
    """Every rank on cuda:LOCAL_RANK, trained (its model moved), and all alike."""
    assert [r["device"] for r in results] == [f"cuda:{i}" for i in range(RANKS)]
    assert all(r["before"] != r["after"] for r in results)
    assert all(r["after"] == results[0]["after"] for r in results)


def test_fsdp2_over_a_cuda_mesh():
    @distributed(gpus=RANKS, tracking=False)
    def train():
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import DTensor

        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        mesh = init_device_mesh("cuda", (RANKS,))
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 1)).cuda()
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)

        def full():
            return fingerprint(p.full_tensor() if isinstance(p, DTensor) else p
                               for p in model.parameters())

        before = full()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        x, y = data()
        rank = torch.distributed.get_rank()
        x, y = x[rank::RANKS].cuda(), y[rank::RANKS].cuda()
        for _ in range(3):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        device = str(next(model.parameters()).to_local().device)
        return {"device": device, "before": before, "after": full()}

    check(train.distributed())


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_zero_with_its_cuda_accelerator(stage):
    pytest.importorskip("deepspeed")

    @distributed(gpus=RANKS, tracking=False)
    def train(stage):
        import deepspeed
        from deepspeed.accelerator import get_accelerator

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        before = fingerprint(model.parameters())
        engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
            config={"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": stage}})
        x, y = data()
        rank = torch.distributed.get_rank()
        for step in range(3):
            at = (step * RANKS + rank) * 8 % 64
            batch = x[at:at + 8].to(engine.device), y[at:at + 8].to(engine.device)
            loss = torch.nn.functional.mse_loss(engine(batch[0]), batch[1])
            engine.backward(loss)
            engine.step()
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters()),
                                               enabled=stage == 3):
            after = fingerprint(engine.module.parameters())
        return {"device": str(engine.device), "before": before, "after": after,
                "accelerator": get_accelerator().device_name()}

    results = train.distributed(stage)
    check(results)
    assert {r["accelerator"] for r in results} == {"cuda"}


# find_unused_parameters: DDP's reducer then keeps a pinned buffer, which it asserts is.
@pytest.mark.parametrize("find_unused", [False, True])
def test_accelerate_with_a_plain_accelerator(find_unused):
    pytest.importorskip("accelerate")

    @distributed(gpus=RANKS, tracking=False)
    def train(find_unused):
        from accelerate import Accelerator, DistributedDataParallelKwargs

        accelerator = Accelerator(kwargs_handlers=[
            DistributedDataParallelKwargs(find_unused_parameters=find_unused)])
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        before = fingerprint(model.parameters())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data()), batch_size=8)
        model, opt, loader = accelerator.prepare(model, opt, loader)
        for x, y in loader:
            opt.zero_grad()
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
        return {"device": str(accelerator.device), "before": before,
                "after": fingerprint(accelerator.unwrap_model(model).parameters()),
                "processes": accelerator.num_processes,
                "type": str(accelerator.distributed_type)}

    results = train.distributed(find_unused)
    check(results)
    assert {(r["processes"], r["type"]) for r in results} == {(RANKS, "DistributedType.MULTI_GPU")}


# The strategy Lightning's own error recommends for unused parameters, beside plain DDP.
@pytest.mark.parametrize("strategy", ["ddp", "ddp_find_unused_parameters_true"])
def test_lightning_with_a_gpu_accelerator(strategy):
    pytest.importorskip("lightning")

    @distributed(gpus=RANKS, tracking=False)
    def train(strategy):
        import lightning as L

        seen = set()

        class Model(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                               torch.nn.Linear(16, 1))

            def training_step(self, batch, index):
                seen.add(str(self.device))
                x, y = batch
                return torch.nn.functional.mse_loss(self.net(x), y)

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        torch.manual_seed(0)
        model = Model()
        before = fingerprint(model.parameters())
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data()), batch_size=8)
        trainer = L.Trainer(accelerator="gpu", devices=RANKS, strategy=strategy, max_epochs=1,
                            enable_progress_bar=False, enable_checkpointing=False, logger=False,
                            enable_model_summary=False)
        trainer.fit(model, loader)
        return {"device": seen.pop() if len(seen) == 1 else str(seen), "before": before,
                "after": fingerprint(model.parameters()), "world": trainer.world_size}

    results = train.distributed(strategy)
    check(results)
    assert {r["world"] for r in results} == {RANKS}
