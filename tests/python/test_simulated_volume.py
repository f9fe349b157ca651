"""SGPU_SIM_VOLUME: a network volume's behaviour for sgpu.data and sgpu.checkpoint. A save
rides through transient failures, retried and said; one that cannot succeed fails naming
the file and leaves the previous checkpoint latest(); files and checkpoints are listed only
after the volume's lag, and every rank splits rank 0's listing."""

import os
import pathlib
import time
from unittest import mock

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import sgpu
from sgpu import _volume, distributed
from sgpu.checkpoint import VolumeReader, VolumeWriter, complete, latest
from sgpu.data import DataLoader, VolumeDataset


def save(path, value: float):
    state = {"w": torch.full((1000,), value), "b": torch.arange(10.0)}
    dcp.save(state, storage_writer=VolumeWriter(path))


def test_a_save_under_transient_failures_succeeds_and_says_each_retry(monkeypatch, tmp_path, capfd):
    monkeypatch.setenv("SGPU_SIM_VOLUME", f"path={tmp_path};fail_every=2")
    before = _volume.retries
    save(tmp_path / "step-1", 1.0)   # one shard: its write, #1, lands
    save(tmp_path / "step-2", 2.0)   # #2 fails once, #3 lands
    assert _volume.retries == before + 1
    said = capfd.readouterr().err
    assert f"sgpu: volume: writing {tmp_path}/step-2/__0_0.distcp failed" in said
    assert "simulated volume: transient failure (write #2 of this process)" in said
    assert "try 2 of 5" in said
    loaded = {"w": torch.zeros(1000), "b": torch.zeros(10)}
    dcp.load(loaded, storage_reader=VolumeReader(latest(tmp_path)))
    assert loaded["w"][0] == 2.0 and latest(tmp_path) == str(tmp_path / "step-2")


def test_a_save_that_cannot_succeed_names_the_file_and_the_last_checkpoint_stays(monkeypatch,
                                                                                 tmp_path):
    save(tmp_path / "step-1", 1.0)
    monkeypatch.setenv("SGPU_SIM_VOLUME", f"path={tmp_path};fail_rate=0.99;seed=3")
    with pytest.raises(CheckpointException, match=r"writing .*step-2/__0_0.distcp failed 5 times"):
        save(tmp_path / "step-2", 2.0)
    assert not complete(tmp_path / "step-2")
    used = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    monkeypatch.setenv("SGPU_SIM_VOLUME", f"path={tmp_path};capacity={used + 100}B")
    with pytest.raises(CheckpointException, match=r"writing .*step-3/__0_0.distcp failed: "
                                                  r"simulated volume: full"):
        save(tmp_path / "step-3", 3.0)   # full: not retried
    assert latest(tmp_path) == str(tmp_path / "step-1")


def test_files_and_checkpoints_appear_after_the_volumes_list_lag(monkeypatch, tmp_path):
    monkeypatch.setenv("SGPU_SIM_VOLUME", f"path={tmp_path};list_lag=1s")
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.bin").write_bytes(b"a")
    save(tmp_path / "ckpt" / "step-1", 1.0)
    assert len(VolumeDataset(data)) == 0 and latest(tmp_path / "ckpt") is None
    time.sleep(1.05)
    assert len(VolumeDataset(data)) == 1 and latest(tmp_path / "ckpt") == str(tmp_path / "ckpt" / "step-1")


def test_a_copy_to_the_volume_takes_at_least_its_size_over_the_bandwidth(monkeypatch, tmp_path):
    source = tmp_path / "local.bin"
    source.write_bytes(os.urandom(2 * 10**6))  # 2 MB
    volume = tmp_path / "volume"
    volume.mkdir()

    def seconds_to_copy(name: str) -> float:
        start = time.perf_counter()
        _volume.copy(str(source), str(volume / name), to_volume=True)
        return time.perf_counter() - start

    monkeypatch.setenv("SGPU_SIM_VOLUME", f"path={volume};bandwidth=10MB/s")
    assert seconds_to_copy("slow.bin") >= 0.19  # 2 MB at 10 MB/s: 0.2 s
    assert (volume / "slow.bin").read_bytes() == source.read_bytes()
    monkeypatch.setenv("SGPU_SIM_VOLUME", f"path={volume}")  # the same volume, no bandwidth
    # The copy itself is quick: the fastest of three, past a stall of the disk's.
    assert min(seconds_to_copy(f"fast-{i}.bin") for i in range(3)) < 0.1


def test_settings_are_checked_and_refused_on_cuda(monkeypatch, tmp_path):
    for text, said in [("speed=1", "unknown setting 'speed'"), ("latency=fast", "latency='fast'"),
                       ("fail_rate=1", "fail_rate='1'"), ("capacity=1MB", "capacity needs path=")]:
        monkeypatch.setenv("SGPU_SIM_VOLUME", text)
        with pytest.raises(ValueError, match=said):
            _volume.simulated()
    monkeypatch.setenv("SGPU_SIM_VOLUME", "latency=1ms")
    monkeypatch.setenv("SGPU_RANK_BACKEND", "cuda")
    with pytest.raises(sgpu.ConfigError, match="the volume is real"):
        _volume.simulated()


def listing_of_rank_0(root: str) -> list:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # Rank 1's volume does not list the first file yet (written within its lag): it
    # splits rank 0's list, not its own.
    real = sgpu.data._list
    with mock.patch("sgpu.data._list", side_effect=lambda r, g: real(r, g)[1:] if rank else real(r, g)):
        names = [os.path.basename(p) for batch in DataLoader(VolumeDataset(root), num_workers=0)
                 for p in batch]
    dist.destroy_process_group()
    return names


def test_every_rank_splits_rank_0s_listing(tmp_path):
    root = tmp_path / "vol"
    root.mkdir()
    for i in range(5):
        (root / f"f{i}").write_bytes(b"x")
    got = distributed(gpus=2, tracking=False)(listing_of_rank_0).distributed(str(root))
    assert sorted(got[0] + got[1]) == [f"f{i}" for i in range(5)]
