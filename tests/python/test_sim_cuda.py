"""CUDA on sim: code written for a GPU node runs unchanged in the ranks of a simulated node.
torch.cuda answers as the node, tensors live on cuda:N and compute on the CPU, a device
placement bug fails as it does on a GPU, "nccl" is sgpu's simulated transport, and what
cannot be simulated says so."""

import os
import re

import pytest
import torch

import sgpu
from conftest import distributed_error
from sgpu_cli import needs_cli, sgpu_run
from sgpu import distributed

MiB = 1 << 20


def test_torch_cuda_answers_as_the_simulated_node():
    @distributed(gpus=2, gpu_type="H100", sim_node="2xH100+2xA10", tracking=False)
    def answers():
        import time

        cuda = torch.cuda
        out = {
            "available": cuda.is_available(),
            "count": cuda.device_count(),
            "current": cuda.current_device(),
            "names": [cuda.get_device_name(i) for i in range(cuda.device_count())],
            "capabilities": [cuda.get_device_capability(i) for i in range(cuda.device_count())],
            "sms": [cuda.get_device_properties(i).multi_processor_count for i in range(4)],
            "memory": [cuda.get_device_properties(i).total_memory for i in range(4)],
            "figures": [(p.L2_cache_size, p.regs_per_multiprocessor,
                         p.max_threads_per_multi_processor, p.shared_memory_per_multiprocessor,
                         p.simulated, repr(p))
                        for p in map(cuda.get_device_properties, (0, 2))],
            "bf16": cuda.is_bf16_supported(),
            "initialized": cuda.is_initialized(),
            "accelerator": str(torch.accelerator.current_accelerator()),
        }
        cuda.set_device(3)
        out["after_set"] = cuda.current_device()
        with cuda.device(1):
            out["inside"] = (cuda.current_device(), str(torch.empty(1, device="cuda").device))
        out["outside"] = cuda.current_device()
        cuda.synchronize()
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        time.sleep(0.05)
        end.record()
        end.synchronize()
        out["elapsed_ms"] = start.elapsed_time(end)
        side = cuda.Stream()
        with cuda.stream(side):
            out["stream"] = cuda.current_stream() == side
        cuda.current_stream().wait_stream(side)
        return out

    for rank, out in enumerate(answers.distributed()):
        assert out["available"] and out["initialized"] and out["bf16"]
        assert out["count"] == 4 and out["current"] == rank  # bound to its GPU, as on cuda
        assert out["names"] == ["NVIDIA H100 80GB HBM3"] * 2 + ["NVIDIA A10"] * 2
        assert out["capabilities"] == [(9, 0), (9, 0), (8, 6), (8, 6)]
        assert out["sms"] == [132, 132, 72, 72]
        h100, a10 = out["figures"]
        assert h100[:5] == (50 << 20, 65536, 2048, 233472, True)
        assert a10[:5] == (6 << 20, 65536, 1536, 102400, True)
        assert h100[5].startswith("_CudaDeviceProperties(name='NVIDIA H100 80GB HBM3', major=9")
        assert h100[5].endswith(", L2_cache_size=50MB)") and "simulated" not in h100[5]
        assert out["memory"] == [int(79.11 * 1024) << 20] * 2 + [int(22.30 * 1024) << 20] * 2
        assert out["accelerator"] == "cuda"
        assert out["after_set"] == 3 and out["inside"] == (1, "cuda:1") and out["outside"] == 3
        assert 45 <= out["elapsed_ms"] < 5000
        assert out["stream"]


def test_a_streams_priority_is_kept_within_the_range_a_gpu_gives():
    @distributed(gpus=1, sim_node="2xH100", tracking=False)
    def priorities():
        cuda = torch.cuda
        high = cuda.Stream(priority=-1)
        with cuda.stream(high):
            current = cuda.current_stream().priority
        return {
            "range": cuda.Stream.priority_range(),
            "range_of_a_stream": high.priority_range(),
            "high": high.priority,
            "current": current,  # the current stream, as torch.cuda makes it anew
            "plain": cuda.Stream().priority,
            "default": cuda.default_stream().priority,
            "on_device_1": cuda.Stream(device=1, priority=-2).priority,
            "past_the_highest": cuda.Stream(priority=-10).priority,
            "past_the_lowest": cuda.Stream(priority=5).priority,
        }

    out = priorities.distributed()[0]
    least, greatest = out["range"]
    assert (least, greatest) == (0, -3) == out["range_of_a_stream"]
    assert out["high"] == out["current"] == -1
    assert out["plain"] == out["default"] == 0 and out["on_device_1"] == -2
    assert out["past_the_highest"] == greatest and out["past_the_lowest"] == least


