#!/usr/bin/env python3
"""Python data and checkpoint I/O (sgpu.checkpoint, sgpu.data) against the plain baseline
in the same run, on this machine's disk (the "volume" is a local folder):

  save     dcp.save through VolumeWriter (stage locally, copy fsync'd, .metadata last)
           against dcp.save through torch's FileSystemWriter to the same disk: MB/s and
           the ratio (aim >= 0.9x)
  load     dcp.load through VolumeReader (copy into a stage, read there) against
           FileSystemReader
  sim      the save again under SGPU_SIM_VOLUME=bandwidth=B: MB/s against B
  async    dcp.async_save's blocking time against dcp.save's whole time (1-rank gloo group)
  dataset  files/s of sgpu.data.DataLoader over a VolumeDataset (a local folder, read in
           place; then with a named cache, cold and warm) against torch's DataLoader over
           os.listdir reading each file, same workers

    PYTHONPATH=build/python /opt/sgpu/venv/bin/python bench/bench_python_io.py [--mb 256]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from sgpu.checkpoint import VolumeReader, VolumeWriter
from sgpu.data import DataLoader, VolumeDataset


def state_of(megabytes: int) -> dict:
    count = 8
    per = megabytes * (1 << 20) // 4 // count
    return {f"layer{i}": torch.randn(per) for i in range(count)}


def median_seconds(run, repeat: int) -> float:
    return statistics.median(run() for _ in range(repeat))


def alternating(baseline, ours, repeat: int) -> tuple[float, float]:
    """Median seconds of each, run in turn, so that the machine's drift hits both alike."""
    times: tuple[list, list] = ([], [])
    for _ in range(repeat):
        times[0].append(baseline())
        times[1].append(ours())
    return statistics.median(times[0]), statistics.median(times[1])


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_checkpoints(folder: str, megabytes: int, repeat: int, bandwidth_mb: int) -> None:
    state = state_of(megabytes)
    size_mb = sum(t.numel() * t.element_size() for t in state.values()) / 1e6
    serial = iter(range(10 ** 6))

    def fresh() -> str:
        path = os.path.join(folder, f"ckpt-{next(serial)}")
        return path

    def save_with(writer_class) -> float:
        path = fresh()
        seconds = timed(lambda: dcp.save(state, storage_writer=writer_class(path)))
        return seconds

    save_with(dcp.FileSystemWriter)  # warm-up: first allocations, imports
    plain, ours = alternating(lambda: save_with(dcp.FileSystemWriter),
                              lambda: save_with(VolumeWriter), repeat)
    print(f"save     {size_mb:7.1f} MB  FileSystemWriter {size_mb / plain:8.1f} MB/s   "
          f"VolumeWriter {size_mb / ours:8.1f} MB/s   x{plain / ours:.2f} (aim >= 0.9)")

    saved = fresh()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(saved))
    target = {name: torch.empty_like(t) for name, t in state.items()}
    plain, ours = alternating(
        lambda: timed(lambda: dcp.load(target, storage_reader=dcp.FileSystemReader(saved))),
        lambda: timed(lambda: dcp.load(target, storage_reader=VolumeReader(saved))), repeat)
    print(f"load     {size_mb:7.1f} MB  FileSystemReader {size_mb / plain:8.1f} MB/s   "
          f"VolumeReader {size_mb / ours:8.1f} MB/s   x{plain / ours:.2f}")

    os.environ["SGPU_SIM_VOLUME"] = f"bandwidth={bandwidth_mb}MB/s"
    try:
        simulated = median_seconds(lambda: save_with(VolumeWriter), max(repeat // 2, 1))
    finally:
        del os.environ["SGPU_SIM_VOLUME"]
    print(f"sim      {size_mb:7.1f} MB  simulated {bandwidth_mb} MB/s: VolumeWriter "
          f"{size_mb / simulated:8.1f} MB/s   x{size_mb / simulated / bandwidth_mb:.2f} of it")

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        whole = median_seconds(lambda: save_with(VolumeWriter), repeat)

        def blocked() -> float:
            path = fresh()
            start = time.perf_counter()
            pending = dcp.async_save(state, storage_writer=VolumeWriter(path))
            seconds = time.perf_counter() - start
            pending.result()
            return seconds

        background = median_seconds(blocked, repeat)
    finally:
        dist.destroy_process_group()
    print(f"async    {size_mb:7.1f} MB  save {whole * 1e3:8.1f} ms   async_save blocks "
          f"{background * 1e3:8.1f} ms   x{background / whole:.2f} of save")


class ListedFiles(torch.utils.data.IterableDataset):
    """The baseline: os.listdir's files, each read by the worker that yields it."""

    def __init__(self, root: str):
        self.root = root
        self.names = sorted(os.listdir(root))

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        for name in self.names[worker::workers]:
            path = os.path.join(self.root, name)
            with open(path, "rb") as f:
                f.read()
            yield path


def bench_dataset(folder: str, files: int, workers: int) -> None:
    root = os.path.join(folder, "data")
    os.makedirs(root)
    payload = os.urandom(4096)
    for i in range(files):
        with open(os.path.join(root, f"f{i:06d}.bin"), "wb") as f:
            f.write(payload)

    def epoch(loader) -> float:
        return timed(lambda: sum(len(batch) for batch in loader))

    plain = epoch(torch.utils.data.DataLoader(ListedFiles(root), batch_size=32,
                                              num_workers=workers))
    in_place = epoch(DataLoader(VolumeDataset(root), batch_size=32, num_workers=workers))
    cached = DataLoader(VolumeDataset(root, cache_dir=os.path.join(folder, "cache")),
                        batch_size=32, num_workers=workers)
    cold = epoch(cached)
    warm = epoch(cached)
    print(f"dataset  {files} files of 4 KiB, {workers} workers: os.listdir + read "
          f"{files / plain:8.0f} files/s   VolumeDataset local {files / in_place:8.0f} files/s "
          f"(x{plain / in_place:.2f}); with a cache, cold {files / cold:8.0f} files/s "
          f"(x{plain / cold:.2f}), warm {files / warm:8.0f} files/s (x{plain / warm:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=256, help="checkpoint size")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--bandwidth", type=int, default=200, help="simulated MB/s")
    parser.add_argument("--files", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores; medians of {args.repeat}, baseline and sgpu in turn; (x) "
          "is sgpu's rate over the baseline's")
    folder = tempfile.mkdtemp(prefix="sgpu-bench-io-")
    try:
        bench_checkpoints(folder, args.mb, args.repeat, args.bandwidth)
        bench_dataset(folder, args.files, args.workers)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
