"""examples/models/llama.py: Llama 3's 8B, 70B and 405B built from their configurations on
the meta device (no weights, no memory) with the published parameter counts, and its debug
size trained under FSDP2 on 4 simulated H100s, with activation checkpointing giving the same
steps bit for bit as without, and both the steps of one process, as are its steps in 2D
parallelism (FSDP2 x tensor parallel)."""

import os
import pathlib
import sys

import pytest
import torch

from sgpu import distributed
from sgpu_cli import needs_cli, sgpu_run

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "models"))
import llama  # noqa: E402


@pytest.mark.parametrize("size, parameters, hidden", [("8B", 8_030_261_248, 14336),
                                                      ("70B", 70_553_706_496, 28672),
                                                      ("405B", 405_853_388_800, 53248)])
def test_production_shapes_build_on_the_meta_device_with_their_published_sizes(size, parameters,
                                                                               hidden):
    config = llama.CONFIGS[size]
    assert config.ffn_hidden == hidden
    with torch.device("meta"):
        model = llama.Transformer(config)
    assert model.parameter_count() == parameters
    assert all(p.device.type == "meta" for p in model.parameters())


def test_mfu_counts_as_torchtitan_does_on_its_published_8b_run():
    # torchtitan's 8B FSDP run on 8 H100s: 5,762 tokens/s per GPU, which its benchmark
    # page gives as 33% MFU (of 989 TFLOPS): 6 * 7.50e9 non-embedding parameters and
    # 12 * 32 * 4096 * 8192 for attention, 57.9 GFLOP a token.
    import llama_step
    config = llama.CONFIGS["8B"]
    with torch.device("meta"):
        model = llama.Transformer(config)
    per_token = llama_step.flops_per_token(model, config, 8192)
    assert 5762 * per_token / 989.4e12 == pytest.approx(0.3373, abs=5e-4)
    # A sequence longer than the model's window counts the window's attention only.
    assert llama_step.flops_per_token(model, config, 16384) == per_token


def batches(steps: int, config):
    """One batch, `steps` times: the loss must fall as the model learns it."""
    generator = torch.Generator().manual_seed(7)
    return [torch.randint(0, config.vocab_size, (8, 17), generator=generator)] * steps


