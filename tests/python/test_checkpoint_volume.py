"""DCP checkpoints through sgpu.checkpoint's volume storage: a job whose rank dies half-way
through a save resumes from the newest complete checkpoint and ends bit-identical to a job
never interrupted; a 4-rank checkpoint loads into 2 ranks and into one process (through
torch's own FileSystemReader too); latest() and prune() keep to complete checkpoints."""

import json
import os
import pathlib
import re

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
    """A folder as a save of sgpu's leaves it: its marker, a shard and, when whole, `.metadata`."""
    folder = root / name
    folder.mkdir()
    (folder / ".sgpu-checkpoint").write_text(
        json.dumps({"format": 1, "save": name, "state": "complete" if whole else "writing"}))
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


def save(path, value: float, **writer) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.full((4,), value)}, storage_writer=VolumeWriter(path, **writer))


def load(path) -> list:
    import torch.distributed.checkpoint as dcp

    state = {"w": torch.zeros(4)}
    dcp.load(state, storage_reader=VolumeReader(path))
    return state["w"].tolist()


def what_it_raised(run) -> str:
    """What `run()` raised, with the rank's own error DCP wraps in a CheckpointException (a
    BaseException)."""
    with pytest.raises(BaseException) as caught:
        run()
    failures = getattr(caught.value, "failures", {})
    return " ".join([str(caught.value)] + [f"{type(e).__name__}: {e}" for e in failures.values()])


def test_prune_removes_only_checkpoints_sgpu_wrote(tmp_path):
    import torch.distributed.checkpoint as dcp

    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "tensorboard" / "events.out").write_text("logs")
    (tmp_path / "hf_export").mkdir()
    (tmp_path / "hf_export" / "config.json").write_text("{}")
    dcp.save({"w": torch.ones(2)}, storage_writer=dcp.FileSystemWriter(tmp_path / "torch-ckpt"))
    for step in (1, 2):
        save(tmp_path / f"step-{step}", float(step), keep_last=2)
    everything = ["hf_export", "step-1", "step-2", "tensorboard", "torch-ckpt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == everything
    save(tmp_path / "step-3", 3.0, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        set(everything) - {"step-1"} | {"step-3"})
    assert prune(tmp_path, keep=1) == [str(tmp_path / "step-2")]
    assert (tmp_path / "tensorboard" / "events.out").read_text() == "logs"
    assert complete(tmp_path / "torch-ckpt")


def test_an_overwrite_that_dies_leaves_a_folder_that_reads_as_incomplete(tmp_path):
    path = tmp_path / "step-1"
    save(path, 1.0)

    def dies(point):
        if point == "copied":  # the new shard is on the volume, .metadata not yet published
            raise RuntimeError("killed mid-save")

    assert "killed mid-save" in what_it_raised(
        lambda: save(path, 2.0, overwrite=True, on_write_point=dies))
    assert not complete(path) and latest(tmp_path) is None
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        VolumeReader(path)
    save(path, 3.0, overwrite=True)
    assert complete(path) and load(path) == [3.0] * 4


def overwrite_with_rank_dying(path: str, value: float, dies: bool) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    dist.init_process_group("sgpu")
    rank = dist.get_rank()

    def point(name):
        if dies and rank == 1 and name == "staged":  # rank 0's new shard lands; 1's never
            os._exit(17)

    dcp.save({"w": torch.full((4,), value + rank)},
             storage_writer=VolumeWriter(path, overwrite=True, on_write_point=point))
    dist.destroy_process_group()


def test_a_rank_dying_in_an_overwrite_never_leaves_a_mix_of_two_saves(tmp_path):
    path = str(tmp_path / "step-1")
    call = distributed(gpus=2, tracking=False)(overwrite_with_rank_dying)
    call.distributed(path, 1.0, False)
    assert complete(path)
    with pytest.raises(sgpu.Error):
        call.distributed(path, 10.0, True)
    assert (pathlib.Path(path) / "__0_0.distcp").exists()  # rank 0's new shard landed
    assert not complete(path) and latest(tmp_path) is None


def test_a_save_that_fills_the_volume_takes_back_what_it_wrote(tmp_path, monkeypatch):
    volume = tmp_path / "volume"
    volume.mkdir()
    # Two files a save (thread_count=2): the first fits, the second does not.
    monkeypatch.setenv("SGPU_SIM_VOLUME", f"path={volume};capacity=30KiB")
    import torch.distributed.checkpoint as dcp

    big = {"a": torch.zeros(5000), "b": torch.zeros(5000)}  # 20 KB each
    assert "simulated volume: full" in what_it_raised(
        lambda: dcp.save(big, storage_writer=VolumeWriter(volume / "step-1", thread_count=2)))
    assert sorted(p.name for p in (volume / "step-1").iterdir()) == [".sgpu-checkpoint"]
    small = {"a": torch.zeros(2000), "b": torch.zeros(2000)}
    dcp.save(small, storage_writer=VolumeWriter(volume / "step-2", thread_count=2))
    assert latest(volume) == str(volume / "step-2")
    assert prune(volume, keep=1) == [str(volume / "step-1")]  # the failed save, older


@pytest.mark.parametrize("where", ["local disk", "network volume"])
def test_a_damaged_shard_is_refused_on_load(tmp_path, monkeypatch, where):
    if where == "network volume":  # copied into a stage first
        monkeypatch.setenv("SGPU_SIM_VOLUME", f"path={tmp_path}")
    path = tmp_path / "step-1"
    save(path, 1.5)
    assert load(path) == [1.5] * 4
    shard = path / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-20] ^= 0x01
    shard.write_bytes(bytes(data))
    assert re.search(r"RuntimeError: .*step-1: __0_0.distcp is damaged \(size \d+, CRC-32 "
                     r"[0-9a-f]{8}; the save wrote size \d+, CRC-32 [0-9a-f]{8}\)",
                     what_it_raised(lambda: load(path)))