def test_tensors_live_on_cuda_and_compute_as_the_cpu_does(tmp_path):
    @distributed(gpus=2, tracking=False)
    def compute(folder):
        local = int(os.environ["LOCAL_RANK"])
        device = torch.device(f"cuda:{local}")
        torch.manual_seed(0)
        weight, x = torch.randn(8, 4), torch.randn(3, 4)
        model = torch.nn.Linear(4, 8)
        expected = model(x)
        cuda_model = torch.nn.Linear(4, 8).cuda()
        cuda_model.load_state_dict(model.state_dict())
        on_device = cuda_model(x.to(device))
        made = [torch.zeros(2, device="cuda"), torch.ones(2, device=device), x.cuda(),
                torch.tensor([1.0], device=device), weight.to("cuda")]
        path = os.path.join(folder, f"state-{local}.pt")
        torch.save(cuda_model.state_dict(), path)
        loaded = torch.load(path)["weight"]
        moved = torch.load(path, map_location="cuda:1")["weight"]
        hosted = torch.load(path, map_location="cpu")["weight"]
        try:
            on_device.numpy()
            numpy_refused = False
        except TypeError:
            numpy_refused = True
        return {
            "devices": {str(t.device) for t in made} | {str(next(cuda_model.parameters()).device)},
            "is_cuda": all(t.is_cuda for t in made),
            "same": torch.equal(on_device.cpu(), expected),
            "item": on_device.sum().item() == expected.sum().item(),
            "numpy": numpy_refused and on_device.detach().cpu().numpy().shape == (3, 8),
            "loaded": (str(loaded.device), str(moved.device), str(hosted.device)),
            "storage": str(on_device.untyped_storage().device),
        }

    for rank, out in enumerate(compute.distributed(str(tmp_path))):
        assert out["devices"] == {f"cuda:{rank}"}
        assert out["is_cuda"] and out["same"] and out["item"] and out["numpy"]
        assert out["loaded"] == (f"cuda:{rank}", "cuda:1", "cpu")
        assert out["storage"] == f"cuda:{rank}"


def test_a_batch_left_on_the_cpu_fails_as_on_a_gpu():
    @distributed(gpus=2, tracking=False)
    def planted():
        model = torch.nn.Linear(4, 2).to(f"cuda:{os.environ['LOCAL_RANK']}")
        return model(torch.randn(3, 4)).sum().item()  # the batch never went to the device

    with pytest.raises(RuntimeError) as caught:
        planted.distributed()
    assert "Expected all tensors to be on the same device, but found at least two devices, " \
           "cuda:0 and cpu!" in str(caught.value) or "cuda:1 and cpu!" in str(caught.value)
    assert distributed_error(caught.value).root_cause is not None


def test_tensors_on_two_devices_of_one_process_fail_as_on_a_gpu():
    @distributed(gpus=1, tracking=False)
    def mixed():
        a = torch.ones(3, device="cuda:0")
        b = torch.ones(3, device="cuda:1")
        moved = (a + b.to("cuda:0")).sum().item()  # a copy between devices is fine
        try:
            a + b
        except RuntimeError as error:
            return moved, str(error)
        return moved, ""

    moved, message = mixed.distributed()[0]
    assert moved == 6.0
    assert message.startswith("Expected all tensors to be on the same device, but found at least "
                              "two devices, cuda:0 and cuda:1!")


def test_nccl_and_the_default_groups_run_on_the_simulated_transport():
    @distributed(gpus=2)
    def groups():
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        out = {}
        for spec in ("nccl", None, "cpu:gloo,cuda:nccl"):
            dist.init_process_group(spec) if spec else dist.init_process_group()
            t = torch.full((4,), float(dist.get_rank() + 1), device="cuda")
            dist.all_reduce(t)
            gathered = [None, None]
            dist.all_gather_object(gathered, {"rank": dist.get_rank()})
            host = torch.ones(2)
            if spec is not None and "gloo" in spec:  # CPU tensors go to Gloo where it is named
                dist.all_reduce(host)
            out[str(spec)] = (dist.get_backend(), t.tolist(), str(t.device), gathered,
                              host.tolist())
            dist.destroy_process_group()
        mesh = init_device_mesh("cuda", (2,))
        t = torch.ones(2, device="cuda")
        dist.all_reduce(t, group=mesh.get_group())
        out["mesh"] = (mesh.device_type, t.tolist())
        dist.destroy_process_group()
        return out

    handle = groups.launch()
    for rank, out in enumerate(handle.result()):
        assert out["nccl"][:3] == ("nccl", [3.0] * 4, f"cuda:{rank}")
        assert out["nccl"][3] == [{"rank": 0}, {"rank": 1}]
        assert out["None"][1:3] == ([3.0] * 4, f"cuda:{rank}")
        assert out["None"][0] == "undefined"  # what torch says of its default on a node
        assert out["cpu:gloo,cuda:nccl"][1:4] == out["None"][1:4]
        assert out["cpu:gloo,cuda:nccl"][4] == [2.0, 2.0]
        assert out["cpu:gloo,cuda:nccl"][0] == "cpu:gloo,cuda:nccl"
        assert out["mesh"] == ("cuda", [2.0, 2.0])
    # The cuda collectives went through sgpu's recorder: counted, with their bytes.
    world = handle.comm_stats()[0]["world"]
    assert world["all_reduce"]["count"] >= 3


def test_a_fault_plan_acts_on_an_nccl_group():
    @distributed(gpus=2, sim_faults="rank=1:exit=3@collective=2", tracking=False)
    def doomed():
        import torch.distributed as dist

        dist.init_process_group("nccl")
        for _ in range(3):
            dist.all_reduce(torch.ones(1, device="cuda"))
        return 0

    with pytest.raises(sgpu.DistributedError) as caught:
        doomed.distributed()
    root = caught.value.root_cause
    assert root.rank == 1 and root.exit_code == 3


