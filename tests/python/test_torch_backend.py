"""torch.distributed over the "sgpu" backend in Python ranks: collectives, the fault plan's
collective faults, and PyTorch's own DDP and FSDP, over both simulated transports."""

import os
import re
import time

import pytest

import sgpu
from conftest import distributed_error
from sgpu import distributed


def all_reduce_ranks(steps):
    import torch
    import torch.distributed as dist

    dist.init_process_group("sgpu")
    try:
        total = torch.zeros(3)
        for _ in range(steps):
            t = torch.full((3,), float(dist.get_rank() + 1))
            dist.all_reduce(t)
            total += t
        gathered = [torch.zeros(1) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, torch.tensor([float(dist.get_rank())]))
        # Two subgroups, each with its own segment (torch gives each its own prefix store).
        rank = dist.get_rank()
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        mine = torch.tensor([float(rank)])
        dist.all_reduce(mine, group=pairs[rank // 2])
        return dist.get_backend(), total.tolist(), [g.item() for g in gathered], mine.item()
    finally:
        dist.destroy_process_group()


TRANSPORTS = pytest.mark.parametrize("transport", ["shm", "gloo"])


@TRANSPORTS
def test_collectives_run_over_the_sgpu_backend(transport):
    fn = distributed(gpus=4, tracking=False, sim_transport=transport)(all_reduce_ranks)
    results = fn.distributed(2)
    gathered = [0.0, 1.0, 2.0, 3.0]
    assert results == [("sgpu", [20.0] * 3, gathered, 1.0)] * 2 + \
        [("sgpu", [20.0] * 3, gathered, 5.0)] * 2


@pytest.mark.parametrize("plan, kind", [("rank=1:segv@collective=2", "signal"),
                                        ("rank=2:exit=7@collective=1", "exit_code"),
                                        ("rank=3:throw@collective=3", "exception")])
@TRANSPORTS
def test_collective_faults_act_in_python_ranks(plan, kind, transport):
    rank = int(plan.split(":")[0].split("=")[1])
    fn = distributed(gpus=4, tracking=False, sim_faults=plan, timeout=120,
                     sim_transport=transport)(all_reduce_ranks)
    with pytest.raises(Exception) as caught:
        fn.distributed(5)
    error = distributed_error(caught.value)
    assert isinstance(error, sgpu.DistributedError)
    assert error.root_cause.rank == rank, str(error)
    assert error.root_cause.kind == kind, str(error)


def test_an_unknown_transport_is_a_config_error_before_anything_starts():
    fn = distributed(gpus=2, tracking=False, sim_transport="tcp")(all_reduce_ranks)
    with pytest.raises(sgpu.errors.ConfigError, match='sim_transport="tcp".*"shm".*"gloo"'):
        fn.distributed(1)


def test_the_sgpu_backend_outside_a_rank_says_what_to_use():
    import torch.distributed as dist

    from datetime import timedelta

    sgpu.register_backend()
    options = dist.distributed_c10d._DistributedBackendOptions()
    options.store = dist.HashStore()
    options.group_rank = 0
    options.group_size = 1
    options.timeout = timedelta(seconds=30)
    options.group_id = "0"
    options.global_ranks_in_group = [0]
    # As torch's backends fail: a RuntimeError, which mp.spawn-style code already catches.
    with pytest.raises(RuntimeError, match='sgpu started.*"gloo" or "nccl"'):
        dist.Backend._plugins["SGPU"].creator_fn(options, None)


def all_reduces(steps, pair_hang_rank):
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("sgpu")
    t = torch.ones(1024)
    for _ in range(steps):
        dist.all_reduce(t)
    pair = dist.new_group([1, 2])
    if dist.get_rank() in (1, 2):
        if dist.get_rank() == pair_hang_rank:
            time.sleep(600)  # never reaches the pair's collective
        dist.all_reduce(t, group=pair)
    return dist.get_rank()


@pytest.mark.parametrize("rank, k", [(0, 1), (2, 3)])
@TRANSPORTS
def test_a_hang_in_a_python_rank_names_the_rank_and_the_collective(rank, k, transport):
    fn = distributed(gpus=3, tracking=False, timeout=120, hang_timeout=1.5,
                     sim_faults=f"rank={rank}:hang@collective={k}",
                     sim_transport=transport)(all_reduces)
    with pytest.raises(sgpu.HangError) as caught:
        fn.distributed(4, -1)
    verdict = caught.value.collectives.verdict
    assert caught.value.collectives.culprits == (rank,), str(caught.value)
    assert verdict.startswith(f"rank {rank} never entered collective #{k} "
                              "(all_reduce of 1024 float32 (sum))"), verdict
    assert f"hung: {verdict}" in str(caught.value)


@TRANSPORTS
def test_a_hang_in_a_subgroup_names_the_group_by_its_ranks(transport):
    fn = distributed(gpus=3, tracking=False, timeout=120, hang_timeout=1.5,
                     sim_transport=transport)(all_reduces)
    with pytest.raises(sgpu.HangError) as caught:
        fn.distributed(2, 1)
    diagnosis = caught.value.collectives
    assert diagnosis.culprits == (1,), str(caught.value)
    assert diagnosis.verdict.startswith(
        "rank 1 never entered collective #1 of process group ranks 1,2"), diagnosis.verdict
    assert "[ranks 1,2] #1 all_reduce" in diagnosis.table, diagnosis.table
    # Rank 1's Python stack shows where it is held.
    assert "in all_reduces" in diagnosis.culprit_stack, diagnosis.culprit_stack
    assert os.path.isfile(diagnosis.stacks)


def skips(skipper, skipped):
    import torch
    import torch.distributed as dist

    dist.init_process_group("sgpu")
    t = torch.ones(1024)
    for i in range(1, 7):  # all-reduce and broadcast by turns
        if dist.get_rank() == skipper and i == skipped:
            continue
        if i % 2:
            dist.all_reduce(t)
        else:
            dist.broadcast(t, src=0)
    return dist.get_rank()


@pytest.mark.parametrize("transport, rank, k", [("shm", 0, 2), ("gloo", 2, 3)])
def test_a_python_rank_that_skips_a_collective_is_named_at_it(transport, rank, k):
    fn = distributed(gpus=3, tracking=False, timeout=120, hang_timeout=1.5,
                     sim_transport=transport)(skips)
    with pytest.raises(Exception) as caught:
        fn.distributed(rank, k)
    # Its k-th collective is the other op: the ranks disagree at #k (shared memory fails
    # them there, a rank's error raised as itself; over Gloo the watchdog judges it).
    error = distributed_error(caught.value)
    assert isinstance(error, sgpu.DistributedError), repr(caught.value)
    assert error.collectives.culprits == (rank,), str(error)
    assert re.search(rf"collective #{k}\b", error.collectives.verdict), error.collectives.verdict


def test_a_bad_hang_timeout_is_a_config_error():
    with pytest.raises(sgpu.ConfigError, match="hang_timeout=None"):
        distributed(gpus=2, hang_timeout=0)(all_reduces).distributed(1, -1)


def train_ddp(steps, fsdp):
    import torch
    import torch.distributed as dist

    dist.init_process_group("sgpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    if fsdp:  # FSDP2: each Linear a unit, then the root
        from torch.distributed.fsdp import fully_shard

        fully_shard(model[0])
        fully_shard(model[2])
        fully_shard(model)
    else:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(steps):
        x = torch.randn(4, 8, generator=generator)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if fsdp:  # each parameter a DTensor sharded over the ranks: gathered whole
        state = {k: v.full_tensor() for k, v in model.state_dict().items()}
    else:
        state = model.module.state_dict()
    flat = torch.cat([v.flatten() for _, v in sorted(state.items())])
    dist.destroy_process_group()
    return flat.tolist()


@TRANSPORTS
@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp"])
def test_pytorch_ddp_and_fsdp_end_with_equal_parameters_on_every_rank(fsdp, transport):
    fn = distributed(gpus=4, tracking=False, timeout=300, sim_transport=transport)(train_ddp)
    results = fn.distributed(5, fsdp)
    assert all(r == results[0] for r in results[1:])
    # the ranks saw different data: training moved the parameters away from the seed's
    import torch

    torch.manual_seed(0)
    initial = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    start = torch.cat([v.flatten() for _, v in sorted(initial.state_dict().items())]).tolist()
    assert results[0] != start


def _flight_recorder_verdicts(folder):
    """torch's own flight-recorder analyzer over the dumps sgpu wrote: its collectives,
    with the ranks it finds missing or mismatched (ranks read in rank order)."""
    import logging

    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir

    logging.getLogger("Flight Recorder").setLevel(logging.WARNING)
    args = JobConfig().parse_args([folder])
    details, version = read_dir(args)
    details = dict(sorted(details.items(), key=lambda kv: kv[1]["rank"]))
    return build_db(details, args, version).collectives


def odd_size_at(rank, step):
    import torch
    import torch.distributed as dist

    dist.init_process_group("sgpu")
    for i in range(1, 4):
        size = 1025 if (dist.get_rank() == rank and i == step) else 1024
        dist.all_reduce(torch.ones(size))
    return dist.get_rank()


@TRANSPORTS
def test_torchs_flight_recorder_analyzer_finds_the_same_missing_rank(transport):
    fn = distributed(gpus=3, tracking=False, timeout=120, hang_timeout=1.5,
                     sim_faults="rank=1:hang@collective=3", sim_transport=transport)(all_reduces)
    with pytest.raises(sgpu.HangError) as caught:
        fn.distributed(4, -1)
    assert caught.value.collectives.culprits == (1,)
    folder = os.path.join(caught.value.run_dir, "flight-recorder")
    assert sorted(os.listdir(folder)) == [f"nccl_trace_rank_{r}" for r in range(3)]
    collectives = _flight_recorder_verdicts(folder)
    missing = [c for c in collectives if c.missing_ranks]
    assert [(c.collective_seq_id, c.missing_ranks) for c in missing] == [(3, {1})]
    assert all(c.pass_check for c in collectives)


@TRANSPORTS
def test_torchs_flight_recorder_analyzer_finds_the_same_odd_size(transport):
    fn = distributed(gpus=3, tracking=False, timeout=120, hang_timeout=1.5,
                     sim_transport=transport)(odd_size_at)
    with pytest.raises(Exception) as caught:
        fn.distributed(2, 2)
    error = distributed_error(caught.value)
    assert error.collectives.culprits == (2,), str(error)
    assert "rank 2 called all_reduce of 1025 float32" in error.collectives.verdict
    collectives = _flight_recorder_verdicts(os.path.join(error.run_dir, "flight-recorder"))
    odd = [c for c in collectives if not c.pass_check]
    assert [c.collective_seq_id for c in odd] == [2]
    assert set(odd[0].mismatch_collectives) == {2}
    assert "[[1025]]" in str(odd[0].mismatch_collectives[2].type_of_mismatch)


def less_used_ops():
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("sgpu")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        # torch's monitored_barrier() takes only a backend named "gloo"; the group's own
        # method is what it calls.
        dist.group.WORLD.monitored_barrier(timedelta(seconds=60), wait_all_ranks=True)
        # c10d's layout: one output list a rank, each as long as the inputs.
        inputs = [torch.full((2,), 10.0 * rank + i) for i in range(world)]
        outputs = [[torch.zeros(2) for _ in range(world)] for _ in range(world)]
        dist.all_gather_coalesced(outputs, inputs)
        gathered = [[t[0].item() for t in row] for row in outputs]
        sources = []
        if rank == 0:
            for _ in range(world - 1):
                t = torch.zeros(3)
                sources.append((dist.recv(t), t[0].item()))
        else:
            dist.send(torch.full((3,), float(rank)), 0)
        sparse = torch.sparse_coo_tensor([[rank]], [1.0], (world,))
        try:
            dist.all_reduce(sparse)
            summed = sparse.to_dense().tolist()
        except RuntimeError as e:
            summed = str(e)
        return gathered, sorted(sources), summed
    finally:
        dist.destroy_process_group()


@TRANSPORTS
def test_the_less_used_ops_run_as_torchs_backends_run_them(transport):
    fn = distributed(gpus=3, tracking=False, sim_transport=transport, timeout=120)(less_used_ops)
    results = fn.distributed()
    gathered = [[10.0 * r + i for i in range(3)] for r in range(3)]
    assert [r[0] for r in results] == [gathered] * 3
    assert results[0][1] == [(1, 1.0), (2, 2.0)]
    if transport == "gloo":
        assert [r[2] for r in results] == [[1.0, 1.0, 1.0]] * 3
    else:
        # The shared-memory transport moves dense tensors; a sparse one is refused by name.
        assert all("sparse" in r[2].lower() for r in results), results


def waits_in_a_collective():
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("sgpu")  # torch's default timeout: 30 minutes
    if dist.get_rank() == 1:
        time.sleep(60)  # never joins the all-reduce within the call's deadline
    dist.all_reduce(torch.ones(4))
    return 0


def test_the_calls_deadline_ends_a_collective_its_group_would_still_wait_on():
    # The call's timeout bounds a Python rank's collectives: rank 0's all-reduce, whose
    # group would wait 30 minutes, ends with the call at its 6 s.
    started = time.monotonic()
    with pytest.raises(sgpu.TimeoutError, match="ranks still running: 0, 1") as caught:
        distributed(gpus=2, timeout=6, teardown_grace=0.5)(waits_in_a_collective).distributed()
    assert time.monotonic() - started < 60
    assert [row.kind for row in caught.value.ranks] == ["timed_out", "timed_out"]


def waits_for_a_late_peer_in_a_group_of_no_deadline(seconds: float) -> float:
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group("sgpu")
    group = dist.new_group(timeout=datetime.timedelta(seconds=seconds))
    if dist.get_rank() == 1:
        time.sleep(1)  # rank 0 waits in the all-reduce for it
    total = torch.ones(2)
    dist.all_reduce(total, group=group)
    dist.destroy_process_group()
    return total[0].item()


@TRANSPORTS
def test_a_group_timeout_past_a_century_is_no_deadline(transport):
    # 1e10 s is past what the clocks count in nanoseconds: a group given it waits, as one
    # given none does, rather than time out at once on a deadline that overflowed.
    fn = distributed(gpus=2, tracking=False, sim_transport=transport)(
        waits_for_a_late_peer_in_a_group_of_no_deadline)
    assert fn.distributed(1e10) == [2.0, 2.0]


def late_to_a_monitored_barrier() -> str:
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group("sgpu")
    if dist.get_rank() == 1:
        time.sleep(3)
    try:
        dist.group.WORLD.monitored_barrier(timedelta(seconds=1))
        said = "passed"
    except RuntimeError as error:
        said = str(error)
    dist.destroy_process_group()
    return said


def test_a_monitored_barrier_times_out_in_gloos_words():
    # torch's suite and programs look for Gloo's words; the shared-memory transport keeps
    # its verdict after them.
    said = distributed(gpus=2, tracking=False, sim_transport="shm")(
        late_to_a_monitored_barrier).distributed()[0]
    assert said.startswith("Rank 0 timed out in monitoredBarrier after 1000 ms. "), said
    assert "rank 1 has not arrived" in said, said
