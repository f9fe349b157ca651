"""DCP checkpoints through sgpu.checkpoint's volume storage: a job whose rank dies half-way
through a save resumes from the newest complete checkpoint and ends bit-identical to a job
never interrupted; a 4-rank checkpoint loads into 2 ranks and into one process (through
torch's own FileSystemReader too); latest() and prune() keep to complete checkpoints."""

import os
import pathlib

import pytest
import torch

import sgpu
from conftest import distributed_error
from sgpu import distributed
from sgpu.checkpoint import VolumeReader, VolumeWriter, complete, latest, prune

RANKS = 4
STEPS = 6


def batch(step: int):
    generator = torch.Generator().manual_seed(100 + step)
    return torch.randn(16, 8, generator=generator), torch.randn(16, 1, generator=generator)


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def train(root: str, resume: bool = False, die_in_save: int = 0) -> dict:
    """FSDP2 and AdamW on a cuda mesh, as on a GPU node: STEPS steps from the start (or from
    latest(root)), a checkpoint every 2 steps; rank 1 dies in save number `die_in_save`,
    its shards on the volume and the checkpoint not yet published. Rank 0 returns the full
    parameters at the end."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_state_dict, set_state_dict)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cuda", (world,))
    model = make_model().cuda()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = 0
    if resume:
        found = latest(root)
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optimizer_state}
        dcp.load(state, storage_reader=VolumeReader(found))
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        step = int(os.path.basename(found).split("-")[1])
    saves = 0
    while step < STEPS:
        x, y = batch(step)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[rank::world].cuda()), y[rank::world].cuda())
        loss.backward()
        optimizer.step()
        step += 1
        if step % 2 == 0 and step < STEPS:
            saves += 1

            def point(name, dies=saves == die_in_save and rank == 1):
                if dies and name == "copied":
                    os._exit(17)

            model_state, optimizer_state = get_state_dict(model, optimizer)
            dcp.save({"model": model_state, "optim": optimizer_state},
                     storage_writer=VolumeWriter(f"{root}/step-{step:06d}", on_write_point=point))
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))
    dist.destroy_process_group()
    return full if rank == 0 else None


def load_on_ranks(path: str) -> dict:
    """The checkpoint at `path` loaded into FSDP2 over this call's ranks: rank 0 returns the
    full parameters."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         set_model_state_dict)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    model = make_model().cuda()
    fully_shard(model, mesh=init_device_mesh("cuda", (dist.get_world_size(),)))
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, storage_reader=VolumeReader(path))
    set_model_state_dict(model, state["model"])
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))
    rank = dist.get_rank()
    dist.destroy_process_group()
    return full if rank == 0 else None


def assert_identical(got: dict, want: dict):
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), f"{name} differs"


def test_a_job_killed_mid_save_resumes_from_the_last_complete_checkpoint_bit_identically(tmp_path):
    reference = distributed(gpus=RANKS, tracking=False)(train).distributed(str(tmp_path / "ref"))[0]

    root = tmp_path / "volume"
    with pytest.raises(sgpu.Error) as died:
        distributed(gpus=RANKS, tracking=False)(train).distributed(str(root), die_in_save=2)
    assert distributed_error(died.value).root_cause.rank == 1
    # The second save's shards all landed (rank 1 died after copying its own), but no
    # .metadata: it is not a checkpoint, and latest() takes the one before.
    partial = root / "step-000004"
    assert {p.name for p in partial.iterdir()} >= {f"__{r}_0.distcp" for r in range(RANKS)}
    assert not complete(partial)
    assert latest(root) == str(root / "step-000002")
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        VolumeReader(partial)

    resumed = distributed(gpus=RANKS, tracking=False)(train).distributed(str(root), resume=True)[0]
    assert_identical(resumed, reference)
    assert latest(root) == str(root / "step-000004")  # saved again, whole this time

    # The 4-rank checkpoint, resharded: into 2 ranks, and into one process that has no
    # process group, through sgpu's reader and through torch's own.
    import torch.distributed.checkpoint as dcp

    for reader in (VolumeReader, dcp.FileSystemReader):
        model = make_model()
        state = {"model": model.state_dict()}
        dcp.load(state, storage_reader=reader(str(partial)))
        one_process = state["model"]
        assert not torch.equal(one_process["0.weight"], make_model().state_dict()["0.weight"])
    two_ranks = distributed(gpus=2, tracking=False)(load_on_ranks).distributed(str(partial))[0]
    assert_identical(two_ranks, one_process)