@pytest.mark.parametrize("transport", ["shm", "gloo"])
def test_ddp_with_device_ids_trains_alike_on_every_rank(transport):
    @distributed(gpus=2, sim_transport=transport, tracking=False)
    def train():
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dist.init_process_group("nccl")
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                    torch.nn.Linear(8, 1)).cuda()
        model = DDP(model, device_ids=[local])
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(1 + dist.get_rank())  # each rank its own batch
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(8, 4, device="cuda")).pow(2).mean().backward()
            opt.step()
        params = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
        dist.destroy_process_group()
        return str(next(model.parameters()).device), params

    (d0, p0), (d1, p1) = train.distributed()
    assert (d0, d1) == ("cuda:0", "cuda:1")
    assert torch.equal(p0, p1)  # averaged gradients: the ranks agree


def test_autocast_and_the_grad_scaler_run_as_on_a_gpu():
    @distributed(gpus=1, tracking=False)
    def mixed_precision():
        import torch  # a local name: cloudpickle would carry torch.backends.cudnn by value

        model = torch.nn.Linear(16, 16).cuda()
        x = torch.randn(4, 16, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            bf16 = model(x).dtype
        scaler = torch.amp.GradScaler("cuda")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
        return str(bf16), scaler.get_scale(), str(next(model.parameters()).device)

    assert mixed_precision.distributed()[0] == ("torch.bfloat16", 65536.0, "cuda:0")


def test_what_cannot_be_simulated_says_so():
    @distributed(gpus=1, tracking=False)
    def unsimulated():
        import torch  # a local name: cloudpickle would carry torch.backends.cudnn by value

        x = torch.ones(4, device="cuda")
        said = {}
        attempts = {
            "graph": lambda: torch.cuda.CUDAGraph(),
            "nvml": lambda: torch.cuda.utilization(),
            "compile": lambda: torch.compile(lambda t: t * 2)(x),
            "cuda_only_op": lambda: torch.ops.aten._cudnn_init_dropout_state(
                0.5, True, 0, dtype=torch.uint8, device="cuda"),
            "ipc": lambda: x.untyped_storage()._share_cuda_(),
            "sparse": lambda: torch.sparse.mm(torch.eye(3, device="cuda").to_sparse(),
                                              torch.ones(3, 2, device="cuda")).tolist(),
            "raw_alloc": lambda: torch.cuda.caching_allocator_alloc(1024),
            "jiterator": lambda: torch.cuda.jiterator._create_jit_fn(
                "template <typename T> T f(T x) { return x; }")(x),
        }
        for name, attempt in attempts.items():
            try:
                ran = attempt()
                said[name] = ran if isinstance(ran, list) else ""
            except Exception as error:  # noqa: BLE001 - each must say why, whatever its type
                said[name] = f"{type(error).__name__}: {error}"
        # CPU inputs still compile.
        said["compile_cpu"] = torch.compile(lambda t: t * 2)(torch.ones(2)).tolist()
        # cuDNN's version answers, as on a node (none serves a simulated GPU).
        said["cudnn"] = (torch.backends.cudnn.version(),
                         torch.backends.cudnn.is_acceptable(x))
        # DataParallel copies between the simulated GPUs, forward and backward.
        model = torch.nn.DataParallel(torch.nn.Linear(4, 2).cuda(), device_ids=[0, 1])
        model(torch.ones(6, 4, device="cuda")).sum().backward()
        said["data_parallel"] = model.module.weight.grad.tolist()
        return said

    said = unsimulated.distributed()[0]
    assert said["cudnn"][0] >= 90000 and said["cudnn"][1] is False, said["cudnn"]
    assert said["data_parallel"] == [[6.0] * 4] * 2  # a batch of 6 ones, over two GPUs
    assert said["sparse"] == [[1.0, 1.0]] * 3, said["sparse"]  # runs on sparse.mm's CPU kernel
    assert said["raw_alloc"].startswith("NotSimulatedError: torch.cuda.caching_allocator_alloc ")
    assert said["jiterator"].startswith("NotSimulatedError: torch.cuda.jiterator._create_jit_fn ")
    assert said["graph"].startswith("NotSimulatedError: torch.cuda.CUDAGraph ")
    assert said["nvml"].startswith("NotSimulatedError: torch.cuda.utilization ")
    assert "torch.compile (backend 'inductor') compiles GPU kernels" in said["compile"]
    assert said["cuda_only_op"].startswith(
        "NotSimulatedError: sgpu: aten::_cudnn_init_dropout_state has a CUDA kernel and no CPU")
    assert "CUDA IPC" in said["ipc"]
    for name in ("graph", "nvml", "compile", "cuda_only_op"):
        assert "cuda backend" in said[name]
    assert said["compile_cpu"] == [2.0, 2.0]


def rnns_on_cuda_and_on_the_cpu() -> dict:
    import torch  # a local name, as in the test above

    seen = {}
    for kind in ("LSTM", "GRU"):
        for bias in (True, False):
            torch.manual_seed(0)
            on_cpu = getattr(torch.nn, kind)(4, 8, num_layers=2, bias=bias,
                                             bidirectional=True).double()
            on_gpu = getattr(torch.nn, kind)(4, 8, num_layers=2, bias=bias,
                                             bidirectional=True).double()
            on_gpu.load_state_dict(on_cpu.state_dict())
            on_gpu.cuda()
            x = torch.randn(5, 3, 4, dtype=torch.double)
            y_cpu, _ = on_cpu(x)
            y_gpu, _ = on_gpu(x.cuda())
            y_cpu.pow(2).sum().backward()
            y_gpu.pow(2).sum().backward()
            seen[f"{kind} bias={bias}"] = {
                "device": str(y_gpu.device),
                "outputs": (y_gpu.cpu() - y_cpu).abs().max().item(),
                "grads": max((a.grad - b.grad.cpu()).abs().max().item()
                             for a, b in zip(on_cpu.parameters(), on_gpu.parameters())),
            }
    half, _ = torch.nn.GRU(4, 8).cuda().half()(torch.randn(3, 2, 4, device="cuda").half())
    seen["half"] = str(half.dtype)
    try:  # CUDA's fused cells are built for float, double and half only
        torch.nn.LSTM(4, 8).cuda().bfloat16()(torch.randn(3, 2, 4, device="cuda").bfloat16())
        seen["bfloat16"] = "ran"
    except RuntimeError as error:
        seen["bfloat16"] = str(error)
    return seen


def test_an_lstm_and_a_gru_on_a_simulated_gpu_train_as_on_the_cpu():
    seen = distributed(gpus=1, tracking=False)(rnns_on_cuda_and_on_the_cpu).distributed()[0]
    for case in ("LSTM bias=True", "LSTM bias=False", "GRU bias=True", "GRU bias=False"):
        assert seen[case]["device"] == "cuda:0", case
        assert seen[case]["outputs"] < 1e-12 and seen[case]["grads"] < 1e-12, (case, seen[case])
    assert seen["half"] == "torch.float16"
    assert seen["bfloat16"] == "\"_thnn_fused_lstm_cell_cuda\" not implemented for 'BFloat16'"


def sparse_on_cuda_and_on_the_cpu() -> dict:
    import torch  # a local name, as in the tests above

    seen = {}
    torch.manual_seed(0)
    dense = torch.randn(6, 5, dtype=torch.float64) * (torch.rand(6, 5) < 0.4)
    right = torch.randn(5, 3, dtype=torch.float64)
    for device in ("cpu", "cuda:1"):
        torch.cuda.set_device(0)  # cuda:1's tensors are not on the current device
        a = dense.to(device).to_sparse().requires_grad_()
        b = right.to(device, copy=True).requires_grad_()
        product = torch.sparse.mm(a, b)
        (product * product).sum().backward()
        doubled = (a.detach() + a.detach()).coalesce()
        in_place = a.detach().clone()
        in_place.mul_(3.0)
        built = torch.sparse_coo_tensor(torch.tensor([[0, 2], [1, 0]], device=device),
                                        torch.tensor([5.0, 7.0], device=device), (3, 2))
        seen[device] = {
            "devices": sorted({str(t.device) for t in (a, product, a.grad, doubled, built)}),
            "layouts": [str(t.layout) for t in (a, product, a.grad, doubled)],
            "product": product.detach().cpu(),
            "a.grad": a.grad.to_dense().cpu(),
            "b.grad": b.grad.cpu(),
            "doubled": doubled.to_dense().cpu(),
            "indices": doubled.indices().cpu(),
            "coalesced": doubled.is_coalesced(),
            "in_place": in_place.to_dense().cpu(),
            "built": built.to_dense().cpu(),
        }
    seen["memory"] = torch.cuda.memory_allocated(1)
    # Sparse gradients: an embedding and a bag trained by optimizers that take them.
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        embedding = torch.nn.Embedding(10, 4, sparse=True).to(device)
        bag = torch.nn.EmbeddingBag(10, 4, sparse=True, mode="sum").to(device)
        sgd = torch.optim.SGD(embedding.parameters(), lr=0.1)
        adagrad = torch.optim.Adagrad(bag.parameters())
        tokens = torch.tensor([[1, 2, 4], [4, 3, 9]], device=device)
        for _ in range(2):
            (embedding(tokens).pow(2).sum() + bag(tokens).sum()).backward()
            sgd.step()
            adagrad.step()
        seen[f"embeddings on {device}"] = {
            "weights": [embedding.weight.detach().cpu(), bag.weight.detach().cpu()],
            "grad": (str(embedding.weight.grad.layout), str(embedding.weight.grad.device)),
        }
    torch.cuda.set_device(0)
    x = torch.eye(3, device="cuda")
    refusals = {
        "csr": lambda: x.to_sparse_csr() @ x,
        "cuda_only_op": lambda: torch.ops.aten._cudnn_init_dropout_state(
            0.5, True, 0, dtype=torch.uint8, device="cuda"),
    }

    class RefusedInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t * 2

        @staticmethod
        def backward(ctx, grad):
            torch.ops.aten._cudnn_init_dropout_state(0.5, True, 0, dtype=torch.uint8,
                                                     device="cuda")
            return grad

    refusals["backward"] = lambda: RefusedInBackward.apply(x.requires_grad_()).sum().backward()
    for name, attempt in refusals.items():
        try:
            attempt()
            seen[name] = "ran"
        except sgpu.NotSimulatedError as error:
            seen[name] = f"NotSimulatedError: {error}"
    return seen


def test_sparse_tensors_on_a_simulated_gpu_compute_as_on_the_cpu_and_refusals_are_not_simulated():
    seen = distributed(gpus=2, tracking=False)(sparse_on_cuda_and_on_the_cpu).distributed()[0]
    cpu, gpu = seen["cpu"], seen["cuda:1"]
    assert gpu["devices"] == ["cuda:1"], gpu["devices"]
    assert gpu["layouts"] == ["torch.sparse_coo", "torch.strided", "torch.sparse_coo",
                              "torch.sparse_coo"]
    assert gpu["layouts"] == cpu["layouts"]
    for key in ("product", "a.grad", "b.grad", "doubled", "indices", "in_place", "built"):
        assert torch.equal(gpu[key], cpu[key]), key
    assert gpu["coalesced"] and cpu["coalesced"]
    assert seen["memory"] > 0  # the sparse tensors' parts are cuda:1's memory
    on_cpu, on_gpu = seen["embeddings on cpu"], seen["embeddings on cuda"]
    assert on_gpu["grad"] == ("torch.sparse_coo", "cuda:0")
    assert all(torch.equal(g, c) for g, c in zip(on_gpu["weights"], on_cpu["weights"]))
    assert seen["csr"].startswith("NotSimulatedError: sgpu: aten::") and \
        "on a sparsecsr cuda tensor: CUDA on sim serves strided (dense) and sparse COO " \
        "tensors only" in seen["csr"], seen["csr"]
    assert seen["cuda_only_op"].startswith(
        "NotSimulatedError: sgpu: aten::_cudnn_init_dropout_state has a CUDA kernel and no CPU")
    assert seen["backward"] == seen["cuda_only_op"]


def late_to_a_groups_first_collective() -> list:
    import datetime
    import time

    import torch.distributed as dist

    torch.cuda.set_device(sgpu.get_local_rank())
    dist.init_process_group("nccl")
    group = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=1))
    if dist.get_rank() == 1:
        time.sleep(3)
    t = torch.ones(2, device="cuda")
    dist.all_reduce(t, group=group)
    dist.destroy_process_group()
    return t.tolist()


