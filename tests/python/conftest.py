"""Every test gets its own runs folder and MLflow store, so that nothing is written into
the user's (./mlruns, $TMPDIR/sgpu-<uid>), and calls run on the simulated backend."""

import pathlib
import subprocess

import pytest

from process_table import alive, is_fork_server, processes_with_marker, wait_until  # noqa: F401


def pytest_configure(config):
    """These tests are of this checkout's package: refuse another checkout's (the one the
    venv's sgpu-build.pth names, when ci/build ran last elsewhere), loudly."""
    import sgpu

    checkout = pathlib.Path(__file__).resolve().parents[2]
    built = checkout / "build" / "python"
    found = pathlib.Path(sgpu.__file__).resolve().parent.parent
    if built.is_dir() and found != built and (found / ".." / ".." / ".git").exists():
        pytest.exit(f"sgpu is imported from {found}, another checkout's build, not this one's "
                    f"({built}); run with PYTHONPATH={built}, as ctest does", returncode=2)


def distributed_error(raised: BaseException):
    """The sgpu.DistributedError behind what a call raised: itself, or the cause of a rank's
    own exception raised as itself."""
    import sgpu

    return raised if isinstance(raised, sgpu.DistributedError) else raised.__cause__


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


@pytest.fixture
def small_filesystem(tmp_path: pathlib.Path):
    """small_filesystem(size): a folder on a tmpfs of `size` ("2m"), mounted for the test
    and removed after it; the test is skipped where mounting needs root and this is not."""
    mounts = []

    def mount(size: str) -> pathlib.Path:
        folder = tmp_path / f"small-{len(mounts)}"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "sgpu-test", str(folder)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here (as root it can): {done.stderr.strip()}")
        mounts.append(folder)
        return folder

    yield mount
    for folder in mounts:
        subprocess.run(["umount", str(folder)], check=False)