def train(checkpoint_activations: bool | str) -> list:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    config = llama.CONFIGS["debug"]
    torch.manual_seed(0)
    model = llama.Transformer(config).cuda()
    llama.shard(model, init_device_mesh("cuda", (world,)), checkpoint_activations)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for tokens in batches(3, config):
        mine = tokens[rank::world].cuda()
        logits = model(mine[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), mine[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world)
    dist.destroy_process_group()
    wrapped = all("CheckpointWrapper" in type(layer).__name__ for layer in model.layers)
    return losses, wrapped


def test_the_debug_size_trains_under_fsdp2_with_and_without_activation_checkpointing():
    call = distributed(gpus=4, gpu_type="H100", tracking=False)(train)
    plain, wrapped = zip(*call.distributed(False))
    checkpointed, wrapped_now = zip(*call.distributed(True))
    selective, wrapped_selectively = zip(*call.distributed("selective"))
    assert not any(wrapped) and all(wrapped_now) and all(wrapped_selectively)
    assert checkpointed == plain  # recomputed activations: the same steps, bit for bit
    assert selective == plain
    assert all(losses == plain[0] for losses in plain)
    alone = alone_losses()
    assert plain[0] == pytest.approx(alone, rel=1e-4)
    assert plain[0][-1] < plain[0][0]


def alone_losses() -> list:
    """The same three steps in one process, on the CPU."""
    config = llama.CONFIGS["debug"]
    torch.manual_seed(0)
    model = llama.Transformer(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    alone = []
    for tokens in batches(3, config):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        alone.append(loss.item())
    return alone


def train_2d(tp: int) -> list:
    """The same steps in torchtitan's 2D parallelism: tensor parallel over `tp` ranks, FSDP2
    across the groups, each group its share of the batch, the loss on logits sharded over
    the vocabulary. Each rank's losses, its group's mean over the data-parallel ranks."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    mesh = init_device_mesh("cuda", (dist.get_world_size() // tp, tp),
                            mesh_dim_names=("dp", "tp"))
    config = llama.CONFIGS["debug"]
    torch.manual_seed(0)
    model = llama.Transformer(config).cuda()
    llama.shard(model, mesh, "selective")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    replica, replicas = mesh["dp"].get_local_rank(), mesh["dp"].size()
    losses = []
    for tokens in batches(3, config):
        mine = tokens[replica::replicas].cuda()
        logits = model(mine[:, :-1])
        assert isinstance(logits, DTensor) and logits.to_local().shape[-1] == config.vocab_size // tp
        with llama.loss_context(logits):
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), mine[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
        optimizer.step()
        total = loss.full_tensor().detach().clone()
        dist.all_reduce(total, group=mesh["dp"].get_group())
        losses.append(total.item() / replicas)
    dist.destroy_process_group()
    return losses


def test_the_debug_size_trains_in_2d_parallelism_as_one_process_does():
    losses = distributed(gpus=4, gpu_type="H100", tracking=False)(train_2d).distributed(2)
    assert all(mine == losses[0] for mine in losses)
    assert losses[0] == pytest.approx(alone_losses(), rel=1e-4)
    assert losses[0][-1] < losses[0][0]


def built_step(size: str, mixed_precision: bool) -> float:
    """One step of a model made as torchtitan makes it (llama.build: on the meta device,
    sharded, then each rank's shards allocated on its GPU and drawn by DTensor's random
    operators), 1 x 2048 tokens, AdamW: the loss."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    config = llama.CONFIGS[size]
    model = llama.build(config, init_device_mesh("cuda", (dist.get_world_size(),)),
                        mixed_precision=mixed_precision)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = llama.train_step(model, optimizer, 1, 2048)
    return 0.0 if isinstance(loss, torch._subclasses.FakeTensor) else loss.item()


def test_a_model_built_sharded_steps_computing_values():
    losses = distributed(gpus=2, gpu_type="H100", tracking=False)(built_step).distributed(
        "debug", True)
    assert losses[0] == losses[1] and 0 < losses[0] < 10  # one loss: every rank's batch


def test_llama_70b_does_not_fit_eight_h100s_and_says_where_as_cuda_does():
    """70B under FSDP2 with AdamW keeps 16 bytes of state a parameter: 141 GB a GPU over 8
    H100s of 79 GiB. The step fails with CUDA's out-of-memory text, naming the rank and
    the operator."""
    import sgpu
    from conftest import distributed_error

    call = distributed(gpus=8, gpu_type="H100", tracking=False, sim_compute="shapes",
                       console_ranks=[])(built_step)
    with pytest.raises(Exception) as caught:
        call.distributed("70B", True)
    error = distributed_error(caught.value)
    assert isinstance(error, sgpu.DistributedError)
    root = error.root_cause
    assert root.exception_type.endswith("OutOfMemoryError"), root
    assert "CUDA out of memory. Tried to allocate" in root.message
    assert "GPU %d has a total capacity of 79.11 GiB" % root.rank in root.message
    assert "(shape-only compute, at aten." in root.message
    assert f"rank {root.rank}" in str(error)


@needs_cli
@pytest.mark.parametrize("checkpointing", [[], ["--checkpointing"], ["--ac", "selective"],
                                           ["--ac", "full", "--tp", "2"]])
def test_the_example_script_steps_under_sgpu_run_in_shapes(tmp_path, checkpointing):
    """examples/models/llama_step.py, written for torchrun, under `sgpu run` on simulated
    H100s in shape-only compute, with and without activation checkpointing (whole blocks, or
    torchtitan's per-operator selective policy), and in 2D parallelism."""
    script = pathlib.Path(__file__).resolve().parents[2] / "examples" / "models" / "llama_step.py"
    argv = [str(script), "--size", "debug", "--seq", "64", *checkpointing]
    code, out, err = sgpu_run(tmp_path, f"""
        import runpy, sys
        sys.argv = {argv!r}
        runpy.run_path(sys.argv[0], run_name="__main__")
    """, "--gpus", "2", "--sim-compute", "shapes", timeout=300, env={"SGPU_TRACKING": "off"})
    assert code == 0, err
    layout = " (FSDP 1 x TP 2)" if "--tp" in checkpointing else ""
    assert f"debug step on 2 GPUs{layout}: peak allocated" in out and "peak reserved" in out
    assert "all_gather_into_tensor" in err and "reduce_scatter_tensor" in err, err
    assert "sgpu: compute (the most of any rank): " in err, err
