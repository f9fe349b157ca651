"""Shape-only compute (sim_compute="shapes"): a rank's tensors carry shapes and no data,
and its collectives move no bytes, yet each is counted, sized and timed as the real one,
and each fake storage is its GPU's memory. The law: a training step records exactly the
collectives, bytes and predicted times in shapes that it records computing values, for
DDP, FSDP2, ZeRO and 2D (FSDP2 x tensor parallel) on 2, 4 and 8 ranks; an FSDP2 step peaks where the real one does; the
ranks meet at each collective, so a mismatch fails (and a skipped one is named:
test_sim_cuda.py)."""

import json
import pathlib

import pytest
import torch

import sgpu
from conftest import distributed_error
from sgpu_cli import needs_cli, sgpu_run
from sgpu import distributed

ROOT = pathlib.Path(__file__).resolve().parents[2]


def step(strategy: str, width: int) -> str:
    """Two training steps of a small MLP, as a user writes them for a GPU node."""
    import os

    import torch.distributed as dist

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 4)).cuda()
    if strategy == "2d":
        model = two_dimensional(width, dist.get_world_size())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    elif strategy == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    else:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[local], bucket_cap_mb=0.05)
        if strategy == "zero":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            optimizer = ZeroRedundancyOptimizer(model.parameters(),
                                                optimizer_class=torch.optim.AdamW, lr=1e-3)
        else:
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        loss = model(torch.randn(8, width, device="cuda")).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()
    return str(loss.device)


def two_dimensional(width: int, world: int):
    """torchtitan's 2D parallelism on a small MLP: tensor parallel over pairs of ranks (the
    first layer split by columns, the second by rows with its output split over the batch,
    the last by columns from that split: functional all-reduces, reduce-scatters and
    all-gathers of DTensor redistributions), then FSDP2 across the pairs."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    mesh = init_device_mesh("cuda", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width), torch.nn.Linear(width, 4)).cuda()
    parallelize_module(model, mesh["tp"], {
        "0": ColwiseParallel(), "2": RowwiseParallel(output_layouts=Shard(0)),
        "3": ColwiseParallel(input_layouts=Shard(0), output_layouts=Replicate())})
    return fully_shard(model, mesh=mesh["dp"])


def recorded(compute: str, gpus: int, strategy: str) -> list:
    """Each rank's collectives per group and op: (count, bytes, predicted seconds)."""
    call = distributed(gpus=gpus, tracking=False, sim_compute=compute)(step).launch(strategy, 96)
    assert call.result() == [f"cuda:{rank}" for rank in range(gpus)]
    return [{group: {op: (totals["count"], totals["bytes"], totals["predicted_seconds"])
                     for op, totals in ops.items()}
             for group, ops in rank.items()}
            for rank in call.comm_stats()]


@pytest.mark.parametrize("gpus", [2, 4, 8])
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2", "zero", "2d"])
def test_a_shape_only_step_records_the_collectives_of_the_real_one_exactly(strategy, gpus):
    values = recorded("values", gpus, strategy)
    assert any(values[0].values()), "the step made no collective"
    assert recorded("shapes", gpus, strategy) == values


def three_huge_layers() -> list:
    """Three 40000x40000 layers under FSDP2, one AdamW step: 19 GB of fp32 weights, 77 GB
    with gradients and AdamW's state; each rank's shards' shapes."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    torch.cuda.set_device(sgpu.get_local_rank())
    dist.init_process_group("nccl")
    model = torch.nn.Sequential(*[torch.nn.Linear(40_000, 40_000) for _ in range(3)]).cuda()
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 40_000, device="cuda")).sum().backward()
    optimizer.step()
    return [tuple(p.to_local().shape) for p in model.parameters()]


def test_a_model_far_larger_than_this_machine_steps_in_shapes():
    """On a machine of 24 GiB, and within two H100s. FSDP2 reduce-scatters each gradient
    once a step."""
    call = distributed(gpus=2, tracking=False, sim_compute="shapes",
                       sim_node="2xH100")(three_huge_layers).launch()
    assert call.result()[0] == [(20_000, 40_000), (20_000,)] * 3  # each rank's shards
    world = call.comm_stats()[0]["world"]
    assert world["reduce_scatter_tensor"]["count"] == 3
    assert world["reduce_scatter_tensor"]["bytes"] == 3 * (40_000 * 40_000 + 40_000) * 4


def fsdp2_peak(width: int) -> tuple:
    """One FSDP2 step of a small MLP; what the step took of the rank's GPU at its peak."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    torch.cuda.set_device(sgpu.get_local_rank())
    dist.init_process_group("nccl")
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)]).cuda()
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters())
    torch.cuda.reset_peak_memory_stats()
    for _ in range(2):
        model(torch.randn(64, width, device="cuda")).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()
    return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()