def test_a_groups_timeout_leaves_its_first_collectives_setup_unbounded_as_nccl_does():
    # NCCL sets a group's communicator up at its first collective, before the work its
    # timeout bounds exists: rank 0 waits in NCCL's bootstrap, a later rank on the store.
    assert distributed(gpus=2, tracking=False)(late_to_a_groups_first_collective).distributed() \
        == [[2.0, 2.0]] * 2


def late_to_a_groups_second_collective() -> None:
    import datetime
    import time

    import torch.distributed as dist

    torch.cuda.set_device(sgpu.get_local_rank())
    dist.init_process_group("nccl")
    group = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=1))
    dist.all_reduce(torch.ones(2, device="cuda"), group=group)
    if dist.get_rank() == 1:
        time.sleep(3)
    else:
        dist.all_reduce(torch.ones(2, device="cuda"), group=group)


def test_a_collective_past_its_groups_timeout_fails_in_the_watchdogs_words():
    with pytest.raises(Exception) as caught:
        distributed(gpus=2, tracking=False)(late_to_a_groups_second_collective).distributed()
    said = re.search(r"Watchdog caught collective operation timeout: WorkNCCL\(OpType=ALLREDUCE\) "
                     r"ran for (\d+) milliseconds before timing out", str(caught.value))
    assert said, str(caught.value)
    assert int(said.group(1)) >= 1000, said.group(0)  # the work's time, as the watchdog counts it


