"""PyTorch's own distributed suite (torch/testing/_internal/distributed/distributed_test.py,
the tests upstream runs for gloo, nccl and ucc) against the backend named in BACKEND: the
module test_torch_suite.py runs it under pytest, once a backend and transport.

    BACKEND=sgpu|gloo WORLD_SIZE=2 TEMP_DIR=<a folder holding a file named barrier>
    [SGPU_SIM_TRANSPORT=shm|gloo] python -m pytest runner.py::<class>::<test> ...
    sgpu sim -- env BACKEND=nccl WORLD_SIZE=2 TEMP_DIR=... python -m pytest runner.py

With BACKEND=nccl under `sgpu sim`, the suite runs as upstream runs it on a GPU node: its
ranks see the simulated node's GPUs and form "nccl" groups on the simulated transport.

For "sgpu", the suite sees what a rank of an sgpu launch sees: the simulated backend, the
collective recorder with a rank folder each, and "sgpu" wherever the suite admits "gloo"
(its feature tables, and a copy of the module whose name gates `BACKEND == "gloo"`,
`require_backend_is_available({"gloo"})` and the object collectives' GPU-backend gate also
admit "sgpu"). Ranks are forked from this
process, which has imported torch and the suite once, where upstream spawns each afresh."""

import os
import re
import sys

import torch
import torch.distributed as dist

import sgpu  # noqa: F401 - registers the "sgpu" backend, inherited by the forked ranks

BACKEND = os.environ["BACKEND"]
TEMP_DIR = os.environ["TEMP_DIR"]
GLOO_NAMES = {"gloo", BACKEND}

from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if BACKEND == "sgpu":
    os.environ.setdefault("SGPU_RANK_BACKEND", "sim")
    os.environ.setdefault("SGPU_RECORDER_ENTRIES", "2000")  # an sgpu launch's default
    # Read by the suite's decorators when its module is imported: sgpu wherever gloo is,
    # but for the GPU rows (a simulated rank's process group holds CPU tensors here).
    for feature, backends in DistTestCases.backend_feature.items():
        if "gloo" in backends and feature not in ("gpu", "cuda", "hpu", "xpu"):
            backends.add(BACKEND)
    DistTestCases.backend_feature["plugin"].add(BACKEND)
    for backends in DistTestCases.skip_collective.values():
        if "gloo" in backends:
            backends.add(BACKEND)


def suite_module():
    """distributed_test.py, or for sgpu a copy of it whose gloo-only name gates admit sgpu.
    gloo and nccl (under `sgpu sim`, on simulated GPUs) take the suite as upstream runs it."""
    from torch.testing._internal.distributed import distributed_test

    if BACKEND in ("gloo", "nccl"):
        return distributed_test
    with open(distributed_test.__file__) as f:
        source = f.read()
    for pattern, replacement in [
        (r'BACKEND != "gloo"', "BACKEND not in _GLOO_NAMES"),
        (r'BACKEND == "gloo"', "BACKEND in _GLOO_NAMES"),
        (r'require_backend_is_available\(\{"gloo"\}\)', "require_backend_is_available(_GLOO_NAMES)"),
        # The object collectives' gate: backends with GPUs, gloo among them.
        (r'require_backend_is_available\(DistTestCases\.backend_feature\["gpu"\]\)',
         'require_backend_is_available(DistTestCases.backend_feature["gpu"] | _GLOO_NAMES)'),
    ]:
        source, count = re.subn(pattern, replacement, source)
        assert count > 0, f"torch's suite no longer has {pattern}: revisit runner.py"
    source = source.replace('BACKEND = os.environ["BACKEND"]',
                            f'BACKEND = os.environ["BACKEND"]\n_GLOO_NAMES = set({sorted(GLOO_NAMES)!r})', 1)
    folder = os.path.join(TEMP_DIR, "suite-module")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "distributed_test_sgpu.py"), "w") as f:
        f.write(source)
    sys.path.insert(0, folder)
    import distributed_test_sgpu

    return distributed_test_sgpu


_suite = suite_module()


class TestSuite(_suite.TestDistBackend, _suite.DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._start_processes(torch.multiprocessing.get_context("fork").Process)

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe, **kwargs):
        if BACKEND == "sgpu":  # each rank its own folder for the recorder's ring
            rank_dir = os.path.join(TEMP_DIR, f"rank-{rank}")
            os.makedirs(rank_dir, exist_ok=True)
            os.environ["SGPU_RANK_DIR"] = rank_dir
        super()._run(rank, test_name, file_name, pipe, **kwargs)


assert dist.is_available()
