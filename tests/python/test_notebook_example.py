"""The notebook's own training function, as a notebook for an 8xH100 node has it (an MLP
with DDP, a DistributedSampler, Adam and mlflow.log_metric inside the function; setup()
with torch.cuda.set_device and "nccl", the model and batches on cuda:LOCAL_RANK,
DDP(device_ids=[device])), unchanged, on 8 simulated H100s."""

import mlflow
import pytest

import sgpu
from sgpu import distributed


@distributed(gpus=8, gpu_type="H100")
def run_train(num_epochs: int, batch_size: int):
    import os

    import mlflow
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    def setup():
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        return local_rank

    def cleanup():
        dist.destroy_process_group()

    local_rank = setup()
    device = torch.device(f"cuda:{local_rank}")
    torch.manual_seed(0)
    features = torch.randn(64, 10)
    labels = (features.sum(dim=1) > 0).long()
    dataset = TensorDataset(features, labels)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    model = model.to(device)
    model = DDP(model, device_ids=[device])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = torch.nn.CrossEntropyLoss()
    step = 0
    for epoch in range(num_epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            if dist.get_rank() == 0:
                mlflow.log_metric("loss", loss.item(), step=step)
            step += 1
    cleanup()
    return sgpu.get_global_rank()


def test_the_notebook_example_trains_and_logs_into_the_calls_run():
    assert run_train.distributed(num_epochs=3, batch_size=2) == list(range(8))
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "run_train"
    assert run.data.params["gpus"] == "8"
    history = mlflow.MlflowClient().get_metric_history(run.info.run_id, "loss")
    # 64 samples over 8 ranks, batches of 2: 4 steps an epoch
    assert sorted(m.step for m in history) == list(range(12))


def test_a_call_under_an_active_run_is_nested_in_it():
    @distributed(gpus=2)
    def logs():
        import mlflow

        mlflow.log_metric("inner", float(sgpu.get_global_rank()), step=sgpu.get_global_rank())
        return sgpu.get_global_rank()

    with mlflow.start_run(run_name="outer") as outer:
        assert logs.distributed() == [0, 1]
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    child = next(r for r in runs if r.info.run_id != outer.info.run_id)
    assert child.data.tags["mlflow.parentRunId"] == outer.info.run_id
    history = mlflow.MlflowClient().get_metric_history(child.info.run_id, "inner")
    assert sorted((m.step, m.value) for m in history) == [(0, 0.0), (1, 1.0)]


def test_sgpu_log_metric_lands_in_the_calls_run():
    @distributed(gpus=3)
    def logs():
        for step in range(5):
            sgpu.log_metric("through_sgpu", step * 10.0 + sgpu.get_global_rank(), step=step)
        sgpu.log_param(f"rank{sgpu.get_global_rank()}", "yes")

    logs.distributed()
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    history = mlflow.MlflowClient().get_metric_history(run.info.run_id, "through_sgpu")
    assert sorted((m.step, m.value) for m in history) == sorted(
        (s, s * 10.0 + r) for s in range(5) for r in range(3))
    assert {run.data.params[f"rank{r}"] for r in range(3)} == {"yes"}