def forked_from() -> list:
    """The command line of the process a rank was forked from (its fork server)."""
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        return f.read().decode().split("\0")


def test_sim_cuda_off_keeps_cpu_devices(monkeypatch):
    @distributed(gpus=1, tracking=False)
    def devices():
        return torch.cuda.is_available(), str(sgpu.device()), "--cuda-on-sim" in forked_from()

    # Ranks that serve cuda fork from a server that prepared it; the others from their own.
    assert devices.distributed() == [(True, "cuda:0", True)]
    monkeypatch.setenv("SGPU_SIM_CUDA", "off")
    assert devices.distributed() == [(False, "cpu", False)]
    monkeypatch.setenv("SGPU_SIM_CUDA", "maybe")
    with pytest.raises(sgpu.ConfigError, match="SGPU_SIM_CUDA=maybe is neither on nor off"):
        devices.distributed()
    monkeypatch.delenv("SGPU_SIM_CUDA")

    @distributed(gpus=1, tracking=False, sim_cuda=False)
    def off():
        return torch.cuda.is_available(), str(sgpu.device())

    assert off.distributed() == [(False, "cpu")]


@needs_cli
def test_a_program_that_never_imports_sgpu_gets_the_simulated_gpus(tmp_path):
    code, out, err = sgpu_run(tmp_path, """
        import os
        import torch
        import torch.distributed as dist

        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dist.init_process_group("nccl")
        t = torch.ones(2, device="cuda") * (dist.get_rank() + 1)
        dist.all_reduce(t)
        print(f"rank {dist.get_rank()} on {t.device} of {torch.cuda.device_count()}: {t.tolist()}")
        dist.destroy_process_group()
    """, "--gpus", "2", timeout=300, env={"SGPU_TRACKING": "off"})
    assert code == 0, err
    assert "rank 0 on cuda:0 of 8: [3.0, 3.0]" in out
    assert "rank 1 on cuda:1 of 8: [3.0, 3.0]" in out


