"""Communication accounting from Python: each rank's collectives per group and op, in the
handle and in the call's MLflow run, exactly as the function made them."""

import mlflow
import pytest
import torch

import sgpu
from sgpu import distributed


def test_the_handle_and_the_run_count_every_collective_and_its_bytes():
    @distributed(gpus=2)
    def talk(times):
        import torch.distributed as dist

        dist.init_process_group("sgpu")
        for _ in range(times):
            dist.all_reduce(torch.ones(1000))
        out = torch.empty(2 * 300, dtype=torch.float64)
        dist.all_gather_into_tensor(out, torch.ones(300, dtype=torch.float64))
        dist.destroy_process_group()
        return sgpu.get_global_rank()

    handle = talk.launch(3)
    assert handle.result() == [0, 1]
    for rank in handle.comm_stats():
        ops = rank["world"]
        assert {op: (t["count"], t["bytes"]) for op, t in ops.items()} == {
            "all_reduce": (3, 3 * 4000),
            "all_gather_into_tensor": (1, 2 * 300 * 8),  # the whole output
        }
        assert all(t["seconds"] >= 0 for t in ops.values())
        # 2 of 8xH100's GPUs: predicted on the NVSwitch node, a few microseconds each.
        assert all(t["platform"] == "h100-nvswitch" for t in ops.values())
        assert 3 * 5e-6 < ops["all_reduce"]["predicted_seconds"] < 3 * 50e-6
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    client = mlflow.MlflowClient()
    history = client.get_metric_history(run.info.run_id, "sgpu.comm.all_reduce.bytes")
    assert sorted((m.step, m.value) for m in history) == [(0, 12000.0), (1, 12000.0)]
    counts = client.get_metric_history(run.info.run_id, "sgpu.comm.all_gather_into_tensor.count")
    assert sorted((m.step, m.value) for m in counts) == [(0, 1.0), (1, 1.0)]
    predicted = client.get_metric_history(run.info.run_id, "sgpu.comm.all_reduce.predicted_seconds")
    want = handle.comm_stats()[0]["world"]["all_reduce"]["predicted_seconds"]
    assert [m.value for m in predicted] == [pytest.approx(want, rel=1e-9)] * 2
