"""What every rank of a soak call does, as a decorated function and as a program for
`sgpu run`: say where it is (its pid, then that it has joined), then all-reduce a tensor of
the call's size `steps` times, a pause between, checking every sum. The checkpoint case's
ranks (`checkpointed`) save a DCP checkpoint a step, one of them ending itself mid-save.

The pid file is how the soak finds a rank to kill (a rank forked by the fork server shows
no marker in /proc/PID/environ); the ready file says the rank has joined its group and is
in its loop, so a kill sent then always lands while the rank works."""

import os
import pathlib
import sys
import time
import zlib


def _announce(call_dir: pathlib.Path, name: str, text: str) -> None:
    temporary = call_dir / f".{name}.tmp"
    temporary.write_text(text)
    temporary.rename(call_dir / name)


def work(call_dir: str, elements: int, steps: int, pause: float, blob: bytes = b"",
         chatter: int = 0, daemon: bool = False, exit_rank: int = -1) -> dict:
    import torch
    import torch.distributed as dist

    import sgpu  # registers the "sgpu" backend

    rank = sgpu.get_global_rank()
    folder = pathlib.Path(call_dir)
    _announce(folder, f"rank-{rank}.pid", str(os.getpid()))
    dist.init_process_group("sgpu")
    try:
        world = dist.get_world_size()
        expected = world * (world + 1) / 2
        for step in range(steps):
            values = torch.full((elements,), float(rank + 1))
            dist.all_reduce(values)
            if not bool(torch.all(values == expected)):
                raise AssertionError(f"rank {rank} step {step}: sum {values[0].item()}, not {expected}")
            if step == 0:
                for line in range(chatter):  # output enough to fill a small runs folder
                    print(f"chatter {line:06d} " + "x" * 100)
                if daemon:  # a process that leaves the rank's group: it must not outlive the call
                    import subprocess

                    subprocess.Popen(["sleep", "1000"], start_new_session=True)
                _announce(folder, f"rank-{rank}.ready", "")
            if step == 1 and rank == exit_rank:
                sys.exit(7)
            time.sleep(pause)
        return {"rank": rank, "world": world, "blob": zlib.crc32(blob), "bytes": len(blob)}
    finally:
        dist.destroy_process_group()


def checkpointed(call_dir: str, root: str, elements: int, steps: int, die_rank: int = -1,
                 die_in_save: int = 0, die_at: str = "", code: int = 0) -> dict:
    """`steps` steps from the start, or from sgpu.checkpoint.latest(root) when there is one,
    each step's state saved through VolumeWriter to root/step-NNNNNN: rank `die_rank`
    ends itself with exit code `code` at the write point `die_at` ("staged", "copied",
    "published") of save number `die_in_save` (the step's). Each rank's state is
    `elements` copies of x_r, from r + 1; at step s, x_r becomes the sum over the ranks
    plus s * (r + 1)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import sgpu
    from sgpu.checkpoint import VolumeReader, VolumeWriter, latest

    rank = sgpu.get_global_rank()
    folder = pathlib.Path(call_dir)
    folder.mkdir(parents=True, exist_ok=True)
    _announce(folder, f"rank-{rank}.pid", str(os.getpid()))
    dist.init_process_group("sgpu")
    try:
        mine = f"rank{rank}"  # each rank's own shard
        state = {"step": torch.zeros(1, dtype=torch.int64),
                 mine: torch.full((elements,), float(rank + 1))}
        found = latest(root)
        if found is not None:
            dcp.load(state, storage_reader=VolumeReader(found))
        step = int(state["step"].item())
        while step < steps:
            step += 1
            total = state[mine].clone()
            dist.all_reduce(total)
            state = {"step": torch.tensor([step]), mine: total + step * (rank + 1)}

            def point(name: str, dies: bool = rank == die_rank and step == die_in_save) -> None:
                if dies and name == die_at:
                    os._exit(code)

            dcp.save(state, storage_writer=VolumeWriter(f"{root}/step-{step:06d}",
                                                        on_write_point=point))
        return {"rank": rank, "world": dist.get_world_size(), "step": step,
                "loaded": os.path.basename(found) if found else "", "values": state[mine].tolist()}
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":  # a program's rank: work.py DIR ELEMENTS STEPS PAUSE CHATTER DAEMON
    print(work(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]),
               chatter=int(sys.argv[5]), daemon=sys.argv[6] == "1"), flush=True)
