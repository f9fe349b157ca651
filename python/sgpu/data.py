"""Files from a volume for the ranks of a call, as a torch IterableDataset of local paths.

    from sgpu.data import DataLoader, VolumeDataset

    dataset = VolumeDataset("/Volumes/main/train", glob="*.pt")
    loader = DataLoader(dataset, batch_size=8)            # num_workers=6, as the seed's
    for epoch in range(epochs):
        for paths in loader:                                # each: local cached copies
            ...
        checkpoint["data"] = loader.state_dict()            # resumes with the next batch

The files are listed once, sorted. In a rank (torch.distributed initialised) of `world`
ranks whose loader has W workers, worker w of rank r takes `files[r*W + w :: world*W]`,
as the seed's UCVolumeDataset does: no shuffle, no padding, each file once per epoch across
all ranks and workers. Each file is copied into a local cache folder before it is yielded
(again only when its size or modification time changed), unless the volume is local disk.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
import os
import tempfile
import time
from typing import Iterator

import torch
import torch.utils.data

import _sgpu_rank_env as _rank_env

from sgpu import _volume

__all__ = ["DataLoader", "VolumeDataset", "partition"]


def partition(files: list, rank: int, world: int, worker: int, workers: int) -> list:
    """The files worker `worker` of `workers` on rank `rank` of `world` reads: every
    (world * workers)-th from rank * workers + worker."""
    return files[rank * workers + worker::world * workers]


def _place() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _list(root: str, glob: str | None) -> list:
    """(relative path, size, modification time in ns) of the files under `root` matching
    `glob` that the volume lists, sorted by path."""
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if glob is not None and not fnmatch.fnmatch(name, glob):
                continue
            facts = os.stat(path)
            if _volume.listed(path, facts.st_mtime_ns):
                found.append((os.path.relpath(path, root), facts.st_size, facts.st_mtime_ns))
    return sorted(found)


def _fingerprint(listing: list) -> str:
    """SHA-256 of a listing's relative paths, sizes and modification times, in order: what
    a loader state was taken over (DataLoader.state_dict)."""
    digest = hashlib.sha256()
    for name, size, mtime_ns in listing:
        digest.update(os.fsencode(name) + b"\0" + f"{size} {mtime_ns}\n".encode())
    return digest.hexdigest()


class VolumeDataset(torch.utils.data.IterableDataset):
    """The files under `path` (those matching `glob`, when given, by name; recursively),
    as paths of local cached copies (`cache_dir`: default, a folder of the rank's own; a
    folder on that folder's own filesystem is read in place unless `cache_dir` is named or
    a simulated volume covers it). Made in a rank
    (torch.distributed initialised), it takes rank 0's listing, so that every rank splits
    the same list (a collective: every rank makes it)."""

    def __init__(self, path: str | os.PathLike, *, glob: str | None = None,
                 cache_dir: str | os.PathLike | None = None) -> None:
        super().__init__()
        self.root = os.fspath(path)
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"{self.root} is not a folder: VolumeDataset reads the files "
                                    "of a volume's folder")
        listing = _list(self.root, glob)
        if _place()[1] > 1:
            # One listing for every rank (rank 0's): a volume that lists a new file late
            # would otherwise give ranks different lists, and files would be read twice or
            # never.
            import torch.distributed as dist

            shared = [listing]
            dist.broadcast_object_list(shared, src=0)
            listing = shared[0]
        self.files = [name for name, _, _ in listing]
        self._mtimes = [mtime_ns for _, _, mtime_ns in listing]
        self.listing = _fingerprint(listing)  # the files, their sizes and times, as listed
        self.newest_mtime_ns = max(self._mtimes, default=0)
        self._cache = os.fspath(cache_dir) if cache_dir is not None else None
        self._cache_named = True if cache_dir is not None else None  # None: not decided yet
        self._skip: dict[int, int] = {}  # worker -> items to skip once (a resumed epoch)
        self._offset = 0                 # and the worker the loader's turns start at
        self.fetch_seconds = 0.0         # this process's time copying from the volume

    def __len__(self) -> int:
        return len(self.files)

    def cache_dir(self) -> str:
        if self._cache is None:
            base = os.environ.get(_rank_env.RANK_DIR) or tempfile.gettempdir()
            self._cache = os.path.join(base, f"sgpu-data-cache-{os.getpid()}")
        return self._cache

    def part(self, rank: int, world: int, worker: int, workers: int) -> list:
        return partition(self.files, rank, world, worker, workers)

    def written_after(self, mtime_ns: int) -> list:
        """The files of the listing modified after `mtime_ns` (by the volume's clock)."""
        return [name for name, when in zip(self.files, self._mtimes) if when > mtime_ns]

    def _caches(self) -> bool:
        """Whether files are copied into the cache: when it was named, when the volume is
        another filesystem than the cache's (a network mount), or a simulated volume. A
        folder on the cache's own disk is read in place."""
        if self._cache_named is None:
            base = os.environ.get(_rank_env.RANK_DIR) or tempfile.gettempdir()
            simulated = _volume.simulated()
            self._cache_named = (not _volume.same_filesystem(self.root, base)
                                 or (simulated is not None and simulated.covers(self.root)))
        return self._cache_named

    def _fetch(self, name: str) -> str:
        source = os.path.join(self.root, name)
        if not self._caches():
            return source
        target = os.path.join(self.cache_dir(), name)
        facts = os.stat(source)
        try:
            cached = os.stat(target)
            if cached.st_size == facts.st_size and cached.st_mtime_ns == facts.st_mtime_ns:
                return target
        except FileNotFoundError:
            pass
        start = time.perf_counter()
        os.makedirs(os.path.dirname(target), exist_ok=True)
        partial = f"{target}.part-{os.getpid()}"
        _volume.copy(source, partial, to_volume=False)
        if os.stat(partial).st_size != facts.st_size:
            os.unlink(partial)
            raise OSError(f"{source} changed size while it was copied into the cache "
                          f"({facts.st_size} bytes when listed)")
        os.utime(partial, ns=(facts.st_atime_ns, facts.st_mtime_ns))
        os.replace(partial, target)
        self.fetch_seconds += time.perf_counter() - start
        return target

    def __iter__(self) -> Iterator[str]:
        # Not a generator itself: the place and the skip are taken when iteration starts.
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rank, world = _place()
        # A resumed epoch: loader worker `worker` reads what worker (worker + offset) read, so
        # that the loader's turn order (from worker 0) continues where it stopped.
        source = (worker + self._offset) % workers
        mine = self.part(rank, world, source, workers)
        skip = self._skip.get(source, 0)
        self._skip, self._offset = {}, 0  # once: this copy's next epoch starts afresh
        return (self._fetch(name) for name in mine[skip:])



class DataLoader(torch.utils.data.DataLoader):
    """torch's DataLoader over a VolumeDataset with the seed's defaults (num_workers=6,
    prefetch_factor=4, persistent workers), that

    - checks, when the iteration starts in a rank, that every rank uses the same number of
      workers (otherwise files would be read twice or never), naming the ranks that differ;
    - logs `fetch_seconds` (the time the training loop waited for batches in the epoch) to
      the call's run at each epoch's end, step = the epoch;
    - resumes: state_dict() says how many batches of the epoch were taken;
      load_state_dict() makes the next iteration continue with the next one. The state
      carries a fingerprint of the folder's listing (`listing`: each file's relative path,
      size and modification time, so a file rewritten or touched counts as changed, one
      rewritten within the same clock tick with its size kept does not); a state taken
      mid-epoch is refused over a folder that no longer matches it (files are skipped by
      their place in the list). A state taken between epochs loads over any folder, and
      a state saved before states carried the fingerprint loads with only its file count
      checked.
    """

    def __init__(self, dataset: VolumeDataset, batch_size: int | None = 1, *,
                 num_workers: int = 6, prefetch_factor: int | None = 4,
                 persistent_workers: bool | None = None, **kwargs) -> None:
        if not isinstance(dataset, VolumeDataset):
            raise TypeError("sgpu.data.DataLoader takes a VolumeDataset; for other datasets use "
                            "torch.utils.data.DataLoader")
        if kwargs.get("drop_last"):
            raise ValueError("drop_last=True would drop each worker's last short batch, so files "
                             "would be missed; batches of fewer files are yielded instead")
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        super().__init__(dataset, batch_size=batch_size, num_workers=num_workers,
                         prefetch_factor=prefetch_factor if num_workers > 0 else None,
                         persistent_workers=persistent_workers, **kwargs)
        self.epoch = 0
        self._taken = 0  # batches taken in this epoch
        self._resuming = False

    def _check_workers(self, rank: int, world: int) -> None:
        if world == 1:
            return
        import torch.distributed as dist

        counts: list = [None] * world
        dist.all_gather_object(counts, self.num_workers)
        if len(set(counts)) > 1:
            by_count: dict = {}
            for who, count in enumerate(counts):
                by_count.setdefault(count, []).append(who)
            said = "; ".join(f"rank{'s' if len(who) > 1 else ''} {','.join(map(str, who))}: "
                             f"num_workers={count}" for count, who in sorted(by_count.items()))
            raise ValueError(f"the ranks' DataLoaders have different numbers of workers ({said}): "
                             "files are split by rank and worker, so some would be read twice "
                             "and others never; give every rank the same num_workers")

    def _delivered(self, rank: int, world: int, batches: int) -> tuple[dict, int]:
        """How many files each worker had yielded once `batches` batches were taken, and
        whose turn was next: the loader takes a batch from each worker in turn, from worker
        0, skipping those that are done."""
        workers = max(self.num_workers, 1)
        size = self.batch_size or 1
        counts = [len(self.dataset.part(rank, world, w, workers)) for w in range(workers)]
        left = [math.ceil(n / size) for n in counts]
        taken = [0] * workers
        turn = 0
        while batches > 0 and any(taken[w] < left[w] for w in range(workers)):
            if taken[turn] < left[turn]:
                taken[turn] += 1
                batches -= 1
            turn = (turn + 1) % workers
        files = {w: min(taken[w] * size, counts[w]) for w in range(workers) if taken[w]}
        return files, turn

    def __iter__(self):
        rank, world = _place()
        self._check_workers(rank, world)
        if not self._resuming:
            self._taken = 0
            self.dataset._skip, self.dataset._offset = {}, 0
        iterator = super().__iter__()   # workers start (and copy the dataset) here
        self.dataset._skip, self.dataset._offset = {}, 0  # later epochs start afresh
        self._resuming = False
        waited = 0.0
        while True:
            start = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                break
            waited += time.perf_counter() - start
            self._taken += 1
            yield batch
        import sgpu

        sgpu.log_metric("fetch_seconds", waited, step=self.epoch)
        self.epoch += 1
        self._taken = 0

    def state_dict(self) -> dict:
        rank, world = _place()
        return {"epoch": self.epoch, "batches": self._taken, "num_workers": self.num_workers,
                "batch_size": self.batch_size, "rank": rank, "world_size": world,
                "files": len(self.dataset), "listing": self.dataset.listing,
                "newest_mtime_ns": self.dataset.newest_mtime_ns}

    def _folder_changes(self, state: dict) -> str | None:
        """How the dataset's folder differs from the one `state` was taken over, or None
        where it matches (as far as the state can tell: an older one has only a count)."""
        then, now = state.get("files"), len(self.dataset)
        if then == now and state.get("listing", self.dataset.listing) == self.dataset.listing:
            return None
        said = (f"{then} files then, {now} now" if then != now else
                f"{now} files then and now, but a name, size or modification time differs")
        if "newest_mtime_ns" in state:
            newer = self.dataset.written_after(int(state["newest_mtime_ns"]))
            if newer:
                more = f" and {len(newer) - 5} more" if len(newer) > 5 else ""
                said += f"; written since: {', '.join(newer[:5])}{more}"
        return said

    def load_state_dict(self, state: dict) -> None:
        rank, world = _place()
        mine = {"num_workers": self.num_workers, "batch_size": self.batch_size, "rank": rank,
                "world_size": world}
        differs = {key: (state.get(key), value) for key, value in mine.items()
                   if state.get(key) != value}
        if differs:
            said = ", ".join(f"{key} {was} then, {now} now" for key, (was, now) in differs.items())
            raise ValueError(f"this loader state cannot resume here ({said}): the files each "
                             "worker reads would differ")
        # Mid-epoch, each worker skips what it had read by its place in the list; between
        # epochs nothing is skipped and the next epoch reads the folder as it is.
        changed = self._folder_changes(state) if int(state["batches"]) > 0 else None
        if changed:
            raise ValueError(
                f"{self.dataset.root} no longer holds the files this loader state was taken "
                f"over ({changed}): resuming epoch {state['epoch']} after batch "
                f"{state['batches']} skips what was read by its place in that listing, so the "
                "rest of the epoch would not be the rest of the saved one (files read twice, "
                "never, or with other contents). Restore the folder as it was, or start the "
                "epoch over from its first batch with load_state_dict(dict(state, batches=0))")
        if getattr(self, "_iterator", None) is not None:  # persistent workers: start anew
            self._iterator._shutdown_workers()
            self._iterator = None
        self.epoch = int(state["epoch"])
        self._taken = int(state["batches"])
        self.dataset._skip, self.dataset._offset = self._delivered(rank, world, self._taken)
        self._resuming = True
