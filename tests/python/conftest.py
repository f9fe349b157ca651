"""Every test gets its own runs folder and MLflow store, so that nothing is written into
the user's (./mlruns, $TMPDIR/sgpu-<uid>), and calls run on the simulated backend."""

import os
import pathlib
import time

import pytest


@pytest.fixture(autouse=True)
def sgpu_sandbox(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch):
    runs = tmp_path / "runs"
    store = tmp_path / "mlruns"
    monkeypatch.setenv("SGPU_RUNS_DIR", str(runs))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.as_uri())
    monkeypatch.setenv("SGPU_BACKEND", "sim")
    # The reader here is MLflow's own client, which opens a file store only with this (the
    # ranks get it from sgpu).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    for name in ("SGPU_SIM", "SGPU_SIM_FAULTS", "SGPU_TRACKING", "MLFLOW_RUN_ID",
                 "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID"):
        monkeypatch.delenv(name, raising=False)
    yield tmp_path


def processes_with_marker(marker: str) -> list[int]:
    """The pids of live processes whose environment, as the kernel shows it, holds `marker`:
    a variable set before the caller started, which its ranks, its fork server and what
    they start inherit. (A variable the caller sets later is not seen in ranks forked by
    the fork server: /proc shows the environment a process was exec'd with.)"""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and marker.encode() in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def _stat(pid: int):
    """(state, ppid, pgrp) of a live process, None when it is gone."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1]), int(fields[2])


def alive(pids) -> list[int]:
    """Those of `pids` that still run (zombies are gone), and every live process in their
    process groups (what a rank started stays in its rank's group)."""
    groups = set(pids)
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(int(entry.name))
        if stat is None or stat[0] == "Z":
            continue
        if int(entry.name) in groups or stat[2] in groups:
            found.append(int(entry.name))
    return found


def is_fork_server(pid: int) -> bool:
    """True for a Python fork server (it lives as long as its caller, by design)."""
    try:
        return b"sgpu._fork_server" in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def wait_until(predicate, limit: float = 30.0) -> bool:
    """Polls `predicate` until it holds or `limit` seconds pass; returns its last value."""
    deadline = time.monotonic() + limit
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()