def test_any_sequence_of_operators_on_cuda_is_bit_identical_to_the_cpu():
    """A law, checked by hypothesis inside a rank (where cuda is the simulated GPU): any
    program of tensor operators gives on cuda:0 exactly what it gives on the CPU."""

    @distributed(gpus=1, tracking=False)
    def law(examples):
        from hypothesis import HealthCheck, given, settings
        from hypothesis import strategies as st

        operators = [
            lambda a, b: a + b, lambda a, b: a * b - b, lambda a, b: a / (b.abs() + 1),
            lambda a, b: torch.tanh(a), lambda a, b: torch.relu(a) + torch.sigmoid(b),
            lambda a, b: a @ b.t() @ b, lambda a, b: torch.softmax(a, dim=1),
            lambda a, b: torch.cumsum(a, dim=0), lambda a, b: a.t().contiguous().t() * 2,
            lambda a, b: torch.sort(a, dim=1).values, lambda a, b: torch.where(a > b, a, b),
            lambda a, b: a.masked_fill(a < 0, 0.5), lambda a, b: a.clone().add_(b).mul_(0.5),
            lambda a, b: torch.nn.functional.layer_norm(a, a.shape[1:]),
            lambda a, b: torch.gather(a, 1, torch.argsort(b, dim=1)),
            lambda a, b: a.sum(dim=0, keepdim=True).expand_as(a) - a,
            lambda a, b: torch.cat([a[:2], b[2:]]), lambda a, b: a.pow(2).sqrt(),
            lambda a, b: a.to(torch.float16).to(torch.float32), lambda a, b: a.half().float() * b,
        ]

        @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(st.lists(st.integers(0, len(operators) - 1), min_size=1, max_size=10),
               st.integers(0, 2**31 - 1), st.sampled_from([torch.float32, torch.float64]))
        def same(program, seed, dtype):
            generator = torch.Generator().manual_seed(seed)
            x = torch.randn(4, 5, generator=generator, dtype=dtype)
            y = torch.randn(4, 5, generator=generator, dtype=dtype)

            def run(device):
                a, b = x.to(device), y.to(device)
                for index in program:
                    a = operators[index](a, b).to(dtype)
                return a.cpu()

            cpu, cuda = run("cpu"), run("cuda")
            assert torch.equal(cpu.isnan(), cuda.isnan()), program
            assert torch.equal(cpu.nan_to_num(), cuda.nan_to_num()), program

        same()
        return examples

    assert law.distributed(300) == [300]


def test_half_precision_matmuls_on_cuda_are_the_cpus():
    """oneDNN's bfloat16 and float16 matmuls allocate through libtorch's raw_allocate(),
    which the simulated GPU's allocator serves as it serves tensors."""

    @distributed(gpus=1, tracking=False)
    def layers():
        same = []
        for dtype in (torch.bfloat16, torch.float16):
            model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                        torch.nn.Linear(256, 64)).to(dtype)
            x = torch.randn(32, 64, dtype=dtype)
            cpu = model(x)
            cpu.float().sum().backward()
            cpu_grad = model[0].weight.grad.clone()
            model.zero_grad()
            model.cuda()
            cuda = model(x.cuda())
            cuda.float().sum().backward()
            same.append(torch.equal(cuda.cpu(), cpu) and
                        torch.equal(model[0].weight.grad.cpu(), cpu_grad))
        return same

    assert layers.distributed() == [[True, True]]


def test_the_generator_is_cudas_seed_and_offset_and_dtensors_draw_per_shard():
    """NOTE [A simulated GPU's generator]: torch.cuda's RNG state is Philox's 16 bytes, a
    seed and an offset that each random operator moves on, and that DTensor sets to draw
    each shard (torchtitan initialises a sharded model so)."""

    @distributed(gpus=2, tracking=False)
    def draws():
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        torch.cuda.set_device(sgpu.get_local_rank())
        dist.init_process_group("nccl")
        generator = torch.cuda.default_generators[sgpu.get_local_rank()]
        torch.cuda.manual_seed(3)
        state = torch.cuda.get_rng_state()
        offset = generator.get_offset()
        torch.randn(5, device="cuda")
        moved = generator.get_offset() - offset
        try:
            torch.cuda.set_rng_state(torch.get_rng_state())  # a CPU generator's state
            refused = ""
        except RuntimeError as error:
            refused = str(error)
        mesh = init_device_mesh("cuda", (2,))
        shards = []
        for _ in range(2):
            torch.manual_seed(11)
            weight = distribute_tensor(torch.zeros(8, 4, device="cuda"), mesh, [Shard(0)])
            torch.nn.init.normal_(weight)
            shards.append(weight.to_local().cpu())
        every = [torch.zeros(4, 4) for _ in range(2)]
        dist.all_gather_object(every, shards[0])
        return (state.numel(), state.dtype == torch.uint8, moved, refused,
                torch.equal(shards[0], shards[1]), torch.equal(every[0], every[1]))

    for size, is_bytes, moved, refused, reproducible, same_on_both in draws.distributed():
        assert (size, is_bytes) == (16, True)
        assert moved > 0
        assert "RNG state is wrong size" in refused
        assert reproducible and not same_on_both  # each shard its own stream, seeded alike


