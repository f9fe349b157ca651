"""Distributed checkpoints on volumes: torch.distributed.checkpoint (DCP) storage that stages
I/O through local disk and publishes a checkpoint only once it is whole.

    import torch.distributed.checkpoint as dcp
    from sgpu.checkpoint import VolumeReader, VolumeWriter, latest

    dcp.save(state, storage_writer=VolumeWriter(f"{root}/step-{step:06d}", keep_last=3))
    found = latest(root)                      # the newest complete checkpoint, or None
    if found:
        dcp.load(state, storage_reader=VolumeReader(found))

A save begins with the coordinator marking the folder as sgpu's (`.sgpu-checkpoint`, "writing")
and taking away any `.metadata` an earlier save left there (overwrite=True), before any rank
writes. Each rank writes its shards into a local stage folder first, then copies them to the
volume (fsync'd; renamed instead when the stage is its own and on the volume's filesystem)
before its part of the save completes, with their sizes and CRC-32s beside them; a rank whose
copy fails removes what it wrote. The coordinator then writes the sums of every shard into
`.sgpu-checkpoint` and `.metadata` last, under a temporary name renamed into place. A folder
with `.metadata` is therefore a complete checkpoint of one save, and a save that dies
half-way (a rank killed, the job cancelled) leaves a folder without one, which latest()
skips. prune() removes only folders marked as sgpu's checkpoints. A load copies the files it
reads into a local stage, then reads them there (in place when the volume is on the stage's
filesystem), each checked against its sum. A copy that fails transiently is retried
(sgpu/_volume.py; SGPU_SIM_VOLUME simulates a network volume).

The files are DCP's own (torch's FileSystemWriter format): torch's FileSystemReader, and
any tool that reads DCP checkpoints, reads them. (sgpu's C++ checkpoints are safetensors
with a manifest: docs/data-and-checkpoints.md, "Checkpoints from Python".)
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
import zlib
from torch.futures import Future
from typing import Callable

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

import _sgpu_rank_env as _rank_env

from sgpu import _volume

METADATA = ".metadata"
# NOTE [sgpu's checkpoint marker]: `.sgpu-checkpoint` says a folder is a checkpoint sgpu
# wrote, so prune() removes nothing else. JSON: {"format": 1, "save": id, "state":
# "writing"} from the start of a save, then {"state": "complete", "files": {name: {"size":
# bytes, "crc32": n}}} just before `.metadata` is published. Each rank leaves its shards'
# sums beside them as `.sgpu-sums<prefix>json` until the coordinator folds them in.
MARKER = ".sgpu-checkpoint"
_SUMS_PREFIX = ".sgpu-sums"
_MARKER_FORMAT = 1

__all__ = ["VolumeReader", "VolumeWriter", "complete", "latest", "prune"]


def _default_stage(kind: str) -> str:
    """A folder of this process's own: under the rank's folder in an sgpu launch (removed
    with it), else the system's temporary folder."""
    base = os.environ.get(_rank_env.RANK_DIR) or tempfile.gettempdir()
    return os.path.join(base, f"sgpu-{kind}-stage-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _sync_folder(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _write_json(path: str, value: dict) -> None:
    """`value` as JSON at `path`, whole or not at all: written beside it, fsync'd, renamed."""
    temporary = f"{path}.tmp"
    with open(temporary, "w") as file:
        json.dump(value, file, sort_keys=True)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def _crc32(path: str) -> int:
    crc = 0
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def _sum(path: str) -> dict:
    return {"size": os.path.getsize(path), "crc32": _crc32(path)}


def _marker(folder: str) -> dict | None:
    """The folder's `.sgpu-checkpoint`, or None where sgpu wrote no checkpoint there."""
    try:
        with open(os.path.join(folder, MARKER)) as file:
            found = json.load(file)
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class VolumeWriter(FileSystemWriter):
    """DCP storage writer for a checkpoint folder `path` on a volume.

    stage_dir: the local folder shards are written to before they are copied (default: one
        of this process's own, removed once copied).
    keep_last: after a save is published, the coordinator removes all but the newest
        `keep_last` complete checkpoints beside it, and the incomplete ones older than it.
    on_write_point: called with "staged" (this rank's shards are on local disk), "copied"
        (they are on the volume) and, on the coordinator, "published" (`.metadata` is in
        place): a test's way to kill a rank at a chosen point of a save.
    overwrite: refuse (False, the default) or replace a complete checkpoint at `path`; the
        folder reads as incomplete from the start of the new save until it is published, so
        a save that dies leaves no mix of the old and the new.
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

    def _own_metadata(self) -> str:
        return os.fspath(self._get_metadata_path(
            None if self.use_collectives or self.rank is None else self.rank))

    def prepare_global_plan(self, plans):
        """On the coordinator, before any rank writes: the folder becomes an incomplete
        checkpoint of sgpu's (an earlier save's `.metadata` and sums go), so that a save
        that dies from here on leaves nothing that reads as complete."""
        folder = os.fspath(self.path)
        _write_json(os.path.join(folder, MARKER),
                    {"format": _MARKER_FORMAT, "save": self.save_id, "state": "writing"})
        _remove(self._own_metadata())
        for entry in os.scandir(folder):
            if entry.name.startswith(_SUMS_PREFIX):
                _remove(entry.path)
        _sync_folder(folder)
        return super().prepare_global_plan(plans)

    def write_data(self, plan, planner) -> Future:
        volume = os.fspath(self.path)
        stage = self._stage or _default_stage("save")
        os.makedirs(stage, exist_ok=True)
        # Local disk first, unsynced: only the copy on the volume must be durable.
        self.path, synced, self.sync_files = self.fs.init_path(stage), self.sync_files, False
        try:
            results = super().write_data(plan, planner).wait()
        finally:
            self.path, self.sync_files = self.fs.init_path(volume), synced
        self._on_write_point("staged")
        names = sorted({result.storage_data.relative_path for result in results})
        sums = os.path.join(volume, f"{_SUMS_PREFIX}{plan.storage_data.prefix}json")
        try:
            found = {name: _sum(os.path.join(stage, name)) for name in names}
            for name in names:
                _volume.copy(os.path.join(stage, name), os.path.join(volume, name),
                             to_volume=True, move=self._stage is None)
            _write_json(sums, found)
            _sync_folder(volume)
        except BaseException:
            # Nothing of a failed save stays under a shard's name (a full volume stays full).
            for name in names + [os.path.basename(sums)]:
                _remove(os.path.join(volume, name))
            raise
        finally:
            if self._stage is None:
                shutil.rmtree(stage, ignore_errors=True)
        self._on_write_point("copied")
        done: Future = Future()
        done.set_result(results)
        return done

    def finish(self, metadata, results) -> None:
        folder = os.fspath(self.path)
        files: dict = {}
        for entry in os.scandir(folder):
            if entry.name.startswith(_SUMS_PREFIX) and not entry.name.endswith(".tmp"):
                with open(entry.path) as file:
                    files.update(json.load(file))
        written = {result.storage_data.relative_path for rank in results for result in rank}
        if missing := sorted(written - files.keys()):
            raise RuntimeError(f"sgpu: checkpoint {folder}: no sums for {', '.join(missing)}; "
                               "a rank's part of the save did not land whole")
        _write_json(os.path.join(folder, MARKER),
                    {"format": _MARKER_FORMAT, "save": self.save_id, "state": "complete",
                     "files": {name: files[name] for name in sorted(written)}})
        super().finish(metadata, results)  # .metadata.tmp, fsync'd, renamed into place
        for entry in os.scandir(folder):
            if entry.name.startswith(_SUMS_PREFIX):
                _remove(entry.path)
        _sync_folder(folder)
        self._on_write_point("published")
        if self._keep_last is not None:
            prune(os.path.dirname(os.path.abspath(folder)), keep=self._keep_last)


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
        self._sums = (_marker(os.fspath(path)) or {}).get("files") or {}

    def _check(self, name: str, path: str) -> None:
        """The shard `name`, read at `path`, is what the save wrote (where sgpu wrote it)."""
        want = self._sums.get(name)
        if want is None:
            return
        got = _sum(path)
        if got != want:
            raise RuntimeError(
                f"sgpu: checkpoint {os.fspath(self.path)}: {name} is damaged (size "
                f"{got['size']}, CRC-32 {got['crc32']:08x}; the save wrote size {want['size']}, "
                f"CRC-32 {want['crc32']:08x}): the file changed after it was saved. Load an "
                "older checkpoint, or save again")

    def read_data(self, plan, planner) -> Future:
        volume = os.fspath(self.path)
        stage = self._stage or _default_stage("load")
        os.makedirs(stage, exist_ok=True)
        simulated = _volume.simulated()
        names = sorted({self.storage_data[item.storage_index].relative_path
                        for item in plan.items})
        if self._stage is None and _volume.same_filesystem(volume, stage) and \
                (simulated is None or not simulated.covers(volume)):
            os.rmdir(stage)  # the volume is local disk: read in place
            for name in names:
                self._check(name, os.path.join(volume, name))
            return super().read_data(plan, planner)
        for name in names:
            _volume.copy(os.path.join(volume, name), os.path.join(stage, name), to_volume=False)
            self._check(name, os.path.join(stage, name))
        self.path = self.fs.init_path(stage)
        try:
            return super().read_data(plan, planner)
        finally:
            self.path = self.fs.init_path(volume)
            if self._stage is None:
                shutil.rmtree(stage, ignore_errors=True)


def complete(path: str | os.PathLike) -> bool:
    """Whether `path` holds a complete checkpoint (its `.metadata`)."""
    return os.path.isfile(os.path.join(os.fspath(path), METADATA))


def _checkpoints(root: str) -> list[tuple[float, str, bool, bool]]:
    """(published time, path, complete, sgpu's) of every folder under `root`, oldest first;
    an incomplete one is timed by its folder. sgpu's: it holds sgpu's marker."""
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
        ours = _marker(entry.path) is not None
        if published is not None and _volume.listed(metadata, published):
            found.append((published, entry.path, True, ours))
        else:  # not there, or not listed yet (a simulated volume's lag)
            found.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.path, False, ours))
    return sorted(found)


def latest(root: str | os.PathLike) -> str | None:
    """The newest complete checkpoint among the folders of `root` (the one whose `.metadata`
    was published last; by name when two were published at once), or None."""
    done = [(published, path) for published, path, whole, _ in _checkpoints(os.fspath(root))
            if whole]
    return max(done)[1] if done else None


def prune(root: str | os.PathLike, keep: int) -> list[str]:
    """Removes all but the `keep` newest complete checkpoints that sgpu wrote under `root`,
    and every incomplete one of sgpu's older than the newest complete one (a save that
    died); returns what it removed. A save still being written (incomplete, newer than
    every complete one) stays, and so does every folder sgpu did not write as a checkpoint
    (logs, exports, torch's own checkpoints: NOTE [sgpu's checkpoint marker])."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be a whole number of checkpoints, 1 or more; got {keep!r}")
    found = [entry[:3] for entry in _checkpoints(os.fspath(root)) if entry[3]]
    whole = [entry for entry in found if entry[2]]
    if not whole:
        return []
    newest = whole[-1][0]
    doomed = [path for _, path, _ in whole[:-keep]]
    doomed += [path for when, path, done in found if not done and when < newest]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return sorted(doomed)
