"""Volume I/O for sgpu.data and sgpu.checkpoint: copies to and from a volume, retried with
backoff when they fail transiently, and, on sim, a simulated network volume.

SGPU_SIM_VOLUME (in the caller's environment, which the ranks inherit) gives the volume I/O
of sgpu.data and sgpu.checkpoint a network volume's behaviour, as `key=value` pairs joined
by `;`:

    path=/vol          only files under this folder (default: every volume file)
    latency=5ms        before each file's copy
    bandwidth=200MB/s  a copy takes at least its size over this (B, KB, MB, GB, KiB, MiB, GiB)
    list_lag=2s        a file is listed only this long after it was last written
    fail_every=N       every N-th copy to the volume in a process fails once, transiently
    fail_rate=0.1      each copy fails transiently with this probability (seeded by `seed`
    seed=7             and the rank)
    capacity=64MiB     a copy that would take `path` past this fails: the volume is full

A transient failure is retried (at most 5 tries, 50 ms doubling to 1 s apart), each retry
said on stderr; a full volume is not. On the cuda backend the variable is refused: a real
volume behaves as it does.
"""

from __future__ import annotations

import errno
import os
import random
import re
import shutil
import sys
import time

import _sgpu_rank_env as _rank_env

VARIABLE = "SGPU_SIM_VOLUME"
TRIES = 5
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20,
          "gib": 2**30}
_PERMANENT = {errno.ENOSPC, errno.ENOENT, errno.EACCES, errno.EPERM, errno.EROFS,
              errno.EISDIR, errno.ENOTDIR, errno.EDQUOT, errno.ENAMETOOLONG}

retries = 0  # this process's retried copies, for the caller to report


class SimulatedVolume:
    def __init__(self, text: str):
        self.text = text
        self.path: str | None = None
        self.latency = 0.0
        self.bandwidth: float | None = None
        self.list_lag = 0.0
        self.fail_every = 0
        self.fail_rate = 0.0
        self.capacity: int | None = None
        seed = 0
        for part in filter(None, (p.strip() for p in text.split(";"))):
            key, _, value = part.partition("=")
            key, value = key.strip(), value.strip()
            try:
                if key == "path":
                    self.path = os.path.abspath(value)
                elif key == "latency":
                    self.latency = _seconds(value)
                elif key == "list_lag":
                    self.list_lag = _seconds(value)
                elif key == "bandwidth":
                    self.bandwidth = float(_bytes(value.lower().removesuffix("/s")))
                elif key == "fail_every":
                    self.fail_every = int(value)
                    if self.fail_every < 1:
                        raise ValueError
                elif key == "fail_rate":
                    self.fail_rate = float(value)
                    if not 0 <= self.fail_rate < 1:
                        raise ValueError
                elif key == "capacity":
                    self.capacity = _bytes(value.lower())
                elif key == "seed":
                    seed = int(value)
                else:
                    raise KeyError(key)
            except KeyError:
                raise ValueError(f"{VARIABLE}: unknown setting {key!r} in {text!r}; the settings "
                                 "are path, latency, bandwidth, list_lag, fail_every, fail_rate, "
                                 "seed, capacity") from None
            except ValueError:
                raise ValueError(f"{VARIABLE}: {key}={value!r} is not a valid value (in {text!r}): "
                                 "durations as 5ms or 2s, sizes as 64MiB, bandwidth as 200MB/s, "
                                 "fail_every a whole number >= 1, fail_rate in [0, 1)") from None
        if self.capacity is not None and self.path is None:
            raise ValueError(f"{VARIABLE}: capacity needs path= (the folder it is the size of), "
                             f"in {text!r}")
        rank = int(os.environ.get("RANK", "0") or 0)
        self._random = random.Random(seed * 1000003 + rank)
        self._writes = 0

    def covers(self, path: str) -> bool:
        if self.path is None:
            return True
        full = os.path.abspath(path)
        return full == self.path or full.startswith(self.path + os.sep)

    def before_copy(self, size: int, to_volume: bool, target: str) -> float:
        """Waits the latency, fails as the settings say; returns how long the copy must
        take at least (its size over the bandwidth)."""
        if to_volume:
            self._writes += 1
            if self.capacity is not None:
                used = _folder_bytes(self.path)
                if used + size > self.capacity:
                    raise OSError(errno.ENOSPC, f"simulated volume: full ({used} of "
                                  f"{self.capacity} bytes used, {size} more asked)", target)
            if (self.fail_every and self._writes % self.fail_every == 0) or \
                    (self.fail_rate and self._random.random() < self.fail_rate):
                time.sleep(self.latency)
                raise OSError(errno.EIO, f"simulated volume: transient failure (write "
                              f"#{self._writes} of this process)", target)
        if self.latency:
            time.sleep(self.latency)
        return size / self.bandwidth if self.bandwidth else 0.0


