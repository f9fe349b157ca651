"""sgpu.data: every file of a volume's folder is read exactly once per epoch across ranks and
loader workers, in UCVolumeDataset's split; a loader stopped at any batch resumes with the
identical sequence, and refuses to resume mid-epoch over a folder whose files changed; the
ranks' worker counts must agree; files come from a local cache."""

import os
import pathlib
import tempfile
from unittest import mock

import pytest
from hypothesis import given, settings, strategies as st

from sgpu import distributed
from sgpu.data import DataLoader, VolumeDataset, partition


def volume(folder: pathlib.Path, count: int) -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (folder / f"f{i:03d}.bin").write_bytes(bytes([i % 256]) * (i + 1))
    return folder


@given(files=st.integers(0, 80), world=st.integers(1, 6), workers=st.integers(1, 6))
def test_every_file_is_read_once_per_epoch_across_ranks_and_workers(files, world, workers):
    names = [f"f{i:03d}" for i in range(files)]
    read = [name for rank in range(world) for worker in range(workers)
            for name in partition(names, rank, world, worker, workers)]
    assert sorted(read) == names
    # UCVolumeDataset's split: worker w of rank r starts at file r*W + w.
    if files > world * workers:
        assert partition(names, world - 1, world, workers - 1, workers)[0] == \
            names[world * workers - 1]


def epoch_of(loader) -> list:
    return [[os.path.basename(p) for p in batch] for batch in loader]


@settings(max_examples=25, deadline=None)
@given(files=st.integers(1, 14), workers=st.integers(0, 2), batch=st.integers(1, 3),
       world=st.integers(1, 2), stop=st.floats(0, 1))
def test_a_loader_stopped_at_any_batch_resumes_with_the_identical_sequence(files, workers, batch,
                                                                           world, stop):
    with tempfile.TemporaryDirectory() as folder, \
            mock.patch("sgpu.data._place", return_value=(world - 1, world)), \
            mock.patch.object(DataLoader, "_check_workers"), \
            mock.patch("torch.distributed.broadcast_object_list"):  # ranks here, not a group
        root = volume(pathlib.Path(folder) / "vol", files)
        cache = pathlib.Path(folder) / "cache"

        def loader():
            return DataLoader(VolumeDataset(root, cache_dir=cache), batch_size=batch,
                              num_workers=workers)

        whole = epoch_of(loader())
        names = sorted(p.name for p in root.iterdir())
        mine = [n for w in range(max(workers, 1))
                for n in partition(names, world - 1, world, w, max(workers, 1))]
        assert sorted(n for b in whole for n in b) == sorted(mine)
        cut = int(stop * max(len(whole) - 1, 0))  # batches processed before the state is taken
        first = loader()
        taken = []
        if cut:
            for batch_paths in first:
                taken.append([os.path.basename(p) for p in batch_paths])
                if len(taken) == cut:
                    break
        state = first.state_dict()
        assert (state["epoch"], state["batches"]) == (0, cut)
        resumed = loader()
        resumed.load_state_dict(state)
        assert taken + epoch_of(resumed) == whole
        assert epoch_of(resumed) == whole  # the next epoch is whole again


def test_files_come_from_the_cache_and_a_changed_file_is_fetched_again(tmp_path):
    root = volume(tmp_path / "vol", 3)
    dataset = VolumeDataset(root, glob="f00[01].bin", cache_dir=tmp_path / "cache")
    assert len(dataset) == 2
    first = list(dataset)
    assert first == [str(tmp_path / "cache" / "f000.bin"), str(tmp_path / "cache" / "f001.bin")]
    assert pathlib.Path(first[1]).read_bytes() == b"\x01\x01"
    fetched = dataset.fetch_seconds
    assert list(dataset) == first and dataset.fetch_seconds == fetched  # nothing copied again
    (root / "f001.bin").write_bytes(b"new")
    list(dataset)
    assert pathlib.Path(first[1]).read_bytes() == b"new"
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        VolumeDataset(tmp_path / "missing")


def read_all(root: str, workers_of_rank: dict) -> list:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = DataLoader(VolumeDataset(root), batch_size=2, num_workers=workers_of_rank[rank])
    try:
        names = [os.path.basename(p) for batch in loader for p in batch]
    except ValueError as refused:
        names = str(refused)
    dist.destroy_process_group()
    return names


def test_ranks_read_every_file_once_and_must_agree_on_their_workers(tmp_path):
    import mlflow

    root = volume(tmp_path / "vol", 11)
    call = distributed(gpus=2, name="data")(read_all)
    got = call.distributed(str(root), {0: 2, 1: 2})
    assert sorted(got[0] + got[1]) == sorted(p.name for p in root.iterdir())
    assert not set(got[0]) & set(got[1])
    runs = mlflow.search_runs(search_all_experiments=True, filter_string="run_name = 'data'")
    assert "metrics.fetch_seconds" in runs.columns

    refused = call.distributed(str(root), {0: 2, 1: 1})
    for said in refused:
        assert "different numbers of workers (rank 1: num_workers=1; rank 0: num_workers=2)" in said