def test_a_shape_only_step_takes_the_memory_the_real_one_takes():
    """The simulated GPU counts a fake storage as CUDA's caching allocator would count its
    bytes, so a step peaks in shapes where it peaks computing values."""
    peaks = {compute: distributed(gpus=2, tracking=False, sim_compute=compute)(fsdp2_peak)
             .distributed(1024) for compute in ("values", "shapes")}
    for (allocated, reserved), (shape_allocated, shape_reserved) in zip(peaks["values"],
                                                                        peaks["shapes"]):
        assert allocated > 4 * 1024 * 1024 * 4  # the step's state is counted
        assert abs(shape_allocated - allocated) <= 0.05 * allocated, peaks
        assert abs(shape_reserved - reserved) <= 0.05 * reserved, peaks


def test_a_step_past_the_gpus_memory_fails_as_cuda_does_naming_rank_and_operator():
    too_big = distributed(gpus=2, tracking=False, sim_compute="shapes",
                          sim_node="2xH100:20GiB")(three_huge_layers)

    with pytest.raises(Exception) as caught:
        too_big.distributed()
    error = distributed_error(caught.value)
    assert isinstance(error, sgpu.DistributedError)
    root = error.root_cause
    assert root.exception_type.endswith("OutOfMemoryError"), root
    assert "CUDA out of memory. Tried to allocate" in root.message
    assert "shape-only compute, at aten." in root.message
    assert f"rank {root.rank}" in str(error)


def test_a_value_asked_of_a_fake_tensor_fails_naming_the_operator():
    @distributed(gpus=2, tracking=False, sim_compute="shapes")
    def reads_a_loss():
        torch.cuda.set_device(sgpu.get_local_rank())
        loss = torch.randn(4, device="cuda").sum()
        return loss.item()

    with pytest.raises(Exception) as caught:
        reads_a_loss.distributed()
    error = distributed_error(caught.value)
    assert isinstance(error, sgpu.DistributedError)
    assert "DataDependentOutputException" in error.root_cause.exception_type
    assert "aten._local_scalar_dense" in error.root_cause.message


def test_functional_collectives_run_in_shapes_and_their_outputs_are_the_gpus_memory():
    """Each functional collective is the group's collective, counted and sized as the c10d
    one; its output is a fake tensor of the rank's GPU, of the shape the real one has."""

    @distributed(gpus=2, tracking=False, sim_compute="shapes")
    def functional():
        import torch.distributed as dist
        import torch.distributed._functional_collectives as funcol

        torch.cuda.set_device(sgpu.get_local_rank())
        dist.init_process_group("nccl")
        x = torch.randn(1024, 256, device="cuda")
        before = torch.cuda.memory_allocated()
        gathered = funcol.all_gather_tensor(x, 0, dist.group.WORLD)
        reduced = funcol.all_reduce(x, "sum", dist.group.WORLD)
        scattered = funcol.reduce_scatter_tensor(x, "sum", 0, dist.group.WORLD)
        shapes = [tuple(t.wait().shape) for t in (gathered, reduced, scattered)]
        held = torch.cuda.memory_allocated() - before
        return shapes, str(gathered.device), held, type(gathered.elem).__name__

    call = functional.launch()
    shapes, device, held, kind = call.result()[1]
    assert shapes == [(2048, 256), (1024, 256), (512, 256)]
    assert device == "cuda:1" and kind == "FakeTensor"
    assert held == (2048 + 1024 + 512) * 256 * 4  # each output, as the caching allocator holds it
    ops = call.comm_stats()[1]["world"]
    assert ops["all_gather_into_tensor_coalesced"]["count"] == 1, ops
    assert ops["all_gather_into_tensor_coalesced"]["bytes"] == 2048 * 256 * 4, ops  # nccl-tests'
    assert ops["all_reduce"]["bytes"] == 1024 * 256 * 4, ops
    assert ops["reduce_scatter_tensor_coalesced"]["count"] == 1, ops


