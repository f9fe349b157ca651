"""Distributed checkpoints on volumes: torch.distributed.checkpoint (DCP) storage that stages
I/O through local disk and publishes a checkpoint only once it is whole.

    import torch.distributed.checkpoint as dcp
    from sgpu.checkpoint import VolumeReader, VolumeWriter, latest

    dcp.save(state, storage_writer=VolumeWriter(f"{root}/step-{step:06d}", keep_last=3))
    found = latest(root)                      # the newest complete checkpoint, or None
    if found:
        dcp.load(state, storage_reader=VolumeReader(found))

A save writes each rank's shards into a local stage folder first, then copies them to the
volume (fsync'd; renamed instead when the stage is its own and on the volume's filesystem)
before the rank's part of the save completes; the coordinator writes
`.metadata` last, once every rank's shards have landed, under a temporary name renamed into
place. A folder with `.metadata` is therefore a complete checkpoint, and a save that dies
half-way (a rank killed, the job cancelled) leaves a folder without one, which latest()
skips. A load copies the files it reads into a local stage, then reads them there (in
place when the volume is on the stage's filesystem). A copy that fails transiently is retried (sgpu/_volume.py; SGPU_SIM_VOLUME simulates a network volume).

The files are DCP's own (torch's FileSystemWriter format): torch's FileSystemReader, and
any tool that reads DCP checkpoints, reads them. (sgpu's C++ checkpoints are safetensors
with a manifest: docs/data-and-checkpoints.md, "Checkpoints from Python".)
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from torch.futures import Future
from typing import Callable

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

from sgpu import _volume

METADATA = ".metadata"

__all__ = ["VolumeReader", "VolumeWriter", "complete", "latest", "prune"]


def _default_stage(kind: str) -> str:
    """A folder of this process's own: under the rank's folder in an sgpu launch (removed
    with it), else the system's temporary folder."""
    base = os.environ.get("SGPU_RANK_DIR") or tempfile.gettempdir()
    return os.path.join(base, f"sgpu-{kind}-stage-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _sync_folder(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class VolumeWriter(FileSystemWriter):
    """DCP storage writer for a checkpoint folder `path` on a volume.

    stage_dir: the local folder shards are written to before they are copied (default: one
        of this process's own, removed once copied).
    keep_last: after a save is published, the coordinator removes all but the newest
        `keep_last` complete checkpoints beside it, and the incomplete ones older than it.
    on_write_point: called with "staged" (this rank's shards are on local disk), "copied"
        (they are on the volume) and, on the coordinator, "published" (`.metadata` is in
        place): a test's way to kill a rank at a chosen point of a save.
    overwrite: refuse (False, the default) or replace a complete checkpoint at `path`.
    Other keyword arguments are FileSystemWriter's.
    """

    def __init__(self, path: str | os.PathLike, *, stage_dir: str | os.PathLike | None = None,
                 keep_last: int | None = None,
                 on_write_point: Callable[[str], None] | None = None, overwrite: bool = False,
                 **kwargs) -> None:
        if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int)
                                      or keep_last < 1):
            raise ValueError(f"keep_last must be a whole number of checkpoints, 1 or more; "
                             f"got {keep_last!r}")
        super().__init__(path, overwrite=overwrite, **kwargs)
        self._stage = os.fspath(stage_dir) if stage_dir is not None else None
        self._keep_last = keep_last
        self._on_write_point = on_write_point or (lambda point: None)

    def write_data(self, plan, planner) -> Future:
        volume = self.path
        stage = self._stage or _default_stage("save")
        os.makedirs(stage, exist_ok=True)
        # Local disk first, unsynced: only the copy on the volume must be durable.
        self.path, synced, self.sync_files = self.fs.init_path(stage), self.sync_files, False
        try:
            results = super().write_data(plan, planner).wait()
        finally:
            self.path, self.sync_files = volume, synced
        self._on_write_point("staged")
        for name in sorted({result.storage_data.relative_path for result in results}):
            _volume.copy(os.path.join(stage, name), os.path.join(os.fspath(volume), name),
                         to_volume=True, move=self._stage is None)
        _sync_folder(os.fspath(volume))
        if self._stage is None:
            shutil.rmtree(stage, ignore_errors=True)
        self._on_write_point("copied")
        done: Future = Future()
        done.set_result(results)
        return done

    def finish(self, metadata, results) -> None:
        super().finish(metadata, results)  # .metadata.tmp, fsync'd, renamed into place
        _sync_folder(os.fspath(self.path))
        self._on_write_point("published")
        if self._keep_last is not None:
            prune(os.path.dirname(os.path.abspath(os.fspath(self.path))), keep=self._keep_last)