def test_seeds_memory_fractions_and_forked_children_behave_as_on_a_node():
    @distributed(gpus=1, sim_node="1xH100:64MiB", tracking=False)
    def node_rules():
        import multiprocessing

        torch.manual_seed(7)
        first = torch.randn(3, device="cuda").tolist()
        torch.cuda.manual_seed(7)
        second = torch.randn(3, device="cuda").tolist()
        state = torch.cuda.get_rng_state()
        third = torch.randn(3, device="cuda").tolist()
        torch.cuda.set_rng_state(state)
        again = torch.randn(3, device="cuda").tolist()
        torch.cuda.set_per_process_memory_fraction(0.5)
        try:
            torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
            limited = ""
        except torch.OutOfMemoryError as error:
            limited = str(error)

        def child(queue):
            try:
                torch.cuda.current_device()
                queue.put("")
            except RuntimeError as error:
                queue.put(str(error))

        queue = multiprocessing.get_context("fork").Queue()
        process = multiprocessing.get_context("fork").Process(target=child, args=(queue,))
        process.start()
        forked = queue.get(timeout=60)
        process.join()
        return first == second, third == again, limited, forked, os.environ["LOCAL_SIZE"]

    same_seed, same_state, limited, forked, local_size = node_rules.distributed()[0]
    assert same_seed and same_state
    assert "Tried to allocate 40.00 MiB. GPU 0 has a total capacity of 32.00 MiB" in limited
    assert "Cannot re-initialize CUDA in forked subprocess" in forked
    assert local_size == "1"


@pytest.mark.parametrize("transport, compute", [("shm", "values"), ("gloo", "values"),
                                                ("shm", "shapes")])
def test_a_rank_that_skips_an_nccl_collective_is_named_at_it(transport, compute):
    """In shape-only compute too: the ranks meet at each collective though it moves no bytes
    (rank 2's #3 is a broadcast where the others all-reduce)."""

    @distributed(gpus=3, tracking=False, timeout=120, hang_timeout=1.5, sim_transport=transport,
                 sim_compute=compute)
    def skips():
        import torch.distributed as dist

        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
        t = torch.ones(1024, device="cuda")
        for i in range(1, 5):
            if dist.get_rank() == 2 and i == 3:
                continue
            if i % 2:
                dist.all_reduce(t)
            else:
                dist.broadcast(t, src=0)
        return dist.get_rank()

    with pytest.raises(Exception) as caught:
        skips.distributed()
    error = distributed_error(caught.value)
    assert isinstance(error, sgpu.DistributedError), repr(caught.value)
    assert error.collectives.culprits == (2,), str(error)
    assert "collective #3" in error.collectives.verdict, error.collectives.verdict


def test_two_ranks_on_one_gpu_fail_as_nccl_does():
    @distributed(gpus=2, tracking=False)
    def same_gpu():
        import torch.distributed as dist

        dist.init_process_group("nccl")
        t = torch.ones(4, device="cuda:0")  # every rank on GPU 0: NCCL refuses
        dist.all_reduce(t)
        return t.tolist()

    with pytest.raises(torch.distributed.DistBackendError) as caught:
        same_gpu.distributed()
    # Both ranks fail alike, each naming itself first; either may be the call's root cause.
    found = re.search(r"Duplicate GPU detected : rank (\d) and rank (\d) both on CUDA device 0",
                      str(caught.value))
    assert found and {found[1], found[2]} == {"0", "1"}, str(caught.value)


def test_an_nccl_group_on_sim_warns_no_more_than_on_a_node(capfd):
    @distributed(gpus=2, tracking=False)
    def reduce():
        import torch.distributed as dist

        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
        total = torch.ones(1, device="cuda")
        dist.all_reduce(total)
        dist.destroy_process_group()
        return total.item()

    assert reduce.distributed() == [2.0, 2.0]
    # c10d finds the group's default backend, as a node's "nccl" group has NCCL's.
    assert "No backend of type" not in capfd.readouterr().err


def returns_what_it_trained() -> dict:
    torch.cuda.set_device(sgpu.get_local_rank())
    weights = torch.full((2, 3), float(sgpu.get_global_rank()), device="cuda")
    return {"weights": weights, "device": str(weights.device)}


def test_tensors_a_rank_returns_from_its_gpu_reach_the_caller():
    # The caller here sees no GPU: the tensors come to its CPU, and the call's run ends
    # FINISHED, as the call did.
    import mlflow

    got = distributed(gpus=2)(returns_what_it_trained).distributed()
    assert [row["device"] for row in got] == ["cuda:0", "cuda:1"]
    for rank, row in enumerate(got):
        assert row["weights"].device.type == "cpu"
        assert torch.equal(row["weights"], torch.full((2, 3), float(rank)))
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert [run.info.status for run in runs] == ["FINISHED"]


def what_nccl_refuses() -> dict:
    import torch.distributed as dist

    torch.cuda.set_device(sgpu.get_local_rank())
    dist.init_process_group("nccl")
    seen = {}
    cases = {
        "band": lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32, device="cuda"),
                                        op=dist.ReduceOp.BAND),
        "bor": lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32, device="cuda"),
                                       op=dist.ReduceOp.BOR),
        "int16": lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16, device="cuda")),
        "strided": lambda: dist.all_reduce(torch.ones(4, 4, device="cuda").t()),
        "broadcast_int16": lambda: dist.broadcast(torch.ones(2, dtype=torch.int16,
                                                             device="cuda"), 0),
    }
    for name, run in cases.items():
        try:
            run()
            seen[name] = "ran"
        except Exception as error:  # noqa: BLE001 - what the user sees
            seen[name] = f"{type(error).__name__}: {error}"
    rank, world = dist.get_rank(), dist.get_world_size()
    # What NCCL runs that Gloo and shared memory have not: PREMUL_SUM and float8 sums.
    premul = torch.full((4,), float(rank + 1), device="cuda")
    dist.all_reduce(premul, op=dist._make_nccl_premul_sum(0.5))
    seen["premul_sum"] = premul.tolist()
    scattered = torch.zeros(2, device="cuda")
    dist.reduce_scatter_tensor(scattered, torch.full((2 * world,), float(rank + 1), device="cuda"),
                               op=dist._make_nccl_premul_sum(torch.tensor(0.25, device="cuda")))
    seen["premul_reduce_scatter"] = scattered.tolist()
    eight = torch.full((3,), 1.5, device="cuda").to(torch.float8_e4m3fn)
    dist.all_reduce(eight)
    seen["float8"] = [eight.dtype == torch.float8_e4m3fn, eight.float().tolist()]
    dist.destroy_process_group()
    return seen