def test_bookkeeping_stays_real_in_shapes():
    """A device mesh's rank map, integer tensors and what they gather hold their values."""

    @distributed(gpus=2, tracking=False, sim_compute="shapes")
    def counts():
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        torch.cuda.set_device(sgpu.get_local_rank())
        dist.init_process_group("nccl")
        mesh = init_device_mesh("cuda", (2,))
        mine = torch.tensor([dist.get_rank() + 10], device="cuda")
        every = [torch.zeros(1, dtype=torch.int64, device="cuda") for _ in range(2)]
        dist.all_gather(every, mine)
        weights = torch.randn(3, 3, device="cuda")
        return mesh.mesh.tolist(), [t.item() for t in every], type(weights).__name__

    assert counts.distributed() == [([0, 1], [10, 11], "FakeTensor")] * 2


def values_of_fake_data(ids_file: str) -> list:
    """What a rank reads of integers made from fake data (each must refuse), and of integers
    that are bookkeeping (each must hold its values)."""
    torch.cuda.set_device(sgpu.get_local_rank())
    logits = torch.randn(4, 5, device="cuda")
    seen = []
    for name, read in [("count", lambda: (logits > 0).long().sum().item()),
                       ("row", lambda: logits[0].int().tolist()),
                       ("to", lambda: logits.to(torch.int64).tolist())]:
        try:
            seen.append((name, read()))
        except Exception as error:  # noqa: BLE001 - what the user sees
            seen.append((name, type(error).__name__))
    seen.append(("types", [type(t).__name__ for t in ((logits > 0).long(), logits.int())]))
    torch.manual_seed(3)
    drawn = torch.randint(0, 1000, (5,))
    torch.manual_seed(3)
    seen.append(("randint", drawn.tolist() == torch.randint(0, 1000, (5,)).tolist(),
                 type(drawn).__name__, sorted(torch.randperm(4).tolist())))
    loaded = torch.load(ids_file)
    seen.append(("load", loaded["ids"].tolist(), type(loaded["weights"]).__name__))
    return seen


def test_values_that_depend_on_fake_data_stay_fake_and_bookkeeping_stays_real(tmp_path):
    ids = tmp_path / "ids.pt"
    torch.save({"ids": torch.arange(5) * 7, "weights": torch.ones(3)}, ids)
    refused = "DataDependentOutputException"
    got = distributed(gpus=1, tracking=False, sim_compute="shapes")(values_of_fake_data) \
        .distributed(str(ids))[0]
    assert got == [("count", refused), ("row", refused), ("to", refused),
                   ("types", ["FakeTensor", "FakeTensor"]),
                   ("randint", True, "Tensor", [0, 1, 2, 3]),
                   ("load", [0, 7, 14, 21, 28], "FakeTensor")]


def saves_a_model(path: str) -> str:
    torch.cuda.set_device(sgpu.get_local_rank())
    model = torch.nn.Linear(8, 8).cuda()
    try:
        torch.save(model.state_dict(), path)
    except Exception as error:  # noqa: BLE001 - what the user sees
        return f"{type(error).__name__}: {error}"
    return "saved"


def test_a_save_of_fake_tensors_is_refused_and_leaves_the_file_as_it_was(tmp_path):
    path = tmp_path / "model.pt"
    torch.save(torch.nn.Linear(8, 8).state_dict(), path)
    before = path.read_bytes()
    got = distributed(gpus=1, tracking=False, sim_compute="shapes")(saves_a_model) \
        .distributed(str(path))[0]
    assert got.startswith("NotSimulatedError: ") and "fake tensors" in got, got
    assert "nothing was written" in got
    assert path.read_bytes() == before
    assert set(torch.load(path)) == {"weight", "bias"}