def test_a_save_leaves_no_stage_behind_and_stages_where_told(tmp_path):
    import torch.distributed.checkpoint as dcp

    stage = tmp_path / "stage"
    state = {"w": torch.arange(6.0)}
    points = []
    dcp.save(state, storage_writer=VolumeWriter(tmp_path / "c1", on_write_point=points.append))
    assert points == ["staged", "copied", "published"]
    dcp.save(state, storage_writer=VolumeWriter(tmp_path / "c2", stage_dir=stage))
    assert sorted(p.name for p in stage.iterdir()) == ["__0_0.distcp"]  # kept: it was given
    loaded = {"w": torch.zeros(6)}
    dcp.load(loaded, storage_reader=VolumeReader(tmp_path / "c1"))
    assert torch.equal(loaded["w"], state["w"])
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException, match="Checkpoint already exists"):
        dcp.save(state, storage_writer=VolumeWriter(tmp_path / "c1"))


def make_checkpoint(root: pathlib.Path, name: str, when: int, whole: bool = True):
    folder = root / name
    folder.mkdir()
    (folder / "__0_0.distcp").write_bytes(b"x")
    target = folder / ".metadata" if whole else folder
    if whole:
        target.write_bytes(b"m")
    os.utime(target, ns=(when, when))
    return str(folder)


def test_latest_is_the_newest_complete_checkpoint_and_prune_keeps_the_newest(tmp_path):
    assert latest(tmp_path / "nothing") is None
    assert latest(tmp_path) is None
    a = make_checkpoint(tmp_path, "step-000010", 10 ** 18)
    b = make_checkpoint(tmp_path, "step-000020", 2 * 10 ** 18)
    dead = make_checkpoint(tmp_path, "step-000030", 3 * 10 ** 18, whole=False)
    c = make_checkpoint(tmp_path, "step-000005", 4 * 10 ** 18)  # published last: newest
    assert latest(tmp_path) == c
    (tmp_path / "a-file").write_text("not a checkpoint")
    # Two complete kept; the dead save, older than the newest complete one, goes.
    assert prune(tmp_path, keep=2) == sorted([a, dead])
    assert latest(tmp_path) == c and complete(b)
    running = make_checkpoint(tmp_path, "step-000040", 5 * 10 ** 18, whole=False)
    assert prune(tmp_path, keep=1) == [b]
    assert os.path.isdir(running)  # a save still being written, newer than every complete one
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="whole number of checkpoints"):
            prune(tmp_path, keep=bad)
        with pytest.raises(ValueError, match="whole number of checkpoints"):
            VolumeWriter(tmp_path / "x", keep_last=bad)


def test_keep_last_removes_older_checkpoints_once_a_save_is_published(tmp_path):
    import torch.distributed.checkpoint as dcp

    for step in range(4):
        dcp.save({"w": torch.full((2,), float(step))},
                 storage_writer=VolumeWriter(tmp_path / f"step-{step:06d}", keep_last=2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000002", "step-000003"]


def async_save_and_load(root: str, backend: str) -> list:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend)
    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    whole = torch.arange(8.0, device="cuda")
    state = {"w": distribute_tensor(whole, mesh, [Shard(0)])}
    try:
        pending = dcp.async_save(state, storage_writer=VolumeWriter(root))
    except AssertionError as refused:  # torch's own check, as on a GPU node
        dist.destroy_process_group()
        return ["refused", str(refused)]
    pending.result()
    dist.barrier()
    loaded = {"w": distribute_tensor(torch.zeros(8, device="cuda"), mesh, [Shard(0)])}
    dcp.load(loaded, storage_reader=VolumeReader(root))
    values = loaded["w"].full_tensor().tolist()
    dist.destroy_process_group()
    return ["saved", complete(root), values]


def test_async_save_works_where_the_group_has_a_cpu_backend_as_on_a_node(tmp_path):
    call = distributed(gpus=2, tracking=False)(async_save_and_load)
    for backend in ("cpu:gloo,cuda:nccl", "sgpu"):
        got = call.distributed(str(tmp_path / backend.replace(":", "-").replace(",", "_")), backend)
        assert got == [["saved", True, [float(i) for i in range(8)]]] * 2
    # "nccl" alone has no CPU backend on a node, and torch says what to do; so on sim.
    refused = call.distributed(str(tmp_path / "nccl"), "nccl")
    assert refused[0][0] == "refused" and "cpu:gloo,cuda:nccl" in refused[0][1]
