"""The "sgpu" backend against PyTorch's own distributed suite (torch_suite/runner.py), on both
simulated transports, beside gloo on the same tests in the same run: every test gloo passes,
sgpu passes, but for the differences docs/simulation.md lists ("sgpu" against torch's suite), which
are asserted to stay as they are, so that the list stays true. And the suite as upstream runs it
for NCCL, BACKEND=nccl under `sgpu sim`: a fixed selection of what passes there (the whole
suite's counts are docs/simulation.md's, "nccl" against torch's suite).

The selection takes each collective and object collective once, every reduction and the
dtypes the suite's helpers loop over, rather than the suite's 106 CPU tests: a test costs
about a second at 2 ranks here."""

import os
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import pytest

from sgpu_cli import SGPU, needs_cli

RUNNER = pathlib.Path(__file__).parent / "torch_suite" / "runner.py"

SELECTION = [
    "test_broadcast",
    "test_reduce_sum",
    "test_all_reduce_sum",
    "test_all_reduce_max",
    "test_all_reduce_min",
    "test_all_reduce_product",
    "test_all_reduce_sum_complex",
    "test_all_reduce_sum_async",
    "test_all_reduce_full_group_sum",
    "test_all_reduce_coalesced_sum",
    "test_all_gather",
    "test_all_gather_coalesced_simple",
    "test_all_gather_coalesced_with_empty",
    "test_gather",
    "test_scatter",
    "test_barrier",
    "test_send_recv",
    "test_send_recv_with_tag",
    "test_send_recv_any_source",
    "test_isend",
    "test_irecv",
    "test_batch_isend_irecv_gloo",
    "test_sparse_all_reduce_sum",
    "test_all_gather_object_default_pg",
    "test_scatter_object_list",
    "test_monitored_barrier_gloo",
    "test_ddp_logging_data_cpu",
]

# What gloo passes and sgpu does not, on each transport, and the text that says why;
# docs/simulation.md lists the same.
BOTH = {
    # torch.distributed.monitored_barrier refuses every backend not named "gloo".
    "test_monitored_barrier_gloo": "monitored_barrier is only implemented for GLOO backend",
    # DDP's logger names every third-party backend "custom".
    "test_ddp_logging_data_cpu": "custom",
}
DIFFERENCES = {
    "gloo": BOTH,
    # The shared-memory transport reduces dense tensors only.
    "shm": {**BOTH, "test_sparse_all_reduce_sum": "takes dense tensors; all_reduce got a Sparse one"},
}


def outcomes(tmp_path: pathlib.Path, backend: str, transport: str | None = None) -> dict:
    """Each selected test's outcome ("passed", "failed", "skipped") and failure text."""
    folder = tmp_path / f"{backend}-{transport or 'own'}"
    folder.mkdir()
    (folder / "barrier").touch()
    report = folder / "report.xml"
    env = dict(os.environ, BACKEND=backend, WORLD_SIZE="2", TEMP_DIR=str(folder),
               DISTRIBUTED_TESTS_DEFAULT_TIMEOUT="60")
    env.pop("SGPU_BACKEND", None)
    if transport:
        env["SGPU_SIM_TRANSPORT"] = transport
    tests = [f"{RUNNER}::TestSuite::{name}" for name in SELECTION]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--confcutdir={RUNNER.parent}",
         f"--junitxml={report}", *tests],
        cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    assert report.exists(), f"the suite did not run ({backend}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    found = {}
    for case in ElementTree.parse(report).iter("testcase"):
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if failure is not None:
            found[case.get("name")] = ("failed", (failure.get("message") or "") + (failure.text or ""))
        elif case.find("skipped") is not None:
            found[case.get("name")] = ("skipped", case.find("skipped").get("message") or "")
        else:
            found[case.get("name")] = ("passed", "")
    assert set(found) == set(SELECTION), f"tests missing from the report: {set(SELECTION) - set(found)}"
    return found


@pytest.fixture(scope="module")
def gloo(tmp_path_factory):
    return outcomes(tmp_path_factory.mktemp("suite"), "gloo")


@pytest.mark.parametrize("transport", ["shm", "gloo"])
def test_sgpu_passes_what_gloo_passes_in_torchs_own_suite(transport, gloo, tmp_path):
    sgpu = outcomes(tmp_path, "sgpu", transport)
    passed_by_gloo = {name for name, (outcome, _) in gloo.items() if outcome == "passed"}
    # The selection is of tests gloo runs: a suite that skips them all proves nothing.
    assert len(passed_by_gloo) >= len(SELECTION) - 3, {n: o for n, (o, _) in gloo.items()}
    differences = DIFFERENCES[transport]
    missing = {name: sgpu[name] for name in passed_by_gloo - set(differences)
               if sgpu[name][0] != "passed"}
    assert not missing, "\n\n".join(f"{name}: {outcome}\n{text[-2500:]}"
                                    for name, (outcome, text) in missing.items())
    for name, reason in differences.items():
        assert gloo[name][0] == "passed", f"gloo no longer passes {name}: {gloo[name]}"
        outcome, text = sgpu[name]
        assert outcome == "failed" and reason in text, (
            f"{name} now gives {outcome} on sgpu ({text[-800:]}): update DIFFERENCES and docs/simulation.md")


# What upstream's NCCL suite runs that the simulated node passes, one test a kind: the
# collectives on cuda tensors (each an "nccl:<op>" profiler event), point to point (to the
# rank itself too), object collectives at the DETAIL debug level, SyncBatchNorm's CUDA-only
# kernels, DDP, a device mesh, and a hang told in NCCL's watchdog's words.
NCCL_SELECTION = [
    "test_all_reduce_sum_cuda",
    "test_broadcast_cuda",
    "test_reduce_sum_cuda",
    "test_all_gather_cuda",
    "test_all_to_all_single_equal_split_cuda",
    "test_barrier_cuda",
    "test_send_recv_nccl",
    "test_batch_isend_irecv_self_nccl",
    "test_all_gather_object_default_pg",
    "test_DistributedDataParallel",
    "test_DistributedDataParallel_SyncBatchNorm",
    "test_ddp_device_mesh_initialization",
    "test_monitored_barrier_allreduce_hang",
]


@needs_cli
def test_torchs_nccl_suite_passes_on_the_simulated_node(tmp_path):
    (tmp_path / "barrier").touch()
    report = tmp_path / "report.xml"
    env = dict(os.environ, BACKEND="nccl", WORLD_SIZE="2", TEMP_DIR=str(tmp_path),
               DISTRIBUTED_TESTS_DEFAULT_TIMEOUT="120", SGPU_TRACKING="off")
    env.pop("SGPU_BACKEND", None)  # `sgpu sim` sets it for the session
    tests = [f"{RUNNER}::TestSuite::{name}" for name in NCCL_SELECTION]
    done = subprocess.run(
        [SGPU, "sim", "--", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"--confcutdir={RUNNER.parent}", f"--junitxml={report}", *tests],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert report.exists(), f"the suite did not run:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    outcome = {case.get("name"): [child.tag for child in case] for case in
               ElementTree.parse(report).iter("testcase")}
    assert set(outcome) == set(NCCL_SELECTION), outcome
    not_passed = {name: tags for name, tags in outcome.items()
                  if {"failure", "error", "skipped"} & set(tags)}
    assert not not_passed, f"{not_passed}\n{done.stdout[-6000:]}"