def matmuls(tf32: bool) -> tuple:
    """One bfloat16 and one float32 matmul on the rank's GPU, each timed alone."""
    torch.cuda.set_device(sgpu.get_local_rank())
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    before = sgpu.compute_stats()
    a @ b  # aten.mm
    after_bf16 = sgpu.compute_stats()
    a.float() @ b.float()  # two conversions and an mm
    after_fp32 = sgpu.compute_stats()
    a.view(512, 256).t().unsqueeze(0).detach().squeeze(0)  # views: no kernel
    after_views = sgpu.compute_stats()
    return [(stats["ops"].get("aten.mm", {}).get("count", 0),
             stats["ops"].get("aten.mm", {}).get("predicted_seconds", 0.0), stats["count"])
            for stats in (before, after_bf16, after_fp32, after_views)]


def test_each_operator_on_the_gpu_is_timed_on_the_nodes_roofline():
    """NOTE [The compute model], on a node whose platform has no kernel table (A10): an
    mm of 256x512 by 512x1024 is 2*256*512*1024 FLOPs over its inputs and output; in
    bfloat16 the A10 datasheet's 125 TFLOPS or its 600 GB/s time it, whichever is longer,
    in float32 the CUDA cores' 31.2, or the tensor cores' 62.5 where torch allows TF32.
    Per step figures are differences of sgpu.compute_stats()."""
    flops = 2 * 256 * 512 * 1024
    elements = 256 * 512 + 512 * 1024 + 256 * 1024
    bf16 = max(flops / 125e12, elements * 2 / 600e9)
    for tf32, peak in ((False, 31.2e12), (True, 62.5e12)):
        (n0, t0, c0), (n1, t1, c1), (n2, t2, c2), (_, _, c3) = distributed(
            gpus=2, tracking=False, sim_compute="shapes", sim_node="2xA10")(matmuls) \
            .distributed(tf32)[1]
        assert (n0, n1, n2) == (0, 1, 2)
        # Nothing else is a kernel: not the views matmul makes, nor questions of metadata.
        assert (c1 - c0, c2 - c1, c3 - c2) == (1, 3, 0)
        assert t0 == 0
        assert t1 == pytest.approx(bf16, rel=1e-9)
        assert t2 - t1 == pytest.approx(max(flops / peak, elements * 4 / 600e9), rel=1e-9)


def tiny_steps(steps: int) -> dict:
    """Training steps of a tiny MLP: what they add to the rank's compute estimate."""
    torch.cuda.set_device(sgpu.get_local_rank())
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 1)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8, device="cuda")
    before = sgpu.compute_stats()
    for _ in range(steps):
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    after = sgpu.compute_stats()
    return {"count": after["count"] - before["count"],
            "seconds": after["predicted_seconds"] - before["predicted_seconds"],
            "flops": after["flops"] - before["flops"], "bytes": after["bytes"] - before["bytes"]}


def test_a_tiny_models_step_is_bound_by_the_host_that_issues_its_kernels():
    """NOTE [The kernel model]: on the H100's table every eager operator costs the host
    `host_us` to issue and its kernel far less, so a tiny model's steps take the host's
    time, operator by operator, where the roofline alone would give nanoseconds."""
    platform = json.loads((ROOT / "src/model/platforms/h100-nvswitch.json").read_text())
    kernels = platform["compute"]["kernels"]
    assert kernels["kernel_floor_us"] < kernels["host_us"]
    got = distributed(gpus=1, tracking=False, sim_compute="shapes", sim_node="1xH100")(
        tiny_steps).distributed(5)[0]
    assert got["count"] >= 5 * 10
    assert got["seconds"] == pytest.approx(got["count"] * kernels["host_us"] * 1e-6, rel=1e-6)
    roofline = max(got["flops"] / 989.4e12, got["bytes"] / 3350e9)
    assert roofline < got["seconds"] / 1000