def test_a_local_folder_is_read_in_place_and_a_network_volume_through_the_cache(tmp_path,
                                                                              monkeypatch):
    root = volume(tmp_path / "vol", 2)
    assert list(VolumeDataset(root)) == [str(root / "f000.bin"), str(root / "f001.bin")]
    monkeypatch.setenv("SGPU_SIM_VOLUME", f"path={root}")  # as a network mount
    monkeypatch.setenv("SGPU_RANK_DIR", str(tmp_path / "rank"))
    fetched = list(VolumeDataset(root))
    assert all(path.startswith(str(tmp_path / "rank")) for path in fetched)
    assert [pathlib.Path(p).read_bytes() for p in fetched] == [b"\x00", b"\x01\x01"]


def test_a_loader_with_live_workers_resumes_from_a_state_given_it(tmp_path):
    root = volume(tmp_path / "vol", 9)
    loader = DataLoader(VolumeDataset(root), batch_size=2, num_workers=2)  # persistent workers
    whole = epoch_of(loader)
    first = DataLoader(VolumeDataset(root), batch_size=2, num_workers=2)
    for taken, _ in enumerate(first, start=1):
        if taken == 3:
            break
    state = first.state_dict()
    assert state["batches"] == 3
    loader.load_state_dict(state)  # its workers, alive from the epoch before, start anew
    assert epoch_of(loader) == whole[3:]
    assert epoch_of(loader) == whole


def stopped_after(root: pathlib.Path, batches: int) -> dict:
    """The state of a loader over `root` stopped after `batches` batches of its first epoch."""
    loader = DataLoader(VolumeDataset(root), batch_size=2, num_workers=0)
    for taken, _ in enumerate(loader, start=1):
        if taken == batches:
            break
    return loader.state_dict()


def rewrite(path: pathlib.Path, contents: bytes) -> None:
    """`path` written again with `contents`, a second later than it was (a file system's
    clock can be too coarse to tell two writes a moment apart)."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_bytes(contents)
    later = max(before, path.stat().st_mtime_ns) + 10**9
    os.utime(path, ns=(later, later))


def test_a_loader_state_refuses_to_resume_over_a_folder_whose_files_changed(tmp_path):
    # Each change between the save and the resume: a file rewritten with other contents of
    # the same size, one added (sorted first: every later file moves), one removed.
    changes = {
        "rewritten": (lambda root: rewrite(root / "f002.bin", b"zzz"), "f002.bin"),
        "added": (lambda root: rewrite(root / "a-new.bin", b"new"), "a-new.bin"),
        "removed": (lambda root: (root / "f004.bin").unlink(), "6 files then, 5 now"),
    }
    for case, (change, named) in changes.items():
        root = volume(tmp_path / case, 6)
        state = stopped_after(root, 2)
        change(root)
        loader = DataLoader(VolumeDataset(root), batch_size=2, num_workers=0)
        with pytest.raises(ValueError) as refused:
            loader.load_state_dict(state)
        said = str(refused.value)
        assert f"{root} no longer holds the files" in said, case
        assert named in said, case
        assert "Restore the folder" in said and "dict(state, batches=0)" in said, case
        # The way out it names: the epoch over, from its first batch, over the folder as it is.
        loader.load_state_dict(dict(state, batches=0))
        assert sorted(n for b in epoch_of(loader) for n in b) == sorted(p.name for p in root.iterdir())


def test_an_epoch_boundary_state_and_an_older_state_without_a_listing_still_load(tmp_path):
    root = volume(tmp_path / "vol", 6)
    loader = DataLoader(VolumeDataset(root), batch_size=2, num_workers=0)
    epoch_of(loader)
    between_epochs = loader.state_dict()
    mid_epoch = stopped_after(root, 1)
    rewrite(root / "f002.bin", b"zzz")
    rewrite(root / "f100.bin", b"new")
    # Between epochs nothing of the epoch was read: the next one reads the folder as it is.
    resumed = DataLoader(VolumeDataset(root), batch_size=2, num_workers=0)
    resumed.load_state_dict(between_epochs)
    assert resumed.epoch == 1 and len([n for b in epoch_of(resumed) for n in b]) == 7
    # A state saved before states carried their listing cannot tell: it loads as it did.
    older = {key: value for key, value in mid_epoch.items()
             if key not in ("listing", "newest_mtime_ns")}
    older["files"] = 7
    DataLoader(VolumeDataset(root), batch_size=2, num_workers=0).load_state_dict(older)