def _seconds(text: str) -> float:
    found = re.fullmatch(r"([0-9.]+)\s*(ms|s)", text)
    if not found:
        raise ValueError
    return float(found.group(1)) / (1000 if found.group(2) == "ms" else 1)


def _bytes(text: str) -> int:
    found = re.fullmatch(r"([0-9.]+)\s*([a-z]*)", text)
    if not found or found.group(2) not in _UNITS:
        raise ValueError
    return int(float(found.group(1)) * _UNITS[found.group(2)])


def _folder_bytes(path: str) -> int:
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                total += os.stat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                pass
    return total


_simulated: tuple[str, SimulatedVolume | None] | None = None


def simulated() -> SimulatedVolume | None:
    """The simulated volume SGPU_SIM_VOLUME describes, or None."""
    global _simulated
    from sgpu import _native

    text = _native.setting_text(VARIABLE)
    if _simulated is None or _simulated[0] != text:
        if text and os.environ.get(_rank_env.RANK_BACKEND) == _rank_env.CUDA_BACKEND:
            from sgpu.errors import ConfigError

            raise ConfigError(f"{VARIABLE} simulates a network volume on the sim backend; this "
                              "rank runs on cuda, where the volume is real: unset it")
        _simulated = (text, SimulatedVolume(text) if text else None)
    return _simulated[1]


def _fsync(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def same_filesystem(path: str, folder: str) -> bool:
    """Whether `path` and `folder` (or, while it does not exist, its nearest existing
    parent) are on one filesystem."""
    folder = os.path.abspath(folder)
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    return os.stat(path).st_dev == os.stat(folder).st_dev


def _copy_once(source: str, target: str, to_volume: bool, move: bool) -> None:
    volume = simulated()
    at_least = 0.0
    if volume is not None and volume.covers(target if to_volume else source):
        at_least = volume.before_copy(os.stat(source).st_size, to_volume, target)
    start = time.perf_counter()
    if move and same_filesystem(source, os.path.dirname(os.path.abspath(target))):
        if to_volume:
            _fsync(source)
        os.replace(source, target)  # the volume is local disk: nothing to copy
    else:
        shutil.copyfile(source, target)  # the kernel copies (sendfile)
        if to_volume:  # on the volume's storage before the save goes on; a local copy need not
            _fsync(target)
    if at_least:  # the simulated bandwidth
        time.sleep(max(0.0, at_least - (time.perf_counter() - start)))


def copy(source: str, target: str, *, to_volume: bool, move: bool = False) -> None:
    """`source` to `target` (fsync'd when it is on the volume); with `move`, a source the
    caller no longer needs is renamed when both are on one filesystem. A transient failure
    is retried (TRIES in all, said on stderr); the last failure, or a permanent one, raises
    OSError naming the file."""
    global retries
    delay = 0.05
    what = f"{'writing' if to_volume else 'reading'} {target if to_volume else source}"
    for attempt in range(1, TRIES + 1):
        try:
            _copy_once(source, target, to_volume, move)
            return
        except OSError as error:
            if error.errno in _PERMANENT or attempt == TRIES:
                tries = "" if error.errno in _PERMANENT else f" {attempt} times"
                raise OSError(error.errno, f"sgpu: volume: {what} failed{tries}: "
                              f"{error.strerror or error}") from error
            retries += 1
            print(f"sgpu: volume: {what} failed ({error.strerror or error}); try "
                  f"{attempt + 1} of {TRIES} in {delay:g} s", file=sys.stderr, flush=True)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def listed(path: str, mtime_ns: int) -> bool:
    """Whether a volume listing shows a file last written at `mtime_ns` yet."""
    volume = simulated()
    if volume is None or not volume.list_lag or not volume.covers(path):
        return True
    return time.time_ns() - mtime_ns >= volume.list_lag * 1e9