def beside_a_matmul(wait: str) -> dict:
    """An all-reduce of 256 MiB of bfloat16 and a 16384x8192 by 8192x8192 matmul, the
    all-reduce issued first: waited after the matmul is issued ("after"), at once
    ("at_once"), or at once through its future ("future", and "then" through a callback's
    future, as DDP's comm hooks do)."""
    import torch.distributed as dist

    torch.cuda.set_device(sgpu.get_local_rank())
    dist.init_process_group("nccl")
    a = torch.randn(16384, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    grads = torch.empty(128 << 20, device="cuda", dtype=torch.bfloat16)
    before = sgpu.compute_stats()
    work = dist.all_reduce(grads, async_op=True)
    if wait == "at_once":
        work.wait()
    elif wait == "future":
        work.get_future().wait()
    elif wait == "then":
        halved = work.get_future().then(lambda done: done.value()[0] / 2).wait()
        assert halved.shape == grads.shape and halved.device == grads.device
    a @ b
    if wait == "after":
        work.wait()
    a @ b
    after = sgpu.compute_stats()
    dist.destroy_process_group()
    return {key: after[key] - before[key]
            for key in ("predicted_seconds", "exposed_collective_seconds")}


def test_a_collective_is_exposed_only_where_nothing_runs_beside_it():
    """NOTE [The step's timeline]: an all-reduce (0.63 ms on two H100s) issued before a
    matmul (2.8 ms) and waited after it runs beside it, hidden; waited at once, the stream
    stops for all of it, whether through its Work or its future (NCCL's future completes
    with CUDA events on the collective's stream: its waiters wait on the GPU)."""
    call = distributed(gpus=2, tracking=False, sim_compute="shapes", sim_node="2xH100")(
        beside_a_matmul)
    hidden = call.distributed("after")[0]
    handle = call.launch("at_once")
    waited = handle.result()[0]
    all_reduce = handle.comm_stats()[0]["world"]["all_reduce"]
    assert all_reduce["count"] == 1
    assert hidden["predicted_seconds"] == pytest.approx(waited["predicted_seconds"], rel=1e-9)
    assert hidden["predicted_seconds"] > 4 * all_reduce["predicted_seconds"]
    assert hidden["exposed_collective_seconds"] == pytest.approx(0, abs=1e-9)
    assert waited["exposed_collective_seconds"] == pytest.approx(
        all_reduce["predicted_seconds"], rel=1e-6)
    through_future = call.distributed("future")[0]
    assert through_future["exposed_collective_seconds"] == pytest.approx(
        waited["exposed_collective_seconds"], rel=1e-6)
    # A then() callback runs after the collective's end, but its future waits on the host
    # only (shapes have no storage on a GPU to carry events): the matmuls hide it again.
    chained = call.distributed("then")[0]
    assert chained["exposed_collective_seconds"] == pytest.approx(0, abs=1e-9)


def ddp_step_then_a_matmul() -> dict:
    """A DDP step of one 8192x8192 bfloat16 layer (one bucket of 128 MiB), then a matmul:
    DDP's reducer waits for the bucket's all-reduce through its future at backward's end."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    local = sgpu.get_local_rank()
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    layer = torch.nn.Linear(8192, 8192, bias=False, device="cuda", dtype=torch.bfloat16)
    model = DistributedDataParallel(layer, device_ids=[local], bucket_cap_mb=1024)
    x = torch.randn(16384, 8192, device="cuda", dtype=torch.bfloat16)
    before = sgpu.compute_stats()
    model(x).sum().backward()
    x @ layer.weight
    after = sgpu.compute_stats()
    dist.destroy_process_group()
    return {key: after[key] - before[key]
            for key in ("predicted_seconds", "exposed_collective_seconds")}


def test_ddps_bucket_is_waited_for_through_its_future_before_what_follows_backward():
    """NOTE [The step's timeline]: the bucket's all-reduce is issued as backward's last
    gradient is ready and nothing runs beside it, so all of it is exposed, though the matmul
    after backward would have covered it had nothing waited."""
    call = distributed(gpus=2, tracking=False, sim_compute="shapes", sim_node="2xH100")(
        ddp_step_then_a_matmul).launch()
    got = call.result()[0]
    all_reduces = call.comm_stats()[0]["world"]["all_reduce"]
    bucket = all_reduces["predicted_seconds"] / all_reduces["count"]
    assert all_reduces["count"] == 1
    assert got["exposed_collective_seconds"] == pytest.approx(bucket, rel=1e-3)


def marked_steps() -> dict:
    """Three steps of one 16384x8192 by 8192x8192 bfloat16 matmul, each marked with its
    tokens and the model's FLOPs: each step's predicted seconds and the marks."""
    torch.cuda.set_device(sgpu.get_local_rank())
    a = torch.randn(16384, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    seconds = []
    for _ in range(3):
        before = sgpu.compute_stats()["predicted_seconds"]
        a @ b
        sgpu.step(tokens=16384, flops=2 * 16384 * 8192 * 8192)
        seconds.append(sgpu.compute_stats()["predicted_seconds"] - before)
    return {"seconds": seconds, "steps": sgpu.compute_stats()["steps"]}


def test_a_marked_step_is_predicted_from_the_mark_before_it_with_its_tokens_per_second(capfd):
    """sgpu.step() marks the end of a step: each is predicted from the mark before it, and
    the call's line says the last, with the tokens per second and the MFU it was told of."""
    call = distributed(gpus=1, tracking=False, sim_compute="shapes", sim_node="1xH100")(
        marked_steps).launch()
    got = call.result()[0]
    steps = got["steps"]
    assert len(steps) == 3 and steps == call.compute_stats()[0]["steps"]
    ends = [step["end"] for step in steps]
    assert ends[0] > got["seconds"][0]  # from the rank's start: the inputs' kernels too
    for seconds, start, end in zip(got["seconds"][1:], ends, ends[1:]):
        assert end - start == pytest.approx(seconds, rel=1e-9)
    assert steps[-1]["tokens"] == 16384 and steps[-1]["compute_end"] == steps[-1]["end"]
    last = got["seconds"][-1]
    err = capfd.readouterr().err
    assert (f"sgpu: steps (the slowest of any rank): 3 marked; the last {last:.4g} s on "
            f"h100-nvswitch (compute {last:.4g} s, exposed collectives 0 s), "
            f"{round(16384 / last):,} tokens/s per GPU, MFU "
            f"{round(2 * 16384 * 8192 * 8192 / last / 989.4e12 * 100)}%; typical error") in err
    sgpu.step(tokens=1)  # outside a rank: nothing to mark, nothing raised


def attention_block() -> float:
    """A bfloat16 attention layer's forward and backward, its parameters' gradients summed."""
    torch.cuda.set_device(sgpu.get_local_rank())
    layer = torch.nn.MultiheadAttention(256, 4, batch_first=True, device="cuda",
                                        dtype=torch.bfloat16)
    x = torch.randn(2, 128, 256, device="cuda", dtype=torch.bfloat16)
    layer(x, x, x, need_weights=False)[0].sum().backward()
    return 0.0


def test_a_calls_estimate_is_each_ranks_sum_and_shows_in_its_summary(capfd):
    call = distributed(gpus=2, tracking=False, sim_compute="shapes",
                       sim_node="2xH100")(attention_block).launch()
    call.result()
    stats = call.compute_stats()
    assert [rank["platform"] for rank in stats] == ["h100-nvswitch"] * 2
    for rank in stats:
        assert rank["flops"] > 4 * 2 * 128 * 256 * 256  # the four projections, at least
        assert rank["predicted_seconds"] == pytest.approx(
            sum(op["predicted_seconds"] for op in rank["ops"].values()), rel=1e-12)
        assert rank["count"] == sum(op["count"] for op in rank["ops"].values())
        assert "aten.addmm" in rank["ops"] or "aten.mm" in rank["ops"]
    assert stats[0]["ops"] == stats[1]["ops"]  # the same work on each rank
    err = capfd.readouterr().err
    assert "sgpu: compute (the most of any rank): " in err
    assert "on h100-nvswitch" in err


def test_a_rank_computing_values_times_nothing():
    call = distributed(gpus=2, tracking=False, sim_node="2xH100")(attention_block).launch()
    call.result()
    assert [rank["ops"] for rank in call.compute_stats()] == [{}, {}]


def attention(math_only: bool, checkpointed: bool = False) -> tuple:
    """Causal attention over 32 heads of 2048 tokens, forward and backward, in bfloat16
    (recomputed in backward when checkpointed): the peak allocated memory and the
    operators run."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.checkpoint import checkpoint

    torch.cuda.set_device(sgpu.get_local_rank())
    q = torch.randn(1, 32, 2048, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch.cuda.reset_peak_memory_stats()
    backends = [SDPBackend.MATH] if math_only else [SDPBackend.FLASH_ATTENTION,
                                                    SDPBackend.EFFICIENT_ATTENTION,
                                                    SDPBackend.MATH]
    def layer(q):
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)

    with sdpa_kernel(backends):
        out = checkpoint(layer, q, use_reentrant=False) if checkpointed else layer(q)
        out.sum().backward()
    return torch.cuda.max_memory_allocated(), sorted(sgpu.compute_stats()["ops"])


def test_attention_runs_the_fused_kernel_a_gpu_runs():
    """On an H100 torch runs bfloat16 attention as flash attention, which never holds the
    2048x2048 score matrices (256 MiB for the 32 heads); the math path does."""
    scores = 32 * 2048 * 2048 * 2
    fused = distributed(gpus=1, tracking=False, sim_compute="shapes")(attention)
    peak, ops = fused.distributed(False)[0]
    assert "aten._scaled_dot_product_flash_attention" in ops, ops
    assert "aten._scaled_dot_product_flash_attention_backward" in ops, ops
    assert peak < scores
    math_peak, math_ops = fused.distributed(True)[0]
    assert "aten.bmm" in math_ops and not any("flash" in op for op in math_ops), math_ops
    assert math_peak > 2 * scores
    # Recomputed in backward, which runs in the autograd engine's thread for the device.
    _, recomputed = fused.distributed(False, True)[0]
    assert recomputed == ops


def log_softmax_peak() -> tuple:
    """The peak of a float32 log_softmax over 64 MiB of logits on the GPU, above what was
    held before it, and the operators timed."""
    torch.cuda.set_device(sgpu.get_local_rank())
    logits = torch.empty(4096, 4096, device="cuda")
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = torch.log_softmax(logits, dim=-1)
    return torch.cuda.max_memory_allocated() - held, sorted(sgpu.compute_stats()["ops"]), \
        tuple(out.shape)


def test_an_operator_the_fake_kernels_decompose_takes_only_its_own_outputs():
    """torch's fake kernels run log_softmax as max, subtract, exp, sum and log, each with a
    64 MiB result; a GPU runs one kernel that makes the output alone. So does shape-only
    compute: one operator timed, one output's memory."""
    peak, ops, shape = distributed(gpus=1, tracking=False, sim_compute="shapes")(
        log_softmax_peak).distributed()[0]
    assert shape == (4096, 4096)
    assert peak == 4096 * 4096 * 4, peak
    assert ops == ["aten._log_softmax"], ops


def test_ranks_that_all_reduce_different_shapes_fail_alike_naming_each_other():
    @distributed(gpus=2, tracking=False, timeout=120, sim_compute="shapes")
    def uneven():
        import torch.distributed as dist

        torch.cuda.set_device(sgpu.get_local_rank())
        dist.init_process_group("nccl")
        dist.all_reduce(torch.ones(1024 * (1 + dist.get_rank()), device="cuda"))

    with pytest.raises(Exception) as caught:
        uneven.distributed()
    message = str(distributed_error(caught.value))
    assert "collective mismatch: the ranks of the group called different collectives: " \
           "rank 0 all_reduce of 1024 float32, sum; rank 1 all_reduce of 2048 float32, sum" \
           in message, message


@needs_cli
def test_a_python_program_under_sgpu_run_steps_in_shapes(tmp_path):
    """A script written for torchrun, under `sgpu run` with SGPU_SIM_COMPUTE=shapes: 77 GB of
    model state steps on this machine, and the call says what its collectives and compute
    would take on the node."""
    code, out, err = sgpu_run(tmp_path, f"""
        import sys
        sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})
        import sgpu
        from test_shapes import three_huge_layers  # this file's, run as a program's main

        print(f"rank {{sgpu.get_global_rank()}}: {{three_huge_layers()[0]}}")
        stats = sgpu.compute_stats()
        print(f"rank {{sgpu.get_global_rank()}} so far: {{stats['platform']}}, "
              f"{{stats['predicted_seconds'] > 0}}")
    """, "--gpus", "2", timeout=300, env={"SGPU_TRACKING": "off", "SGPU_SIM_COMPUTE": "shapes"})
    assert code == 0, err
    assert "rank 0: (20000, 40000)" in out and "rank 1: (20000, 40000)" in out
    # Inside the program, its rank's estimate so far, as inside a function.
    assert "rank 0 so far: h100-nvswitch, True" in out, out
    assert "reduce_scatter_tensor 3 calls" in err, err
    assert "sgpu: compute (the most of any rank): " in err and " on h100-nvswitch" in err, err


@needs_cli
def test_a_program_that_never_runs_in_shapes_fails_rather_than_compute_values(tmp_path):
    code, out, err = sgpu_run(tmp_path, "print('no torch here')\n", "--gpus", "2",
                              env={"SGPU_TRACKING": "off", "SGPU_SIM_COMPUTE": "shapes"})
    assert code != 0
    assert "ended without running in shape-only compute, which the call asked for" in err, err


def test_the_estimate_lands_in_the_calls_run_one_point_per_rank():
    import mlflow

    call = distributed(gpus=2, sim_compute="shapes", sim_node="2xH100")(matmuls).launch(False)
    call.result()
    stats = call.compute_stats()
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    client = mlflow.MlflowClient()
    for key, want in (("sgpu.compute.flops", [rank["flops"] for rank in stats]),
                      ("sgpu.compute.predicted_seconds",
                       [rank["predicted_seconds"] for rank in stats])):
        history = client.get_metric_history(run.info.run_id, key)
        assert [m.value for m in sorted(history, key=lambda m: m.step)] == \
            [pytest.approx(value, rel=1e-9) for value in want], key
    # No collective here: the step's predicted time is its compute's.
    steps = client.get_metric_history(run.info.run_id, "sgpu.predicted_seconds")
    assert [m.value for m in sorted(steps, key=lambda m: m.step)] == \
        [pytest.approx(rank["predicted_seconds"], rel=1e-9) for rank in stats]
    # Against the H100's dense bfloat16 peak, 989.4 TFLOPS.
    fractions = client.get_metric_history(run.info.run_id, "sgpu.compute.bfloat16_peak_fraction")
    assert [m.value for m in sorted(fractions, key=lambda m: m.step)] == \
        [pytest.approx(rank["flops"] / rank["predicted_seconds"] / 989.4e12, rel=1e-9)
         for rank in stats]


def bookkeeping_collectives(root: str) -> list:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    torch.cuda.set_device(sgpu.get_local_rank())
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    gathered = [None, None]
    dist.all_gather_object(gathered, {"rank": rank, "files": [f"f{rank}"]})
    sent = [{"from": 0}] if rank == 0 else [None]
    dist.broadcast_object_list(sent, src=0)
    model = torch.nn.Linear(4, 4).cuda()
    try:
        dcp.save(model.state_dict(), checkpoint_id=root)
        saved = "saved"
    except Exception as error:  # noqa: BLE001 - what the user sees
        saved = f"{type(error).__name__}: {error}"
    dist.destroy_process_group()
    return [gathered, sent, saved]


def test_bookkeeping_collectives_move_their_data_and_a_checkpoint_is_refused_in_shapes(tmp_path):
    root = tmp_path / "step-1"
    got = distributed(gpus=2, tracking=False, sim_compute="shapes")(
        bookkeeping_collectives).distributed(str(root))
    for gathered, sent, saved in got:
        assert gathered == [{"rank": 0, "files": ["f0"]}, {"rank": 1, "files": ["f1"]}]
        assert sent == [{"from": 0}]
        assert saved.startswith("NotSimulatedError: ") and "nothing was written" in saved, saved
    assert not root.exists()