def test_an_nccl_group_refuses_what_nccl_refuses_and_runs_what_it_runs():
    got = distributed(gpus=2, tracking=False)(what_nccl_refuses).distributed()
    assert got[0] == got[1]
    seen = got[0]
    assert seen["band"] == "ValueError: Cannot use ReduceOp.BAND with NCCL"
    assert seen["bor"] == "ValueError: Cannot use ReduceOp.BOR with NCCL"
    assert seen["int16"] == seen["broadcast_int16"] == \
        "TypeError: Input tensor data type is not supported for NCCL process group: Short"
    assert seen["strided"] == "ValueError: Tensors must be contiguous"
    assert seen["premul_sum"] == [1.5] * 4  # (1 + 2) * 0.5
    assert seen["premul_reduce_scatter"] == [0.75] * 2  # (1 + 2) * 0.25
    assert seen["float8"] == [True, [3.0] * 3]


def sgpu_group_keeps_what_it_takes() -> list:
    import torch.distributed as dist

    torch.cuda.set_device(sgpu.get_local_rank())
    dist.init_process_group("sgpu")
    short = torch.full((2,), 3, dtype=torch.int16, device="cuda")
    dist.all_reduce(short, op=dist.ReduceOp.BAND)
    strided = torch.ones(4, 4, device="cuda").t()
    dist.all_reduce(strided)
    dist.destroy_process_group()
    return [short.tolist(), strided[0].tolist()]


def test_the_sgpu_group_keeps_taking_what_nccl_refuses():
    got = distributed(gpus=2, tracking=False)(sgpu_group_keeps_what_it_takes).distributed()
    assert got == [[[3, 3], [2.0] * 4]] * 2


def copies_between_gpus() -> dict:
    torch.cuda.set_device(0)
    src = torch.arange(4.0, device="cuda:1")
    dst = torch.zeros(4, device="cuda:0")
    dst.copy_(src)
    sliced = torch.zeros(4, device="cuda:0")
    sliced[:] = src
    seen = {"copy_": (str(dst.device), dst.tolist()), "slice": (str(sliced.device), sliced.tolist())}
    try:
        torch.arange(4.0, device="cuda:0")[torch.tensor([1, 2], device="cuda:1")]
        seen["index"] = "ran"
    except Exception as error:  # noqa: BLE001 - what the user sees
        seen["index"] = f"{type(error).__name__}: {error}"
    return seen


def test_a_copy_between_two_gpus_works_as_a_peer_copy_does():
    got = distributed(gpus=1, sim_node="2xH100", tracking=False)(copies_between_gpus).distributed()[0]
    assert got["copy_"] == ("cuda:0", [0.0, 1.0, 2.0, 3.0])
    assert got["slice"] == ("cuda:0", [0.0, 1.0, 2.0, 3.0])
    assert got["index"] == ("IndexError: indices should be either on cpu or on the same device as "
                            "the indexed tensor (cuda:0)")


def pins() -> list:
    pinned = torch.ones(3).pin_memory()
    made = torch.empty(3, pin_memory=True)
    plain = torch.ones(3)
    return [pinned.is_pinned(), made.is_pinned(), plain.is_pinned()]


def test_pinned_memory_says_it_is_pinned_as_on_a_gpu():
    assert distributed(gpus=1, tracking=False)(pins).distributed() == [[True, True, False]]


def trains_with_ddp(option: str) -> float:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    local = sgpu.get_local_rank()
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"used": torch.nn.Linear(4, 4), "unused": torch.nn.Linear(4, 4)})
    model = model.cuda()

    class Uses(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner["used"](x)

    ddp = DistributedDataParallel(Uses(model), device_ids=[local], **{option: True})
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(3):
        optimizer.zero_grad()
        ddp(torch.full((2, 4), float(step + local), device="cuda")).sum().backward()
        optimizer.step()
    weight = model["used"].weight.sum().item()
    dist.destroy_process_group()
    return weight


@pytest.mark.parametrize("option", ["find_unused_parameters", "static_graph"])
def test_ddp_with_unused_parameters_or_a_static_graph_trains(option):
    got = distributed(gpus=2, tracking=False)(trains_with_ddp).distributed(option)
    assert got[0] == got[1]


def profiles_a_matmul() -> list:
    from torch.profiler import ProfilerActivity, profile

    x = torch.ones(64, 64, device="cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiled:
        x @ x
    return sorted({event.key for event in profiled.key_averages()} & {"aten::matmul", "aten::mm"})


def test_the_profiler_with_cuda_activity_records_and_says_nothing_of_cupti(capfd):
    assert distributed(gpus=1, tracking=False)(profiles_a_matmul).distributed() == [
        ["aten::matmul", "aten::mm"]]
    said = capfd.readouterr().err
    assert "CUPTI" not in said and "gpuGetDeviceCount" not in said, said