class VolumeReader(FileSystemReader):
    """DCP storage reader for a complete checkpoint folder `path` on a volume: each file a
    rank reads is first copied into `stage_dir` (default: one of this process's own,
    removed once read)."""

    def __init__(self, path: str | os.PathLike, *, stage_dir: str | os.PathLike | None = None,
                 **kwargs) -> None:
        if not complete(path):
            raise FileNotFoundError(
                f"{os.fspath(path)} is not a complete checkpoint: it has no {METADATA} (a save "
                "that did not finish leaves none); sgpu.checkpoint.latest(root) names the newest "
                "complete one")
        super().__init__(path, **kwargs)
        self._stage = os.fspath(stage_dir) if stage_dir is not None else None

    def read_data(self, plan, planner) -> Future:
        volume = self.path
        stage = self._stage or _default_stage("load")
        os.makedirs(stage, exist_ok=True)
        simulated = _volume.simulated()
        if self._stage is None and _volume.same_filesystem(os.fspath(volume), stage) and \
                (simulated is None or not simulated.covers(os.fspath(volume))):
            os.rmdir(stage)  # the volume is local disk: read in place
            return super().read_data(plan, planner)
        names = {self.storage_data[item.storage_index].relative_path for item in plan.items}
        for name in sorted(names):
            _volume.copy(os.path.join(os.fspath(volume), name), os.path.join(stage, name),
                         to_volume=False)
        self.path = self.fs.init_path(stage)
        try:
            return super().read_data(plan, planner)
        finally:
            self.path = volume
            if self._stage is None:
                shutil.rmtree(stage, ignore_errors=True)


def complete(path: str | os.PathLike) -> bool:
    """Whether `path` holds a complete checkpoint (its `.metadata`)."""
    return os.path.isfile(os.path.join(os.fspath(path), METADATA))


def _checkpoints(root: str) -> list[tuple[float, str, bool]]:
    """(published time, path, complete) of every folder under `root`, oldest first; an
    incomplete one is timed by its folder."""
    found = []
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        metadata = os.path.join(entry.path, METADATA)
        try:
            published = os.stat(metadata).st_mtime_ns
        except FileNotFoundError:
            published = None
        if published is not None and _volume.listed(metadata, published):
            found.append((published, entry.path, True))
        else:  # not there, or not listed yet (a simulated volume's lag)
            found.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.path, False))
    return sorted(found)


def latest(root: str | os.PathLike) -> str | None:
    """The newest complete checkpoint among the folders of `root` (the one whose `.metadata`
    was published last; by name when two were published at once), or None."""
    done = [(published, path) for published, path, whole in _checkpoints(os.fspath(root)) if whole]
    return max(done)[1] if done else None


def prune(root: str | os.PathLike, keep: int) -> list[str]:
    """Removes all but the `keep` newest complete checkpoints under `root`, and every
    incomplete one older than the newest complete one (a save that died); returns what it
    removed. A save still being written (incomplete, newer than every complete one) stays."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be a whole number of checkpoints, 1 or more; got {keep!r}")
    found = _checkpoints(os.fspath(root))
    whole = [entry for entry in found if entry[2]]
    if not whole:
        return []
    newest = whole[-1][0]
    doomed = [path for _, path, _ in whole[:-keep]]
    doomed += [path for when, path, done in found if not done and when < newest]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return sorted(doomed)
